#!/usr/bin/env bash
# llm-compressor (vLLM's one-shot LLM compression library) in its own venv, .venv-llmc, the peer of
# tests/python/check_llm_parity.py (Wanda and SparseGPT, tests/python/llmc_reference.py). Never in
# .venv: llmcompressor 0.14.0.1 requires torch<=2.14.0 and transformers<=5.17.0 (>=5.15.0) and
# pins compressed-tensors==0.19.0; the project's venv has torch 2.14.1 and transformers 5.23.0.
# Idempotent: re-installs only when the pins below change.
#
# Why these versions: 0.14.0.1 is the newest llmcompressor on PyPI; torch and transformers are the
# newest its ranges allow; the rest are what pip resolved for it (Python 3.11). torch is PyPI's
# plain wheel (it pulls the CUDA 13 wheels, ~3 GB, shared with .venv as below; the checks run it on CPU).
#
# Usage: scripts/install-llmcompressor.sh          (LLMC_PYTHON=/path/to/python3.X to choose)
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv-llmc
pins=(llmcompressor==0.14.0.1 compressed-tensors==0.19.0 torch==2.14.0 transformers==5.17.0
      datasets==5.2.0 accelerate==1.15.0 auto-round==0.15.1 numpy==2.4.6)

# torch 2.14.0 here needs the same CUDA wheels (nvidia-*, cuda-*) and triton as .venv's torch 2.14.1:
# about 4 GB that need not be on disk twice. .venv-llmc sees .venv's copies through a folder of links
# (.venv/llmc-shared, put on its path by a .pth). pip counts them as installed outside the venv: it
# never removes them, and installs a copy of its own should a pin ever need another version.
py_main=.venv/bin/python
shared=.venv/llmc-shared
shared_dists=""
if [ -x $py_main ]; then
  site=$($py_main -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  rm -rf $shared && mkdir -p $shared
  for entry in "$site"/nvidia "$site"/nvidia_*.dist-info "$site"/cuda "$site"/cuda_*.dist-info \
               "$site"/triton "$site"/triton-*.dist-info; do
    [ -e "$entry" ] && ln -s "$entry" "$shared/"
  done
  shared_dists=$(cd $shared && ls -d ./*.dist-info 2>/dev/null | sort | tr '\n' ' ')
fi

stamp=$venv/.pins
want="${pins[*]} shared: $shared_dists"
if [ -x $venv/bin/python ] && [ "$(cat $stamp 2>/dev/null)" = "$want" ]; then
  echo "[install-llmcompressor] $venv is up to date (${pins[*]})"
else
  py=${LLMC_PYTHON:-python3}
  if ! "$py" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info[:2] < (3, 10))' 2>/dev/null
  then
    echo "[install-llmcompressor] $py is not a Python >= 3.10 with the venv module" \
         "(llmcompressor needs 3.10+): apt-get install python3-venv, or set LLMC_PYTHON" >&2
    exit 1
  fi
  echo "[install-llmcompressor] creating $venv from $py ($("$py" --version 2>&1)): ${pins[*]}" \
       "(about 2 GB beside .venv, a minute the first time)"
  rm -rf $venv
  "$py" -m venv $venv
  echo '*' > $venv/.gitignore   # keep the venv out of git status
  if [ -n "$shared_dists" ]; then
    "$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' |
      { read -r llmc_site; realpath $shared > "$llmc_site/lopper-shared.pth"; }
  fi
  $venv/bin/pip install --progress-bar off -q "${pins[@]}"
  echo "$want" > $stamp
fi

# Smoke test: the modifiers and oneshot import, offline.
# LLM_COMPRESSOR_LOG_DISABLED: its import warns that there is no GPU.
LLM_COMPRESSOR_LOG_DISABLED=true HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  $venv/bin/python - <<'EOF'
import sys
import llmcompressor, torch, transformers
from llmcompressor import oneshot
from llmcompressor.modifiers.pruning import WandaPruningModifier, SparseGPTModifier
sys.stderr.write(f"[install-llmcompressor] llmcompressor {llmcompressor.__version__} imports "
                 f"(torch {torch.__version__}, transformers {transformers.__version__})\n")
EOF
