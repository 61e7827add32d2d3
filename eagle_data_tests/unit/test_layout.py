"""The storage layout: every kind of key round-trips through build and parse, and no other module of the
package builds or splits keys by hand."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from eagle_data import layout
from eagle_data.layout import Key

DS = "b7_sharegpt"
PACKAGE = Path(layout.__file__).parent

BUILT = [
    (layout.shard(DS, layout.prompts_asset(DS), "00003"), Key("shard", DS, f"{DS}_prompts", partition="00003")),
    (layout.shard(DS, layout.generation_asset(DS), "00003"), Key("shard", DS, DS, partition="00003")),
    (layout.shard(DS, layout.validated_asset(DS), "00012"), Key("shard", DS, f"{DS}_validated", partition="00012")),
    (
        layout.log_part(DS, "00001", 1_700_000_000_000_000_000, 4242, 7),
        Key("log_part", DS, DS, partition="00001", name="part-01700000000000000000-4242-000007.parquet"),
    ),
    (layout.usage(DS, "00002"), Key("usage", DS, DS, partition="00002", name="00002.json")),
    (layout.index_file(DS, "summary.json"), Key("index", DS, f"{DS}_prompts", name="summary.json")),
    (layout.index_block(DS, "ab12", 3), Key("index_block", DS, f"{DS}_prompts", partition="00003", name="ab12")),
    (layout.quality_record(DS, "00004"), Key("quality_record", DS, partition="00004", name="00004.json")),
    (layout.quality_page(DS, "00004"), Key("quality_page", DS, partition="00004", name="00004.html")),
    (layout.quality_index(DS), Key("quality_index", DS, name="index.html")),
    (layout.export_file(DS, layout.CONVERSATIONS_FILE), Key("export", DS, name="conversations.jsonl")),
    (layout.export_file(DS, layout.TRAIN_FILE), Key("export", DS, name="train.parquet")),
    (layout.mix(), Key("mix", "training_mix", "training_mix", name="mix.parquet")),
    (
        layout.drafter_file("hidden_state_plan", "plan.json"),
        Key("drafter", "drafter", "hidden_state_plan", name="plan.json"),
    ),
    (
        layout.capture_record("c" * 16, "shards", "00003"),
        Key("drafter", "drafter", "hidden_states", partition="c" * 16 + "/_shards", name="00003.json"),
    ),
    (
        layout.draft_vocab_file("a" * 64, "b" * 64, layout.vocab_mapping_name(32_000)),
        Key("drafter", "drafter", "draft_vocab", partition="a" * 16 + "-" + "b" * 16, name="vocab_mapping_32000.pt"),
    ),
]


@pytest.mark.parametrize(("key", "parsed"), BUILT, ids=[p.kind + ":" + k for k, p in BUILT])
def test_every_kind_of_key_parses_back_to_what_built_it(key: str, parsed: Key) -> None:
    assert layout.parse(key) == parsed


def test_keys_keep_the_documented_paths() -> None:
    """The paths users and trainers read are a contract: building them through the layout changes none."""
    assert layout.shard(DS, DS, "00000") == f"{DS}/{DS}/00000.parquet"
    assert layout.log_prefix(DS, "00000") == f"{DS}/{DS}/_log/00000"
    assert layout.usage(DS, "00000") == f"{DS}/{DS}/_usage/00000.json"
    assert layout.index_file(DS, "prompts.parquet") == f"{DS}/{DS}_prompts/_index/prompts.parquet"
    assert layout.quality_index(DS) == f"{DS}/{DS}_quality/index.html"
    assert layout.export_file(DS, "train.parquet") == f"{DS}/export/train.parquet"
    assert layout.mix() == "training_mix/training_mix/mix.parquet"


@pytest.mark.parametrize(
    "stray",
    [
        f"{DS}/{DS}/.00000.parquet.abc.tmp",  # a local write in progress
        f"{DS}/{DS}/_log/00000/notes.txt",
        f"{DS}/{DS}_quality/readme.txt",
        f"{DS}/{DS}/00000.json",
        "toplevel.parquet",
    ],
)
def test_stray_files_parse_to_nothing(stray: str) -> None:
    assert layout.parse(stray) is None


def test_uri_and_s3_root() -> None:
    assert layout.under("/data/out", "a/b.parquet") == "/data/out/a/b.parquet"
    assert layout.under("s3://bucket/pre", "a/b.parquet") == "s3://bucket/pre/a/b.parquet"
    assert layout.under("", "a/b.parquet") == "a/b.parquet"
    assert layout.s3_root("s3://bucket/some/prefix/") == ("bucket", "some/prefix")
    assert layout.s3_root("s3://bucket") == ("bucket", "")


STORE_METHODS = {"read_bytes", "write_bytes", "read_frame", "write_frame", "exists", "list", "delete"}
KEY_MARKERS = ("_log", "_usage", "_index", "_quality", "_prompts", "_validated", "export/", "training_mix/")


def _names_a_key(node: ast.AST) -> bool:
    """An assignment to a name or attribute called like a key (`key = ...`, `self.prefix = ...`)."""
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    names = [getattr(t, "id", None) or getattr(t, "attr", "") for t in targets if t is not None]
    return isinstance(node, ast.Assign | ast.AnnAssign) and any("key" in n or "prefix" in n for n in names)


def _joins_with_slash(value: ast.AST | None) -> bool:
    """An f-string that puts a "/" right after a formatted part, outside a URL."""
    if not isinstance(value, ast.JoinedStr):
        return False
    literals = [part.value for part in value.values if isinstance(part, ast.Constant)]
    return any(t.startswith("/") for t in literals) and not any("://" in t for t in literals)


def _hand_built_keys(path: Path) -> list[str]:
    """Places in one module that build or split a storage key without the layout module:
    an f-string or `+` passed as the key of a store call, `split("/")`-style parsing in a module that
    uses the store, a `key`/`prefix` variable joined with "/" in an f-string there, or a string that
    spells a layout folder name inside a path."""
    source = path.read_text()
    tree = ast.parse(source)
    uses_store = "ShardStore" in source or "store." in source
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        where = f"{path}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            first = node.args[0] if node.args else None
            if node.func.attr in STORE_METHODS and isinstance(first, ast.JoinedStr | ast.BinOp):
                found.append(f"{where}: store.{node.func.attr}() with a hand-built key")
            if uses_store and node.func.attr in {"split", "rsplit", "partition", "rpartition"} and (
                isinstance(first, ast.Constant) and first.value == "/"
            ):
                found.append(f'{where}: {node.func.attr}("/")')
        if uses_store and _names_a_key(node) and _joins_with_slash(getattr(node, "value", None)):
            found.append(f"{where}: a key or prefix joined by hand with '/'")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
            if "/" in text and "://" not in text and any(marker in text for marker in KEY_MARKERS):
                found.append(f"{where}: {text!r}")
    return found


def test_no_module_builds_or_parses_keys_by_hand() -> None:
    modules = [p for p in PACKAGE.rglob("*.py") if p.name != "layout.py"]
    assert len(modules) > 20  # the scan sees the package
    found = [hit for path in modules for hit in _hand_built_keys(path)]
    assert not found, "build and parse storage keys with eagle_data.layout:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("snippet", "hand_built"),
    [
        ('store.write_bytes(dataset + "/x.json", b"")', True),
        ('store.list(f"{ds}/{ds}")', True),
        ('where = key.split("/")[2:]  # store.list', True),
        ('prefix = "b7/b7/_log/00000"', True),
        ('self.prefix = f"{ds}/{ds}/{LOG}/{partition}"  # then store.list(self.prefix)', True),
        ('key = f"{self.prefix}/part-{n}.parquet"  # then store.write_frame(key)', True),
        ('say(f"{done}/{total} done")  # a store. module logging a fraction', False),
        ('store.write_bytes(layout.usage(ds, "00000"), b"")', False),
        ('model = name.rsplit("/", 1)[-1]', False),  # no store in this module: not a key
    ],
)
def test_the_scan_catches_hand_built_keys(tmp_path: Path, snippet: str, hand_built: bool) -> None:
    """The scan above can fail: each pattern it looks for is found, and layout calls pass."""
    probe = tmp_path / "probe.py"
    probe.write_text(snippet + "\n")
    assert bool(_hand_built_keys(probe)) is hand_built
