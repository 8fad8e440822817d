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

# floor of each folder (or module) of the package; a module may import its own floor or below.
# A dotted key is a module with a floor of its own inside a folder (the longest key wins).
FLOORS = {
    "errors": 0,  # the one exception type
    "utils": 0,  # progress, threads, precision, seeds, unicode
    "store": 0,  # folders, caches and atomic files
    "results": 0,  # the Result base, its file format, html, plots and the colormap
    "report.tables": 0,  # the stage → report contract: the tables each stage hands over
    "corpus": 1,
    "models": 2,
    "attention": 3,
    "tokens": 3,
    "attribution": 3,
    "mixing": 3,
    "training": 3,  # the null-attention penalty and label-free fine-tuning steps
    "experiments": 4,
    "report": 5,  # renders: imports only REPORT_MAY_IMPORT; floors above experiments call it
    "viewer": 5,  # the viewer: compute, encode, render, widget
    "runs": 5,  # reproduce, compare, finetune: the runs behind the CLI's long commands
    "integrations": 6,  # TransformerLens, nnsight and inseq bridges
    "cli": 6,
    "__init__": 7,
    "__main__": 7,
    "__version__": 0,  # `from identifiable import __version__` is a constant
}
# report renders: it may import only these, whatever their floor
REPORT_MAY_IMPORT = {"report", "report.tables", "store", "errors", "results.colormap"}


def _floor_key(dotted: str) -> str:
    """The FLOORS key that holds `dotted` ("report.tables", "attention.effective"): the
    longest dotted prefix that is a key, else its first part."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in FLOORS:
            return ".".join(parts[:k])
    return parts[0]


def _report_may_import(module: str) -> bool:
    dotted = module.removeprefix("identifiable.")
    return any(dotted == ok or dotted.startswith(ok + ".") for ok in REPORT_MAY_IMPORT)


def _part(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "identifiable":
        return None
    return _floor_key(".".join(parts[1:])) if len(parts) > 1 else "__init__"


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in the file, lazy and TYPE_CHECKING ones included.
    `from identifiable.x import y` names the submodule `identifiable.x.y` when there is one
    (`from identifiable import y` always names `identifiable.y`)."""
    tree = ast.parse(path.read_text("utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                # from identifiable import attention (or __version__, a constant of floor 0)
                top = node.module == "identifiable"
                found.append((node.lineno, sub if top or _is_module(sub) else node.module))
    return found


def _is_module(name: str) -> bool:
    parts = name.split(".")
    if parts[0] != "identifiable":
        return False
    rel = SRC.joinpath(*parts[1:])
    return rel.with_suffix(".py").is_file() or (rel / "__init__.py").is_file()


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def upward_imports(path: Path, rel: Path) -> list[str]:
    """The imports of the file at `path`, placed at `rel` inside the package, that go up."""
    own = _floor_key(".".join(rel.with_suffix("").parts))
    bad = []
    for line, module in _imports(path):
        target = _part(module)
        if target is None or target == own:
            continue
        if own.split(".")[0] == "report":
            if not _report_may_import(module):
                bad.append(f"{rel}:{line} imports {module}")
            continue
        if target == "report":
            continue  # rendering is the top floor's job; anything above experiments may call it
        if FLOORS.get(target, 99) > FLOORS.get(own, -1):
            bad.append(
                f"{rel}:{line} imports {module} (floor {FLOORS.get(target)} > {FLOORS.get(own)})"
            )
    return bad


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_no_import_goes_up(path: Path) -> None:
    bad = upward_imports(path, path.relative_to(SRC))
    assert not bad, "\n".join(bad)


def test_only_top_floors_render() -> None:
    """Analyses and experiments never import report/ (they return tables; report renders)."""
    bad = []
    for path in _modules():
        own = _floor_key(".".join(path.relative_to(SRC).with_suffix("").parts))
        if FLOORS.get(own, 99) > 4 or own.split(".")[0] == "report":
            continue
        bad += [
            f"{path.relative_to(SRC)}:{line} imports {m}"
            for line, m in _imports(path)
            if _part(m) == "report"
        ]
    assert not bad, "\n".join(bad)


def test_the_checker_catches_an_upward_import(tmp_path: Path) -> None:
    """The rule itself can fail: the checker, run on planted files, flags an analysis that
    imports an experiment (also lazily, inside a function), and the report importing an
    analysis, and leaves the imports that go down or stay on their floor alone."""
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from identifiable.models.trace import Trace\n"
        "from identifiable.attention import effective\n"
        "def f():\n"
        "    from identifiable.experiments.pipeline import reproduce\n"
        "    import identifiable.cli\n"
    )
    bad = upward_imports(planted, Path("attention/planted.py"))
    assert bad == [
        "attention/planted.py:4 imports identifiable.experiments.pipeline (floor 4 > 3)",
        "attention/planted.py:5 imports identifiable.cli (floor 6 > 3)",
    ]
    assert upward_imports(planted, Path("cli/planted.py")) == []  # the top floor may
    assert upward_imports(planted, Path("report/planted.py")) == [
        f"report/planted.py:{line} imports {module}"
        for line, module in [
            (1, "identifiable.models.trace"),
            (2, "identifiable.attention.effective"),
            (4, "identifiable.experiments.pipeline"),
            (5, "identifiable.cli"),
        ]
    ]


def _import_graph() -> dict[str, set[str]]:
    """Module → the modules of the package it imports (lazy imports included)."""
    graph: dict[str, set[str]] = {}
    for path in _modules():
        rel = path.relative_to(SRC).with_suffix("")
        name = ".".join(("identifiable", *rel.parts)).removesuffix(".__init__")
        graph[name] = {m for _, m in _imports(path) if _is_module(m) and m != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph`: its strongly connected components of more than one
    module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycle() -> None:
    """No module imports, even lazily, a module that imports it back (models/model.py,
    seq2seq.py and discover.py did, until one capture object served all three)."""
    assert import_cycles(_import_graph()) == []


def test_the_cycle_check_can_fail() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_every_folder_has_a_floor() -> None:
    """The floors are the folders: each folder of the package has its FLOORS entry, and at
    most 5 modules sit loose at the top beside `__init__` and `__main__`."""
    folders = {p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()}
    assert not folders - set(FLOORS), f"folders without a floor: {sorted(folders - set(FLOORS))}"
    loose = sorted(p.stem for p in SRC.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(loose) <= 5, f"loose top-level modules: {loose}"
    stale = {k.split(".")[0] for k in FLOORS} - folders - {p.stem for p in SRC.glob("*.py")}
    assert stale <= {"__version__"}, f"FLOORS names what is not there: {sorted(stale)}"


def test_architecture_md_names_every_folder() -> None:
    """ARCHITECTURE.md's folder table and floor drawing name every folder of the package."""
    text = (SRC.parents[1] / "ARCHITECTURE.md").read_text("utf-8")
    folders = sorted(p.name for p in SRC.iterdir() if (p / "__init__.py").is_file())
    missing = [f for f in folders if f"| `{f}/` |" not in text or f"{f}/" not in text]
    assert not missing, f"ARCHITECTURE.md does not describe: {missing}"


ROOT = SRC.parents[1]
ENGINE = "identifiable.attention.lp"
# White-box tests of the engine's parts (the tiled product, the crossover's walk, the
# pivot rules, the thread groups, the disk cache) live in this one folder; every other
# file reaches the engine through its entry.
ENGINE_TESTS = ROOT / "tests" / "attention" / "lp"


def engine_reached_inside(path: Path) -> list[str]:
    """The imports of the file at `path` that reach a module inside the engine's package
    (anything below `identifiable.attention.lp`, which only its own modules may import)."""
    return [f"{path.name}:{line} imports {m}" for line, m in _imports(path)
            if m.startswith(ENGINE + ".")]  # fmt: skip


def _outside_the_engine() -> list[Path]:
    files = [p for p in _modules() if p.relative_to(SRC).parts[:2] != ("attention", "lp")]
    for folder in ("tests", "benchmarks"):
        files += [p for p in (ROOT / folder).rglob("*.py") if ENGINE_TESTS not in p.parents]
    return sorted(files)


def test_the_engine_is_reached_through_its_entry() -> None:
    """Nothing outside `attention/lp/` (src, tests, benchmarks) imports the engine's own
    modules: `from identifiable.attention.lp import bound_keys, EngineOptions, …` only,
    so the engine can change behind its interface without touching its callers."""
    outside = _outside_the_engine()
    assert any(p.name == "intervals.py" for p in outside)  # src outside lp/ is scanned
    assert not any("attention/lp/" in str(p.relative_to(ROOT)) for p in outside
                   if p.is_relative_to(SRC))  # fmt: skip
    bad = [b for p in outside for b in engine_reached_inside(p)]
    assert not bad, "\n".join(bad)


def test_the_engine_check_can_fail(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from identifiable.attention.lp import EngineOptions, bound_keys\n"
        "from identifiable.attention.lp.kernel import price\n"
        "def f():\n"
        "    from identifiable.attention.lp import lockstep\n"
    )
    assert engine_reached_inside(planted) == [
        "planted.py:2 imports identifiable.attention.lp.kernel",
        "planted.py:4 imports identifiable.attention.lp.lockstep",
    ]
