"""What a change costs, measured by making it: a dataset, a check, an engine kind and an export format, each added
the way the docs say (a dataset: one table in a user catalog; the others: their record in a temporary copy of
the repository, with the rows the docs keep for them), then the tests that concern it run green. Nothing in the
package is edited: the copy is thrown away.

`EAGLE_TEST_CHANGE_TREE` points the copies at another checkout (e.g. an older main) to see what the same change
costs there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

TREE = Path(os.environ.get("EAGLE_TEST_CHANGE_TREE") or Path(__file__).resolve().parents[2])
SKIP = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "eagle-output", ".pytest_cache")
DATASET = """
[datasets.b9_extra]
title = "B9 a dataset added in one catalog table"
hub_id = "someone/extra-chats"
adapter = { messages_field = "messages" }
"""


def copy_of(tmp_path: Path) -> Path:
    copy = tmp_path / "repo"
    shutil.copytree(TREE, copy, ignore=SKIP)
    return copy


def edit(path: Path, after: str, insert: str) -> None:
    """Insert `insert` after the first line holding `after` (the copy's file; fails loudly when not found)."""
    lines = path.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if after in line)
    lines.insert(at + 1, insert)
    path.write_text("".join(lines))


def lane(tree: Path, *tests: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The given test files of `tree` (by file name, in whichever layer folder they are), run with `tree`'s
    package first on the path; an argument that is no test file (`-k ...`) is passed as it is."""
    found = {path.name: str(path.relative_to(tree)) for path in (tree / "eagle_data_tests").rglob("test_*.py")}
    tests = tuple(found.get(name, name) for name in tests)
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE_DATA_")}
    run_env.update(PYTHONPATH=str(tree), **(env or {}))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", *tests]
    return subprocess.run(command, cwd=tree, env=run_env, capture_output=True, text=True, timeout=900)


def green(done: subprocess.CompletedProcess[str]) -> None:
    failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    assert done.returncode == 0, "\n".join(failed) + "\n" + done.stdout[-3000:] + done.stderr[-2000:]


def add_check(copy: Path) -> None:
    """A warning gate of `{ds}_validated`: its declaration, its judge, and its rows in the two check tables."""
    edit(copy / "eagle_data/quality/registry.py", '_gate("length_shift"',
         '    _gate("answered_rows", "WARN", False, "Counts the answered rows of a shard."),\n')  # fmt: skip
    gates = copy / "eagle_data/quality/gates.py"
    gates.write_text(gates.read_text().replace(
        "_Impl = Callable[", "def _answered_rows(d: CheckDef, s: Summary, i: Inputs) -> CheckResult:\n"
        "    return _result(d, True, float(s.answered), None, f\"{s.answered} answered rows\")\n\n\n"
        "_Impl = Callable[",
    ).replace('    "length_shift": _length_shift,\n', '    "length_shift": _length_shift,\n'
              '    "answered_rows": _answered_rows,\n'))  # fmt: skip
    edit(copy / "docs/design.md", "| `length_shift` | `{ds}_validated` |",
         "| `answered_rows` | `{ds}_validated` | no (WARN) | nothing: it counts the answered rows |\n")  # fmt: skip
    edit(copy / "docs/quality.md", "| `length_shift` | `{ds}_validated` |",
         "| `answered_rows` | `{ds}_validated` | WARN | no | no | none |\n")  # fmt: skip


def add_engine_kind(copy: Path) -> None:
    """An engine kind in its own module (one record), listed in the engines doc and the README's settings."""
    (copy / "eagle_data/engines/echo.py").write_text('''"""An engine that answers with the last user message."""

from eagle_data.engines import EngineKind, register
from eagle_data.types import Completion, Engine, Message


class EchoEngine(Engine):
    name = "echo"

    def __init__(self, model: str = "echo") -> None:
        self.model = model

    def config(self) -> dict:
        return {"engine": self.name, "model": self.model}

    async def check(self) -> str:
        return "echo engine ready"

    async def complete(self, messages: list[Message], *, prompt_id: str) -> Completion:
        return Completion(content=f"echo: {messages[-1]['content']}", completion_tokens=3, provider="echo")

    async def aclose(self) -> None:
        """Nothing to release."""


register(EngineKind("echo", build=lambda s, spec: EchoEngine(s.model or "echo"), make=EchoEngine, summary="echo",
                    ramp=False, max_in_flight=8))
''')  # fmt: skip
    edit(copy / "eagle_data/engines/__init__.py", "BUILTIN_MODULES = (", '    "eagle_data.engines.echo",\n')
    edit(copy / "docs/engines.md", "| `local` | `engines/local.py` |",
         "| `echo` | `engines/echo.py` | none | `echo` | 8, no ramp |\n")  # fmt: skip
    readme = copy / "README.md"
    readme.write_text(
        readme.read_text().replace(
            "| `EAGLE_DATA_ENGINE` | `openrouter`,", "| `EAGLE_DATA_ENGINE` | `echo`, `openrouter`,"
        )
    )


def add_export_format(copy: Path) -> None:
    """A text export format: one registry record and its row in the exports doc."""
    formats = copy / "eagle_data/exports/formats.py"
    formats.write_text(formats.read_text().replace("    for f in (\n", '''    for f in (
        ExportFormat(
            "plain_conversations", "plain.jsonl", "id, conversations [{role, content, reasoning_content}]",
            "any trainer that reads role/content conversations", to_specforge_text,
            tokenized=False, reasoning=True, mix=False,
        ),
''', 1))  # fmt: skip
    edit(copy / "docs/exports.md", "| `eagle_sharegpt` | `sharegpt.jsonl`",
         "| `plain_conversations` | `plain.jsonl`, per dataset | `id`, `conversations` `[{role, content, "
         "reasoning_content}]` | any trainer that reads role/content conversations | no |\n")  # fmt: skip


CHANGES: dict[str, tuple[Callable[[Path], None], tuple[str, ...]]] = {
    "check": (add_check, ("test_check_registry.py", "test_docs_match_code.py", "test_report.py",
                          "test_quality_checks.py", "test_alerts_every_check.py")),
    "engine kind": (add_engine_kind, ("test_engine_registry.py", "test_engine_settings.py", "test_docs_match_code.py")),
    "export format": (add_export_format, ("test_exports_parity.py", "test_docs_match_code.py")),
}  # fmt: skip


def test_a_dataset_is_one_table_in_a_user_catalog_and_needs_no_sample_outside_the_demo(tmp_path: Path) -> None:
    user = tmp_path / "catalog.toml"
    user.write_text(DATASET)
    shared_demo = "demo_run_writes or demo_materializes_its_partition or demo_goes_whole"  # the shared demo run
    done = lane(TREE, "test_catalog.py", "test_definitions.py", "test_docs_match_code.py", "test_sources.py",
                "test_ui_quiet_and_linkable.py", "-k", f"not cli and not s3 and not ({shared_demo})",
                env={"EAGLE_DATA_CATALOG": str(user)})  # fmt: skip
    green(done)


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_check_an_engine_kind_and_an_export_format_are_each_one_record(change: str, tmp_path: Path) -> None:
    make, tests = CHANGES[change]
    copy = copy_of(tmp_path)
    make(copy)
    green(lane(copy, *tests))
