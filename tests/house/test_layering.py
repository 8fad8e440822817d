"""The house: data flows one way. No module imports a higher floor.

corpus → models (tracing) → pure analyses → experiments (stages) → report / CLI.
`report/` renders tables and imports nothing but itself and the low-level floor.
Every import is checked, including those inside functions and under TYPE_CHECKING,
because a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "identifiable"

# floor of each top-level package or module; a module may import its own floor or below
FLOORS = {
    "errors": 0,
    "store": 0,
    "results": 0,  # the Result mixin every result dataclass shares
    "result_files": 0,  # its file format: an explicit table of result classes, checked reads
    "precision": 0,  # the float32 matmul precision torch is set to, read without raising
    "seeds": 0,  # the seed range and seeds derived for a layer
    "unicode": 0,  # text a tokenizer can take (no lone surrogates)
    "corpus": 1,
    "models": 2,
    "attention": 3,
    "tokens": 3,
    "attribution": 3,
    "mixing": 3,
    "training": 3,  # the null-attention penalty and label-free fine-tuning
    "experiments": 4,
    "viewer": 5,
    "reproduction": 5,
    "finetuning": 5,  # `identifiable finetune`: train, evaluate, render
    "comparison": 5,  # `identifiable compare`: reproductions side by side
    "cli": 6,
    "peers": 6,  # adapters to bertviz and inseq
    "__init__": 7,
    "__main__": 7,
    "__version__": 0,  # `from identifiable import __version__` is a constant
}
# report renders: it may import only these, whatever their floor
REPORT_MAY_IMPORT = {"report", "store", "errors"}


def _part(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "identifiable":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text("utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "identifiable":  # from identifiable import attention
                found += [(node.lineno, f"identifiable.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, node.module))
    return found


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_no_import_goes_up(path: Path) -> None:
    rel = path.relative_to(SRC)
    own = rel.parts[0].removesuffix(".py")
    bad = []
    for line, module in _imports(path):
        target = _part(module)
        if target is None or target == own:
            continue
        if own == "report":
            if target not in REPORT_MAY_IMPORT:
                bad.append(f"{rel}:{line} imports {module}")
            continue
        if target == "report":
            continue  # rendering is the top floor's job; anything above experiments may call it
        if FLOORS.get(target, 99) > FLOORS.get(own, -1):
            bad.append(
                f"{rel}:{line} imports {module} (floor {FLOORS.get(target)} > {FLOORS.get(own)})"
            )
    assert not bad, "\n".join(bad)


def test_only_top_floors_render() -> None:
    """Analyses and experiments never import report/ (they return tables; report renders)."""
    bad = []
    for path in _modules():
        own = path.relative_to(SRC).parts[0].removesuffix(".py")
        if FLOORS.get(own, 99) > 4 or own == "report":
            continue
        bad += [
            f"{path.relative_to(SRC)}:{line} imports {m}"
            for line, m in _imports(path)
            if _part(m) == "report"
        ]
    assert not bad, "\n".join(bad)


def test_the_checker_catches_an_upward_import(tmp_path: Path) -> None:
    """The rule itself can fail: an analysis importing an experiment is flagged."""
    fake = tmp_path / "x.py"
    fake.write_text("from identifiable.experiments.reproduce import reproduce\n")
    assert [m for _, m in _imports(fake)] == ["identifiable.experiments.reproduce"]
    assert FLOORS["experiments"] > FLOORS["attention"]
