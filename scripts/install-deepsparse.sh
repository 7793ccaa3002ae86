#!/usr/bin/env bash
# DeepSparse (Neural Magic's sparse CPU runtime) in its own venv, .venv-deepsparse, for
# bench/sparse_e2e.py's peer measurements. Never in .venv: deepsparse 1.8 pins onnx < 1.15 and
# numpy < 2, which the project's venv has moved past. Idempotent: re-installs only when the pins
# below change.
#
# Why these versions: deepsparse 1.9.0, the newest on PyPI, is an end-of-life stub (an sdist whose
# install step prints "'deepsparse' has reached end-of-life ... as of June 2025" and exits 1);
# 1.8.0 is the last release with the engine, wheels for CPython 3.8-3.11 on x86-64 Linux only
# (manylinux2014). The other pins are the set this was tested with (Debian 12, Python 3.11.2,
# AVX-512 CPU). DeepSparse needs an x86-64 CPU with AVX2 or AVX-512; it is free for evaluation
# under the Neural Magic DeepSparse Community License.
#
# Usage: scripts/install-deepsparse.sh          (DEEPSPARSE_PYTHON=/path/to/python3.X to choose)
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv-deepsparse
pins=(deepsparse==1.8.0 sparsezoo==1.8.1 onnx==1.14.1 numpy==1.26.4 protobuf==7.36.2 onnxruntime==1.31.1)

ok_python() {  # a python 3.8..3.11 with the venv module
  "$1" -c 'import sys, venv, ensurepip; sys.exit(not ((3, 8) <= sys.version_info[:2] <= (3, 11)))' 2>/dev/null
}

stamp=$venv/.pins
if [ -x $venv/bin/python ] && [ "$(cat $stamp 2>/dev/null)" = "${pins[*]}" ]; then
  echo "[install-deepsparse] $venv is up to date (${pins[*]})"
else
  py=""
  for c in "${DEEPSPARSE_PYTHON:-}" /usr/bin/python3 python3.11 python3.10 python3.9 python3.8 python3; do
    [ -n "$c" ] && command -v "$c" >/dev/null && ok_python "$c" && { py=$c; break; }
  done
  if [ -z "$py" ]; then
    echo "[install-deepsparse] no Python 3.8-3.11 with the venv module (deepsparse 1.8 has no wheels for others);" \
         "apt-get install python3-venv, or set DEEPSPARSE_PYTHON" >&2
    exit 1
  fi
  echo "[install-deepsparse] $venv from $py ($("$py" --version 2>&1)): ${pins[*]}"
  rm -rf $venv
  "$py" -m venv $venv
  echo '*' > $venv/.gitignore   # keep the venv out of git status
  $venv/bin/pip install --progress-bar off -q "${pins[@]}"
  echo "${pins[*]}" > $stamp
fi

# Smoke test: compile a Gemm + Relu model in the engine and check it against numpy.
NM_DISABLE_ANALYTICS=1 $venv/bin/python - <<'EOF'
import os, sys, tempfile
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
os.dup2(2, 1)  # the engine's banner goes to stderr
from deepsparse import __version__, compile_model

rng = np.random.default_rng(0)
w = rng.standard_normal((64, 32)).astype(np.float32)
w[np.abs(w) < 1.2] = 0  # ~77% zeros
g = helper.make_graph([helper.make_node("Gemm", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "smoke",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])],
                      [numpy_helper.from_array(w, "w")])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
m.ir_version = 8
with tempfile.TemporaryDirectory() as d:
    p = os.path.join(d, "smoke.onnx")
    onnx.save(m, p)
    e = compile_model(p, batch_size=1, num_cores=1)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    y = e.run([x])[0]
err = float(np.max(np.abs(y - np.maximum(x @ w, 0))))
sys.stderr.write(f"[install-deepsparse] deepsparse {__version__} runs: max |error| {err:.1e}\n")
sys.exit(err > 1e-3)
EOF
