"""Where a model's time goes in lopper and in OpenVINO, node by node, on the same ONNX file.

lopper's per-node times come from `lopper bench --profile --json` (the time each node of the graph
lopper runs took in the model, after its fusions), with the kernel each layer chose (`--explain`);
OpenVINO's from its own counters (bench/openvino_runner.py --profile, PERF_COUNT on), each executed
node with the kernel it ran (exec_type). Nodes are matched by the ONNX node name both keep: a node
lopper fused keeps its first node's name (`/layer1/layer1.0/conv1/Conv`), OpenVINO's convolutions
are named after their ONNX node (with `/WithoutBiases`); nodes either runtime adds (OpenVINO's
reorders, lopper's fused bodies) are listed unmatched, with their times, so the totals hold. The
two runs alternate for --rounds rounds and each node's time is its median over the rounds.

Per-node times are the figures inside one process; set side by side, they say which layers to look
at (the targets are set on whole-model times: compare_runtimes.py, structured.py). A shared
machine's phases can move whole runs by 10-50%, so only nodes measured in the same round compare.

Usage: .venv/bin/python bench/node_times.py MODEL.onnx --shape 1x3x224x224 [--lopper build/lopper]
       [--precision bf16|fp32] [--threads 2] [--rounds 3] [--iters 50] [--top 25]
       [--openvino .venv-openvino/bin/python] [--json out.json] [--depth 2]
--depth N sums the nodes of each block, named by the first N parts of their names
(/features/features.2 at 2): where lopper runs a block's layers as one fused body and OpenVINO as
several nodes, the blocks still compare.
--precision fp32 sets OpenVINO to f32; bf16 leaves OpenVINO at its default (bf16 where the CPU has
bf16 arithmetic).
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import openvino_peer  # noqa: E402  bench/openvino_peer.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lopper_nodes(a):
    """{node name: ms}, the model's median ms and {node name: chosen kernel} of one lopper run."""
    cmd = [a.lopper, "bench", a.model, "--precision", a.precision, "--threads", str(a.threads),
           "--iters", str(a.iters), "--profile", "--explain", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"node_times: lopper bench failed: {out.stderr.strip()[-400:]}")
    j = json.loads(out.stdout)
    times = {}
    for n in j.get("profile_nodes", []):
        name = re.sub(r" \([^()]*\)$", "", n["node"])  # "name (op)"
        times[name] = times.get(name, 0.0) + n["ms_per_run"]
    kernels = {d["node"]: d["chosen"] for d in j.get("kernels", {}).get("layers", [])}
    return times, j["median_ms"], kernels


def openvino_nodes(a, python):
    """{node name: ms}, the model's median ms and {node name: OpenVINO's kernel} of one run."""
    cmd = [python, os.path.join(ROOT, "bench", "openvino_runner.py"), a.model, "--shape", a.shape,
           "--precision", "f32" if a.precision == "fp32" else "default", "--threads",
           str(a.threads), "--iters", str(a.iters), "--profile"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"node_times: OpenVINO failed: {out.stderr.strip()[-400:]}")
    j = json.loads(out.stdout.strip().splitlines()[-1])
    times, kernels = {}, {}
    for r in j.get("profile", []):
        name = r["node"].replace("/WithoutBiases", "")
        times[name] = times.get(name, 0.0) + r["ms"]
        kernels[name] = r["exec_type"]
    return times, j["median_ms"], kernels, j.get("precision", "")


def by_block(times, kernels, depth):
    """times and kernels summed per block: a name's first `depth` parts ('/a/b/c' -> '/a/b' at 2);
    a block's kernels listed once each, by time."""
    def block(name):
        return "/".join(name.split("/")[:depth + 1]) if name.startswith("/") else name
    summed, spent = {}, {}
    for n, ms in times.items():
        summed[block(n)] = summed.get(block(n), 0.0) + ms
        k = kernels.get(n)
        if k:
            spent.setdefault(block(n), {})[k] = spent.get(block(n), {}).get(k, 0.0) + ms
    names = {b: "+".join(sorted(ks, key=lambda k: -ks[k])) for b, ks in spent.items()}
    return summed, names


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--shape", required=True, help="the first input's shape, e.g. 1x3x224x224")
    ap.add_argument("--lopper", default=os.path.join(ROOT, "build", "lopper"))
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--top", type=int, default=25, help="rows of the table (the largest gaps)")
    ap.add_argument("--openvino", default=openvino_peer.DEFAULT_PYTHON)
    ap.add_argument("--json", default="", help="write every node's times here")
    ap.add_argument("--depth", type=int, default=0,
                    help="sum each block's nodes, a block named by the first N parts of the names")
    a = ap.parse_args()
    if not os.path.isfile(a.model):
        sys.exit(f"node_times: no model at {a.model}")
    if not re.fullmatch(r"\d+(x\d+)*", a.shape):
        sys.exit(f"node_times: bad --shape '{a.shape}' (expected e.g. 1x3x224x224)")
    if a.rounds < 1 or a.iters < 1 or a.threads < 1:
        sys.exit("node_times: --rounds, --iters and --threads must be at least 1")
    if a.depth < 0:
        sys.exit("node_times: --depth must be 0 (each node) or more")
    python, why = openvino_peer.resolve(a.openvino)
    if python is None:
        sys.exit(f"node_times: OpenVINO {why}")
    if not os.path.isfile(a.lopper):
        sys.exit(f"node_times: no lopper at {a.lopper} (make build-cli)")

    lp_rounds, ov_rounds, lp_total, ov_total = [], [], [], []
    lp_kernels, ov_kernels, ov_precision = {}, {}, ""
    for r in range(a.rounds):
        t, total, lp_kernels = lopper_nodes(a)
        lp_rounds.append(t), lp_total.append(total)
        t, total, ov_kernels, ov_precision = openvino_nodes(a, python)
        ov_rounds.append(t), ov_total.append(total)
        print(f"[node-times] round {r + 1}: lopper {lp_total[-1]:.3f} ms, OpenVINO "
              f"{ov_total[-1]:.3f} ms ({ov_precision})", flush=True)

    def median_of(rounds):
        names = {n for t in rounds for n in t}
        return {n: statistics.median(t.get(n, 0.0) for t in rounds) for n in names}

    lp, ov = median_of(lp_rounds), median_of(ov_rounds)
    if a.depth:
        lp, lp_kernels = by_block(lp, lp_kernels, a.depth)
        ov, ov_kernels = by_block(ov, ov_kernels, a.depth)
    both = sorted(set(lp) & set(ov), key=lambda n: ov[n] - lp[n])
    print(f"\n{os.path.basename(a.model)}  {a.precision} (OpenVINO {ov_precision}), {a.threads} "
          f"threads, medians of {a.rounds} rounds: lopper {statistics.median(lp_total):.3f} ms, "
          f"OpenVINO {statistics.median(ov_total):.3f} ms")
    print(f"{'node':<52} {'lopper ms':>9} {'OpenVINO':>9} {'gap':>8}  lopper's kernel / OpenVINO's")
    for n in both[:a.top]:
        print(f"{n[-52:]:<52} {lp[n]:9.3f} {ov[n]:9.3f} {lp[n] - ov[n]:+8.3f}  "
              f"{lp_kernels.get(n, '-')} / {ov_kernels.get(n, '-')}")
    only_lp = sorted((n for n in lp if n not in ov), key=lambda n: -lp[n])
    only_ov = sorted((n for n in ov if n not in lp), key=lambda n: -ov[n])
    print(f"matched: lopper {sum(lp[n] for n in both):.3f} ms, OpenVINO "
          f"{sum(ov[n] for n in both):.3f} ms over {len(both)} nodes")
    print(f"lopper's own nodes ({len(only_lp)}): {sum(lp[n] for n in only_lp):.3f} ms, the largest: "
          + ", ".join(f"{n} {lp[n]:.3f}" for n in only_lp[:5]))
    print(f"OpenVINO's own nodes ({len(only_ov)}): {sum(ov[n] for n in only_ov):.3f} ms, the "
          "largest: " + ", ".join(f"{n} {ov[n]:.3f}" for n in only_ov[:5]))
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            json.dump({"model": a.model, "precision": a.precision, "openvino_precision": ov_precision,
                       "threads": a.threads, "rounds": a.rounds, "lopper_ms": lp_total,
                       "openvino_ms": ov_total, "lopper_nodes": lp, "openvino_nodes": ov,
                       "lopper_kernels": lp_kernels, "openvino_kernels": ov_kernels}, f, indent=1)
        os.replace(a.json + ".tmp", a.json)


if __name__ == "__main__":
    main()
