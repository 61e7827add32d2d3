"""The repository stands alone: no file in it points at documents or folders outside it, every
document it names exists, and every package-data pattern in pyproject.toml matches a file."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".dagster_home", "eagle-output",
             "build", "dist"}  # fmt: skip
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".sh", ".cfg", ".ini", ".txt", ".example", ".dockerignore"}
TEXT_NAMES = {"Makefile", "Dockerfile", "run"}
# Built from pieces so this file does not match itself.
OUTSIDE = re.compile("|".join([r"\b(?:DESIGN|FACTS|STYLE)" + r"\.md\b", r"\.\./" + "shared", "/work" + "/"]))
DOC_MENTION = re.compile(r"\bdocs/[\w.-]+\.md\b")
MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def text_files() -> list[Path]:
    files = []
    for path in REPO.rglob("*"):
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in path.relative_to(REPO).parts[:-1]):
            continue
        if path.is_file() and (path.suffix in TEXT_SUFFIXES or path.name in TEXT_NAMES):
            files.append(path)
    return files


def test_no_file_refers_to_documents_or_folders_outside_the_repository():
    hits = [
        f"{path.relative_to(REPO)}:{n}: {match.group(0)}"
        for path in text_files()
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        for match in OUTSIDE.finditer(line)
    ]
    assert not hits, "references to files outside the repository (describe them in docs/ instead):\n" + "\n".join(hits)


def test_every_named_doc_and_markdown_link_resolves_inside_the_repository():
    broken = []
    for path in text_files():
        text = path.read_text(errors="replace")
        broken += [f"{path.relative_to(REPO)}: {m}" for m in DOC_MENTION.findall(text) if not (REPO / m).is_file()]
        if path.suffix == ".md":
            for target in MD_LINK.findall(text):
                if re.match(r"^[a-z]+:", target):  # http://, https://, mailto:
                    continue
                resolved = (path.parent / target).resolve()
                if not resolved.is_relative_to(REPO) or not resolved.exists():
                    broken.append(f"{path.relative_to(REPO)}: ({target})")
    assert not broken, "broken document references:\n" + "\n".join(broken)


def test_the_design_facts_and_anchors_documents_exist():
    for name in ("design.md", "facts.md", "anchors.md"):
        assert (REPO / "docs" / name).stat().st_size > 1000, f"docs/{name} is missing or empty"


def test_every_package_data_pattern_matches_a_file():
    settings = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    empty = [f"{package}: {pattern}" for package, patterns in settings.items() for pattern in patterns
             if not list((REPO / package.replace(".", "/")).glob(pattern))]  # fmt: skip
    assert not empty, f"package-data patterns that match nothing: {empty}"
