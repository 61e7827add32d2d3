"""Imports point one way, down the floors: read from the source with `ast` (function-level imports included,
so a loop hidden inside a function is found too)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "eagle_data"
# Top to bottom; a room may import its own floor or any floor below, never one above.
FLOORS = (
    {"standins"},  # servers the tests and benchmarks start: above everything, so nothing imports them
    {"cli", "definitions"},
    {"defs"},
    {"stages"},  # stages: pure functions in, plain records out (never Dagster, never defs)
    {"runner", "drafter", "exports", "report", "alerts", "files_server"},
    {"engines", "quality"},
    {"targets", "sources", "storage", "catalog", "stage_table", "demo"},
    {"types", "settings", "layout", "secrets", "provenance", "retry_after", "procs", "checkpoints"},
)
FLOOR = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}
WIRING = {"defs", "definitions"}  # the only rooms that know Dagster
DAGSTER = "dagster"
TESTS = "eagle_data_tests"


def room_of(module: str) -> str:
    """`eagle_data.engines.sglang` -> `engines`; `eagle_data.types` -> `types`."""
    return module.split(".")[1]


def imported(path: Path) -> set[str]:
    """Every eagle_data module (and `dagster`) a file imports, at any depth of its syntax tree."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            module = node.module or ""
            names = [f"{module}.{a.name}" for a in node.names] if module == "eagle_data" else [module]
        else:
            continue
        for name in names:
            if name.startswith("eagle_data."):
                out.add(name)
            elif name.split(".")[0] in (DAGSTER, "dagster_aws"):
                out.add(DAGSTER)
    return out


def room_imports() -> dict[str, set[tuple[str, str]]]:
    """room -> {(imported room or "dagster", file)} over every module of the package."""
    edges: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for name in imported(path):
            target = DAGSTER if name == DAGSTER else room_of(name)
            edges[room_of(module)].add((target, str(path.relative_to(PACKAGE.parent))))
    return edges


def test_engines_and_the_runner_never_import_each_other() -> None:
    edges = room_imports()
    assert not {f for room, f in edges["engines"] if room == "runner"}
    assert not {f for room, f in edges["runner"] if room == "engines"}


def test_every_room_sits_on_a_floor_and_imports_only_its_own_floor_or_below() -> None:
    edges = room_imports()
    unplaced = set(edges) - set(FLOOR)
    assert not unplaced, f"rooms missing from FLOORS: {sorted(unplaced)}"
    upward = sorted(
        f"{path} ({room}) imports {target}"
        for room, targets in edges.items()
        for target, path in targets
        if target != DAGSTER and FLOOR[target] < FLOOR[room]
    )
    assert not upward


def test_no_two_rooms_import_each_other_through_any_path() -> None:
    graph = {
        room: {t for t, _ in targets if t not in (room, DAGSTER)}
        for room, targets in room_imports().items()
    }
    assert not sorted(room for room in graph if room in _reach(graph, room))


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_no_two_engine_modules_import_each_other_through_any_path() -> None:
    """Within the engines room (`engines/local.py` and `engines/local_sglang.py` once did). A package's
    `__init__` is left out: importing a submodule runs it, and it may re-export its submodules."""
    paths = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts): p for p in PACKAGE.rglob("*.py")}
    modules = {name for name, path in paths.items() if path.name != "__init__.py" and room_of(name) == "engines"}

    def module_of(name: str) -> str:
        while name and name not in paths:  # `from eagle_data.x import f` names f
            name = name.rpartition(".")[0]
        return name

    graph = {m: {module_of(n) for n in imported(paths[m])} & modules - {m} for m in modules}
    assert not sorted(m for m in graph if m in _reach(graph, m))


def test_pure_rooms_never_import_dagster_or_the_wiring() -> None:
    bad = sorted(
        f"{path} imports {target}"
        for room, targets in room_imports().items()
        if room not in WIRING
        for target, path in targets
        if target == DAGSTER or target in WIRING
    )
    assert not bad


def test_no_class_in_the_runner_is_over_250_lines() -> None:
    """The runner stays in parts each testable alone (dispatcher, shard writer, reporter), not one object."""
    long = sorted(
        f"{path.name}::{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in (PACKAGE / "runner").glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 250
    )
    assert not long


def test_only_one_module_of_the_dagster_layer_imports_dagsters_private_api() -> None:
    private = sorted({
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom | ast.Import)
        and any(name.startswith("dagster._") for name in _imported(node))
    })  # fmt: skip
    assert private == ["defs/instance.py"]


# Dagster internals reached through public objects, no private import needed: the event log storage's methods
# (check histories, pool slots), an executor definition's creation function, a named tuple's `_replace`.
INTERNAL_ATTRIBUTES = {"event_log_storage", "run_storage", "schedule_storage", "executor_creation_fn", "_replace"}


def test_dagsters_internals_are_reached_only_from_defs_instance() -> None:
    """Every use of Dagster's internals sits behind a named function of defs/instance.py (`secrets.py`'s
    `_replace` is a urllib named tuple's, not Dagster's)."""
    used = sorted(
        f"{path.relative_to(PACKAGE)}:{node.lineno} .{node.attr}"
        for path in (PACKAGE / "defs").rglob("*.py")
        if path.name != "instance.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in INTERNAL_ATTRIBUTES
    )
    assert used == []
    outside = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "defs" not in path.parts and "event_log_storage" in path.read_text()
    )
    assert outside == []


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    return [node.module or ""] if isinstance(node, ast.ImportFrom) else [alias.name for alias in node.names]


def test_the_benchmarks_need_nothing_of_the_test_package() -> None:
    """A benchmark imports its stand-in servers from eagle_data.standins, never from the tests (an import, or a
    `python -m eagle_data_tests...` it starts)."""
    uses = sorted(
        f"{path.name}:{node.lineno}"
        for path in (PACKAGE.parent / "benchmarks").glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if (isinstance(node, ast.ImportFrom | ast.Import) and any(n.startswith(TESTS) for n in _imported(node)))
        or (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(TESTS))
    )
    assert not uses


def test_unit_tests_import_neither_dagster_nor_the_layers_above() -> None:
    """The unit layer (eagle_data_tests/unit/) calls pure rooms only: no Dagster, no defs, no integration or
    end-to-end test module."""
    unit = next(p for p in Path(__file__).resolve().parents if p.name == TESTS) / "unit"
    above = ("eagle_data.defs", "eagle_data.definitions", "eagle_data_tests.integration", "eagle_data_tests.e2e")
    found = sorted(
        f"{path.name} imports {name}"
        for path in unit.glob("*.py")
        for name in imported_any(path)
        if name == DAGSTER or name.startswith(above)
    )
    assert not found


def imported_any(path: Path) -> set[str]:
    """Every module a file imports (dagster as DAGSTER), at any depth."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return {DAGSTER if name.split(".")[0] in (DAGSTER, "dagster_aws") else name for name in out}
