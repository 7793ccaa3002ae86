"""Global magnitude pruning of a model with 1 GB of fp32 weights: time and peak memory.

The benchmark writes an MLP of 16 Gemm layers of 4096x4096 fp32 (1.07 GB of weights) once, then
runs, in the same run and alternating, R rounds of
  * `lopper convert IN -o OUT`                                      (load + save: the floor)
  * `lopper prune IN -o OUT --method l1 --scope global --amount A`  (load + prune + save)
  * optionally torch: load the same weights into nn.Linear layers and call
    torch.nn.utils.prune.global_unstructured(L1Unstructured) + prune.remove (no ONNX I/O at all)
and reports median wall time and peak RSS (each child's own ru_maxrss, from wait4). The targets:
prune <= 2x convert in time, peak RSS <= 2.5x the weights' size.

Usage: bench/prune_speed.py --lopper build/lopper [--rounds 3] [--amount 0.9] [--torch]
       [--workdir /tmp/lopper-prune-speed] [--json docs/bench-prune-speed.json]
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

LAYERS, DIM = 16, 4096


def make_model(path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits = [], []
    x = "x"
    for i in range(LAYERS):
        w = (rng.standard_normal((DIM, DIM), dtype=np.float32) * 0.02).astype(np.float32)
        b = np.zeros(DIM, np.float32)
        inits += [numpy_helper.from_array(w, f"fc{i}.weight"), numpy_helper.from_array(b, f"fc{i}.bias")]
        y = f"h{i}"
        nodes.append(helper.make_node("Gemm", [x, f"fc{i}.weight", f"fc{i}.bias"], [y], name=f"/fc{i}/Gemm",
                                      transB=1))
        if i + 1 < LAYERS:
            nodes.append(helper.make_node("Relu", [y], [f"r{i}"], name=f"/relu{i}/Relu"))
            y = f"r{i}"
        x = y
    g = helper.make_graph(nodes, "mlp1g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, DIM])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, DIM])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="bench/prune_speed.py")
    tmp = path + ".tmp"
    onnx.save(m, tmp)
    os.replace(tmp, path)


def run_child(cmd):
    """Wall seconds and peak RSS (bytes) of one child process."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode()
    p.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(f"{' '.join(cmd)} failed ({code}): {err.strip()}")
    return wall, ru.ru_maxrss * 1024


TORCH_CHILD = r"""
import sys, onnx, torch, torch.nn as nn
from onnx import numpy_helper
import torch.nn.utils.prune as prune
from results import save_json  # bench/results.py
path, amount = sys.argv[1], float(sys.argv[2])
m = onnx.load(path)
layers = []
for t in m.graph.initializer:
    if t.name.endswith(".weight"):
        lin = nn.Linear(1, 1, bias=False)
        lin.weight = nn.Parameter(torch.from_numpy(numpy_helper.to_array(t).copy()), requires_grad=False)
        layers.append(lin)
del m
params = [(l, "weight") for l in layers]
prune.global_unstructured(params, pruning_method=prune.L1Unstructured, amount=amount)
for l in layers:
    prune.remove(l, "weight")
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lopper", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--amount", default="0.9")
    ap.add_argument("--threads", type=int, default=0, help="OMP threads for the children (0: all cores)")
    ap.add_argument("--torch", action="store_true", help="also time torch.nn.utils.prune on the same weights")
    ap.add_argument("--workdir", default="/tmp/lopper-prune-speed")
    ap.add_argument("--json")
    a = ap.parse_args()

    os.makedirs(a.workdir, exist_ok=True)
    model = os.path.join(a.workdir, "mlp1g.onnx")
    if not os.path.exists(model):
        print(f"writing {model} ({LAYERS} x {DIM}x{DIM} fp32) ...", flush=True)
        make_model(model)
    weight_bytes = LAYERS * DIM * DIM * 4
    out = os.path.join(a.workdir, "out.onnx")
    if a.threads:
        os.environ["OMP_NUM_THREADS"] = str(a.threads)

    runs = {"convert": [], "prune": [], "torch": []}
    cmds = {
        "convert": [a.lopper, "convert", model, "-o", out],
        "prune": [a.lopper, "prune", model, "-o", out, "--method", "l1", "--scope", "global", "--amount",
                  a.amount, "--json"],
        "torch": [sys.executable, "-c", TORCH_CHILD, model, a.amount],
    }
    for r in range(a.rounds):
        for name in ("convert", "prune") + (("torch",) if a.torch else ()):
            wall, rss = run_child(cmds[name])
            runs[name].append((wall, rss))
            print(f"round {r + 1}/{a.rounds} {name:8s} {wall:7.2f} s  peak RSS {rss / 2**30:5.2f} GiB", flush=True)

    def med(name, i):
        return statistics.median(x[i] for x in runs[name])

    res = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "weights_bytes": weight_bytes,
        "file_bytes": os.path.getsize(model),
        "amount": a.amount,
        "rounds": a.rounds,
    }
    print(f"\nweights {weight_bytes / 2**30:.2f} GiB, file {res['file_bytes'] / 2**30:.2f} GiB, "
          f"median of {a.rounds}")
    print(f"{'':10s} {'wall s':>8s} {'peak RSS GiB':>13s} {'RSS / weights':>14s}")
    for name in ("convert", "prune") + (("torch",) if a.torch else ()):
        w, m = med(name, 0), med(name, 1)
        res[name] = {"wall_s": round(w, 3), "peak_rss_bytes": int(m), "rss_over_weights": round(m / weight_bytes, 3)}
        print(f"{name:10s} {w:8.2f} {m / 2**30:13.2f} {m / weight_bytes:14.2f}")
    res["prune_over_convert"] = round(res["prune"]["wall_s"] / res["convert"]["wall_s"], 3)
    print(f"prune / convert time: {res['prune_over_convert']:.2f} (target <= 2); "
          f"prune peak RSS / weights: {res['prune']['rss_over_weights']:.2f} (target <= 2.5)")
    if a.json:
        save_json(a.json, res)


if __name__ == "__main__":
    main()
