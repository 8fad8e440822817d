#!/usr/bin/env python3
"""Files over 600 lines and functions over 80 lines in src/identifiable (the house rule).

    python scripts/sizes.py            # the offenders, longest first
    python scripts/sizes.py --top 10   # the ten longest files and functions, offenders or not

A function's length is its `def` line to its last line (decorators and docstring
included), as `ast` gives them; nested functions count inside their parent and again
on their own. Its body is what follows the signature and the docstring (a typer
command's option declarations are signature). Data tables (module-level assignments)
are not functions and are not measured.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "identifiable"
MAX_FILE, MAX_FUNCTION = 600, 80


def file_lengths(root: Path = SRC) -> list[tuple[int, str]]:
    out = []
    for path in sorted(root.rglob("*.py")):
        out.append((len(path.read_text("utf-8").splitlines()), str(path.relative_to(root))))
    return sorted(out, reverse=True)


def _body_start(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    first = node.body[0]
    is_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    if is_doc and isinstance(first.value.value, str) and len(node.body) > 1:
        return node.body[1].lineno
    return first.lineno


def function_lengths(root: Path = SRC) -> list[tuple[int, str]]:
    """(lines, "file:line:name (body B)") of every function, longest first."""
    out = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text("utf-8"))
        rel = path.relative_to(root)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                end = node.end_lineno or node.lineno
                body = end - _body_start(node) + 1
                out.append((end - start + 1, f"{rel}:{node.lineno}:{node.name} (body {body})"))
    return sorted(out, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=0, help="show the N longest of each")
    args = parser.parse_args()
    files, functions = file_lengths(), function_lengths()
    if args.top:
        files, functions = files[: args.top], functions[: args.top]
    else:
        files = [f for f in files if f[0] > MAX_FILE]
        functions = [f for f in functions if f[0] > MAX_FUNCTION]
    print(f"files (> {MAX_FILE} lines):" if not args.top else "longest files:")
    for n, name in files:
        print(f"  {n:5d}  {name}")
    print(f"functions (> {MAX_FUNCTION} lines):" if not args.top else "longest functions:")
    for n, name in functions:
        print(f"  {n:5d}  {name}")


if __name__ == "__main__":
    main()
