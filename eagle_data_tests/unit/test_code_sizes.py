"""Size limits the project holds its code to (read from the source with `ast`): a module over 400 lines or a
function over 60 has stopped being one thing, and is where the next change gets hard to review."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "eagle_data"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """`file:line name (n lines)` for every function or method, nested ones included, longer than `limit`
    (from its `def` or first decorator to its last line)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines = (node.end_lineno or node.lineno) - first + 1
            if lines > limit:
                out.append(f"{path.name}:{first} {node.name} ({lines} lines)")
    return out


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_the_walk_counts_nested_functions_methods_and_decorators(tmp_path: Path) -> None:
    body = "".join(f"            x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 2))
    source = tmp_path / "m.py"
    source.write_text(
        "class C:\n    @staticmethod\n    def outer():\n        async def inner():\n"
        f"{body}        return inner\n\n\ndef short():\n    return 1\n"
    )
    # inner: its def + 58 body lines = 59; outer: decorator + def + inner + return = 62
    assert long_functions(source) == ["m.py:2 outer (62 lines)"]
    assert long_functions(source, limit=58) == ["m.py:2 outer (62 lines)", "m.py:4 inner (59 lines)"]


def test_no_module_in_the_package_is_over_400_lines() -> None:
    over = [
        f"{path.relative_to(PACKAGE.parent)} ({n} lines)"
        for path in modules()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"


def test_no_function_in_the_package_is_over_60_lines() -> None:
    over = [f"{path.parent.relative_to(PACKAGE.parent)}/{line}" for path in modules() for line in long_functions(path)]
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}"
