#!/usr/bin/env bash
# OpenVINO (Intel's CPU runtime, PyPI `openvino`) in its own venv, .venv-openvino, for the benches'
# peer measurements (bench/openvino_runner.py runs in it). Its own venv so that its pins never move
# the project's .venv. Idempotent: re-installs only when the pins below change. Not needed by the
# build or the tests.
#
# OpenVINO's default CPU precision is bf16 where the CPU has bf16 arithmetic (AMX, or AVX512_BF16:
# Intel Xeon with AMX and AMD EPYC Zen 4 alike), f32 elsewhere; the benches measure both.
#
# Usage: scripts/install-openvino.sh
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv-openvino
pins=(openvino==2026.4.1 numpy==2.3.5)

stamp=$venv/.pins
if [ -x $venv/bin/python ] && [ "$(cat $stamp 2>/dev/null)" = "${pins[*]}" ]; then
  echo "[install-openvino] $venv is up to date (${pins[*]})"
else
  echo "[install-openvino] $venv: ${pins[*]}"
  rm -rf $venv
  python3 -m venv $venv
  echo '*' > $venv/.gitignore   # keep the venv out of git status
  $venv/bin/pip install --progress-bar off -q "${pins[@]}"
  echo "${pins[*]}" > $stamp
fi

# Smoke test: a MatMul + Relu model compiled for the CPU at f32 against numpy.
$venv/bin/python - <<'PY'
import sys
import numpy as np
import openvino as ov
from openvino import opset13 as ops

rng = np.random.default_rng(0)
w = rng.standard_normal((64, 32)).astype(np.float32)
x = ops.parameter([1, 64], np.float32, name="x")
y = ops.relu(ops.matmul(x, ops.constant(w), False, False))
core = ov.Core()
c = core.compile_model(ov.Model([y], [x]), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
xv = rng.standard_normal((1, 64)).astype(np.float32)
err = float(np.max(np.abs(c({0: xv})[0] - np.maximum(xv @ w, 0))))
default = core.get_property("CPU", "INFERENCE_PRECISION_HINT")
sys.stderr.write(f"[install-openvino] openvino {ov.__version__} runs: max |error| {err:.1e}; its default "
                 f"CPU precision here: {default}\n")
sys.exit(err > 1e-3)
PY
