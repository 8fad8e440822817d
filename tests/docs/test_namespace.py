"""The flat namespace: every public name and subpackage is an attribute of `identifiable`,
`dir()` lists exactly them, every subpackage's own `__all__` resolves, and every
`idf.<name>` the README and docs use exists. Each check runs in a fresh interpreter, so
that nothing imported by an earlier test can make a lazy name resolve by accident."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# named by issue 25 as missing from `idf` before this test existed
ONCE_MISSING = (
    "mixing",
    "attention",
    "context_mixing",
    "interval_map",
    "constrained_attention",
    "MixingResult",
    "EffectiveAttention",
    "trace_from_lens",
    "register_inseq",
    "viewer_iframe",
)


def _fresh(code: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_public_name_resolves_and_dir_lists_only_them() -> None:
    found = _fresh(
        "import json, sys, identifiable as idf\n"
        "torch_at_import = 'torch' in sys.modules\n"
        "missing = [n for n in idf.__all__ if getattr(idf, n, None) is None]\n"
        "print(json.dumps({'all': idf.__all__, 'dir': dir(idf), 'missing': missing,\n"
        "  'table': ['__version__', *idf.SUBPACKAGES, *idf._EXPORTS],\n"
        "  'torch_at_import': torch_at_import}))"
    )
    assert found["missing"] == []
    assert found["dir"] == sorted(found["all"])
    assert found["all"] == found["table"]  # the literal list and the lookup table agree
    assert len(found["all"]) == len(set(found["all"]))
    assert not found["torch_at_import"]  # `import identifiable` stays cheap
    for name in ONCE_MISSING:
        assert name in found["all"], name


def test_an_unknown_name_is_an_attribute_error() -> None:
    found = _fresh(
        "import json, identifiable as idf\n"
        "try:\n    idf.no_such_name\n    r = 'resolved'\n"
        "except AttributeError as e:\n    r = str(e)\n"
        "print(json.dumps({'r': r, 'has': hasattr(idf, 'importlib') or hasattr(idf, 'Any')}))"
    )
    assert "no attribute 'no_such_name'" in found["r"]
    assert not found["has"]  # no helper names leak into the namespace


def test_every_subpackage_all_resolves() -> None:
    found = _fresh(
        "import importlib, json, identifiable as idf\n"
        "bad = []\n"
        "for p in idf.SUBPACKAGES:\n"
        "    mod = importlib.import_module('identifiable.' + p)\n"
        "    for n in getattr(mod, '__all__', []):\n"
        "        try:\n            getattr(mod, n)\n"
        "        except Exception as e:\n            bad.append(f'{p}.{n}: {e}')\n"
        "print(json.dumps({'bad': bad}))"
    )
    assert found["bad"] == []


def _doc_names() -> set[str]:
    names: set[str] = set()
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        names |= set(re.findall(r"\bidf\.([A-Za-z_][A-Za-z0-9_]*)", path.read_text()))
    return names


def test_every_name_the_docs_use_exists() -> None:
    names = sorted(_doc_names())
    assert "load_model" in names  # the scan finds the README tour's names
    found = _fresh(
        f"import json, identifiable as idf\n"
        f"print(json.dumps({{'missing': [n for n in {names!r} if not hasattr(idf, n)]}}))"
    )
    assert found["missing"] == []


def test_the_static_stub_is_generated_from_the_table() -> None:
    """__init__.pyi (what type checkers and IDEs read) is written from the same table as
    `__all__` and the lazy lookup: it fails while the two disagree, and a name added to the
    table without rerunning the generator is caught."""
    script = ROOT / "scripts" / "public_names.py"
    out = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    stub = (ROOT / "src" / "identifiable" / "__init__.pyi").read_text("utf-8")
    found = _fresh("import json, identifiable as idf\nprint(json.dumps({'all': idf.__all__}))")
    for name in found["all"]:
        assert f'"{name}",' in stub, name
