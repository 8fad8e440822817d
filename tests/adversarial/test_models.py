"""Hostile model folders: configs sized before any allocation, `auto_map` code never run.

A config is read before anything is built. `num_hidden_layers: 1000000` beside the weights
of a 2-layer model used to build layers for 5 minutes and 3.4 GB before std::bad_alloc; it
is now one line, in under 2 s and under 200 MB (measured in a fresh process).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from identifiable.errors import IdentifiableError
from identifiable.models import loading


def _hostile(model_dir: Path, root: Path, name: str, **changes: Any) -> Path:
    """A copy of the tiny model folder with `changes` written into its config.json."""
    target = root / name
    shutil.copytree(model_dir, target)
    config = json.loads((target / "config.json").read_text())
    config.update(changes)
    (target / "config.json").write_text(json.dumps(config))
    return target


HOSTILE_CONFIGS: dict[str, tuple[dict[str, Any], str]] = {
    "a million layers": ({"num_hidden_layers": 1_000_000}, "loads at most 100000"),
    "50k wide layers": (
        {"num_hidden_layers": 50_000, "hidden_size": 1024, "intermediate_size": 4096},
        "too large for this machine",
    ),
    "vocabulary of 1e12": ({"vocab_size": 10**12}, "too large for this machine"),
    "width 1e9": ({"hidden_size": 10**9, "num_attention_heads": 1}, "too large"),
    "positions 1e12": ({"max_position_embeddings": 10**12}, "too large for this machine"),
    "MLP of 1e13": ({"intermediate_size": 10**13}, "too large for this machine"),
    "layers negative": ({"num_hidden_layers": -3}, "num_hidden_layers"),
    "layers text": ({"num_hidden_layers": "many"}, "num_hidden_layers"),
    "layers fractional": ({"num_hidden_layers": 2.5}, "num_hidden_layers"),
    "width true": ({"hidden_size": True}, "hidden_size"),
    "vocabulary 1e30 as a float": ({"vocab_size": 1e30}, "vocab_size"),
}


@pytest.mark.parametrize("name", list(HOSTILE_CONFIGS))
def test_a_hostile_config_is_refused_before_anything_is_built(ws, model_dir, name) -> None:
    changes, expect = HOSTILE_CONFIGS[name]
    hostile = _hostile(model_dir, ws.root.parent, "hostile", **changes)
    ws.inputs.append(hostile)
    ws.refused(["trace", "hello", "--model", str(hostile)], expect)


MEASURE = """
import sys, time
import transformers.models.bert  # imported by any load; not part of the refusal's cost
from identifiable.errors import IdentifiableError
from identifiable.models import load_model

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) << 10

rss = status("VmRSS:")
start = time.perf_counter()
try:
    load_model(sys.argv[1])
    print("LOADED")
except IdentifiableError as exc:
    print("REFUSED", exc)
print("SECONDS", time.perf_counter() - start)
print("GROWTH_MB", (status("VmHWM:") - rss) / 1e6)
"""


@pytest.mark.parametrize(
    "changes",
    [
        {"num_hidden_layers": 1_000_000},
        {"num_hidden_layers": 50_000, "hidden_size": 1024, "intermediate_size": 4096},
    ],
    ids=["1M layers", "50k wide layers"],
)
def test_the_million_layer_config_is_refused_in_2_s_and_200_mb(
    model_dir, tmp_path, changes
) -> None:
    """The issue's measure: peak resident memory (VmHWM) less the resident memory before the
    call, and the wall time of load_model, in a fresh process."""
    hostile = _hostile(model_dir, tmp_path, "hostile", **changes)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, str(hostile)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    found = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert "REFUSED" in found, proc.stdout
    print(f"{changes}: {float(found['SECONDS']):.3f} s, {float(found['GROWTH_MB']):.1f} MB")
    assert float(found["SECONDS"]) < 2.0
    assert float(found["GROWTH_MB"]) < 200.0


# ---- the estimate is a lower bound: no real model is refused ------------------------------


def _params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama", "t5", "bart", "vit", "mixtral"])
def test_the_estimate_never_exceeds_the_real_parameter_count(arch) -> None:
    import torch
    from transformers import AutoModel

    from helpers.families import tiny_config

    config = tiny_config(arch) if arch != "mixtral" else tiny_config("mixtral")
    with torch.device("meta"):
        model = AutoModel.from_config(config)
    estimate, layers = loading.estimate_size(config)
    assert 0.25 * _params(model) <= estimate <= _params(model), (estimate, _params(model))
    assert layers >= 2


def test_the_memory_verdict_follows_the_memory_available(monkeypatch, model_dir) -> None:
    """The same tiny model is refused when the memory left is just below its estimate, and
    loads when it is just above (so the check can neither always pass nor always fail)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    params, layers = loading.estimate_size(config)
    need = params * 4 + layers * (16 << 10)
    monkeypatch.setattr(loading, "available_memory", lambda: need - 1)
    with pytest.raises(IdentifiableError, match="too large for this machine"):
        loading.load_model(str(model_dir))
    monkeypatch.setattr(loading, "available_memory", lambda: need + 1)
    assert loading.load_model(str(model_dir)).info.n_layers == 2


def test_available_memory_is_bounded_by_the_address_space_limit() -> None:
    script = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30));"
        "from identifiable.models.loading import available_memory; print(available_memory())"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert 0 < int(proc.stdout) < 6 << 30


# ---- auto_map ------------------------------------------------------------------------------

EVIL = """
from pathlib import Path
Path(__file__).with_name("RAN").write_text("the repository's code ran")
from transformers import BertConfig, BertModel
class EvilConfig(BertConfig):
    pass
class EvilModel(BertModel):
    config_class = EvilConfig
"""


def _auto_map_folder(model_dir: Path, root: Path, model_type: str) -> Path:
    folder = _hostile(
        model_dir,
        root,
        f"automap-{model_type}",
        model_type=model_type,
        auto_map={"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"},
    )
    (folder / "evil.py").write_text(EVIL)
    return folder


def test_auto_map_with_a_known_model_type_loads_without_running_its_code(ws, model_dir) -> None:
    folder = _auto_map_folder(model_dir, ws.root.parent, "bert")
    outcome = ws.main(["trace", "hello world", "--model", str(folder)])
    assert outcome.code == 0, outcome.err
    warned = [line for line in outcome.err_lines if line.startswith("warning:")]
    assert len(warned) == 1 and "it is not run" in warned[0] and "'bert'" in warned[0]
    assert not (folder / "RAN").exists()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = loading.load_model(str(folder))
    assert any(issubclass(w.category, loading.RemoteCodeNotRun) for w in caught)
    assert type(model.hf_model).__module__.startswith("transformers.")
    assert not (folder / "RAN").exists()


def test_auto_map_with_an_unknown_model_type_is_refused(ws, model_dir) -> None:
    folder = _auto_map_folder(model_dir, ws.root.parent, "evil-bert")
    ws.inputs.append(folder)
    outcome = ws.refused(["trace", "hello", "--model", str(folder)], "needs its own modelling code")
    assert "trust_remote_code=True" in outcome.err and "--trust-remote-code" not in outcome.err
    assert not (folder / "RAN").exists()
    with pytest.raises(IdentifiableError, match="trust_remote_code=True"):
        loading.load_model(str(folder))
    assert not (folder / "RAN").exists()
