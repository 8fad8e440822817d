"""The wheel: what `pip install identifiable` gets holds every module, the static stub, the
report's assets and the packaged corpus, and runs from a folder that is not this checkout.

The wheel is built here (no network: `--no-build-isolation` uses the environment's
setuptools), unpacked into a temporary folder, and imported from there in a fresh
interpreter, so that nothing is read from src/.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "identifiable"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    # a copy of the tracked tree, so that building writes nothing into the checkout
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (build / name).parent.mkdir(parents=True, exist_ok=True)
            (build / name).write_bytes((ROOT / name).read_bytes())
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    done = subprocess.run(
        [*pip, "-w", str(out), str(build)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (found,) = out.glob("identifiable-*.whl")
    return found


def test_the_wheel_holds_every_module_the_stub_assets_and_data(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {
        str(p.relative_to(SRC.parent))
        for p in SRC.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    assert not wanted - names, f"missing from the wheel: {sorted(wanted - names)}"
    for must in ("identifiable/__init__.pyi", "identifiable/py.typed"):
        assert must in names


def test_the_unpacked_wheel_runs_with_the_embedded_model(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import json, identifiable as idf\n"
        "from identifiable.report.html import asset\n"
        "from identifiable.models.loading import embedded_model_path\n"
        "texts = idf.load_corpus('wikipedia-sample', limit=3)\n"
        "print(json.dumps({'file': idf.__file__, 'texts': len(list(texts)),\n"
        "  'model': embedded_model_path().joinpath('config.json').is_file(),\n"
        "  'asset': len(asset('viewer.js')) > 1000}))"
    )
    env = {"PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["file"].startswith(str(site))
    assert found == {**found, "texts": 3, "model": True, "asset": True}
