"""One OpenVINO timing, run in OpenVINO's own venv (scripts/install-openvino.sh) by the benches
that have it as a peer: compiles an ONNX file for the CPU at a precision and prints, as one JSON
line, the median and spread of the wall times of `iters` synchronous inferences on random input
after `warmup` (compilation not timed).

  precision  default: OpenVINO's own choice (bf16 where the CPU has bf16 arithmetic: AMX or
             AVX512_BF16), f32 or bf16: INFERENCE_PRECISION_HINT set.
  threads    INFERENCE_NUM_THREADS, with PERFORMANCE_HINT LATENCY (one stream).
  shape      the first input's shape (its dynamic batch set); other float inputs are not fed.
  inputs     instead of --shape: an .npz of every input by name (a decoding step's token, position
             and KV cache), the model reshaped to their shapes.

Usage: .venv-openvino/bin/python bench/openvino_runner.py MODEL.onnx (--shape 1x3x224x224 | --inputs X.npz)
       [--precision default|f32|bf16] [--threads 2] [--warmup 3] [--iters 20]
Prints {"median_ms": M, "spread": p90/median, "p10_ms", "p90_ms", "precision": "bf16" (what ran),
"version": "2026.4.1..."}. --profile adds "profile": per executed node of the last run, its name,
OpenVINO's kernel (exec_type, e.g. brgconv_avx512_1x1_bf16) and ms, to set beside
`lopper bench --profile` (the timed runs are then made with OpenVINO's counters on).
"""
import argparse
import json
import os
import sys

import numpy as np
import openvino as ov

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import median_spread, times_ms  # noqa: E402 (bench/timing.py: the same timing as the others)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--shape", help="the input's shape, e.g. 1x3x224x224")
    ap.add_argument("--inputs", help="an .npz of every input, by name")
    ap.add_argument("--precision", default="default", choices=["default", "f32", "bf16"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--profile", action="store_true", help="per-node times of the last run")
    a = ap.parse_args()
    core = ov.Core()
    model = core.read_model(a.model)
    if a.inputs:
        feeds = dict(np.load(a.inputs))
        model.reshape({name: list(x.shape) for name, x in feeds.items()})
    else:
        shape = [int(d) for d in a.shape.split("x")]
        model.reshape({model.inputs[0].get_any_name(): shape})
        feeds = {0: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    cfg = {"INFERENCE_NUM_THREADS": a.threads, "PERFORMANCE_HINT": "LATENCY"}
    if a.precision != "default":
        cfg["INFERENCE_PRECISION_HINT"] = a.precision
    if a.profile:
        cfg["PERF_COUNT"] = True
    compiled = core.compile_model(model, "CPU", cfg)
    request = compiled.create_infer_request()
    times = times_ms(lambda: request.infer(feeds), a.warmup, a.iters)
    med, spread = median_spread(times)
    precision = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()  # "bf16", "f32"
    out = {}
    if a.profile:
        out["profile"] = [{"node": i.node_name, "type": i.node_type, "exec_type": i.exec_type,
                           "ms": i.real_time.total_seconds() * 1e3}
                          for i in request.get_profiling_info() if i.status.name == "EXECUTED"]
    print(json.dumps({**out, "median_ms": med, "spread": spread, "p10_ms": float(np.percentile(times, 10)),
                      "p90_ms": float(np.percentile(times, 90)), "precision": precision,
                      "version": ov.__version__}))

if __name__ == "__main__":
    main()
