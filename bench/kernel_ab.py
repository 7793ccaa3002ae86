"""Two kernel choices of one model, end to end, in one process taking turns.

Each of the two LOPPER_FORCE_KERNEL lists (a layer runs the first kernel of the list it has as a
candidate; a layer that has none of them chooses by timing) gets a lopper.InferenceSession of its
own, both in this process; round by round each session runs --calls times in turn, and the ratio
of B's time to A's is taken per round. On a shared machine whose phases move whole runs by 10-50%,
runs in separate processes cannot resolve a 1-2% difference; two sessions taking turns share each
phase.

Usage: PYTHONPATH=build/python .venv/bin/python bench/kernel_ab.py MODEL.onnx \\
           --a lopper-attention,onednn-direct --b lopper-attention,lopper-dense \\
           [--precision fp32|bf16] [--threads 2] [--rounds 300] [--calls 3]
The inputs are random, of the model's shapes (a symbolic dimension taken as 1); the kernel cache
is off (every choice timed anew).
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import cpu_model  # noqa: E402  bench/results.py

TYPES = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32,
         "tensor(bool)": np.bool_}


def feeds_for(session, rng):
    feeds = {}
    for i in session.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        if i.type not in TYPES:
            sys.exit(f"kernel_ab: input '{i.name}' of type {i.type}: not one this script makes")
        t = TYPES[i.type]
        feeds[i.name] = (rng.standard_normal(shape).astype(t) if t == np.float32
                         else np.ones(shape, dtype=t))
    return feeds


def quantile(v, q):
    s = sorted(v)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--a", required=True, help="LOPPER_FORCE_KERNEL list of the first session")
    ap.add_argument("--b", required=True, help="LOPPER_FORCE_KERNEL list of the second session")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--calls", type=int, default=3, help="runs a session makes a round")
    a = ap.parse_args()
    if a.rounds < 1 or a.calls < 1:
        sys.exit("kernel_ab: --rounds and --calls must be at least 1")
    if not os.path.isfile(a.model):
        sys.exit(f"kernel_ab: no model file '{a.model}'")
    try:
        import lopper
    except ImportError as e:
        sys.exit(f"kernel_ab: cannot import lopper ({e}); run with PYTHONPATH=build/python")
    os.environ["LOPPER_KERNEL_CACHE"] = "off"
    rng = np.random.default_rng(0)
    sessions = []
    for forced in (a.a, a.b):
        os.environ["LOPPER_FORCE_KERNEL"] = forced
        s = lopper.InferenceSession(a.model, threads=a.threads, precision=a.precision)
        feeds = feeds_for(s, rng)
        # the kernel choice, the trials in the model a default choice holds (1 + 2 x 4 calls), warm
        for _ in range(12):
            s.run(None, feeds)
        sessions.append((s, feeds))
    del os.environ["LOPPER_FORCE_KERNEL"]
    times = ([], [])
    for r in range(a.rounds):
        for i, (s, feeds) in enumerate(sessions):
            t0 = time.perf_counter()
            for _ in range(a.calls):
                s.run(None, feeds)
            times[i].append((time.perf_counter() - t0) / a.calls * 1000)
        if (r + 1) % 50 == 0:
            print(f"round {r + 1} of {a.rounds}", file=sys.stderr, flush=True)
    ratios = [b / x for x, b in zip(times[0], times[1])]
    print(f"{a.model}  {a.precision}  threads {a.threads}  {a.rounds} rounds  "
          f"{cpu_model()}")
    for name, t in zip(("A " + a.a, "B " + a.b), times):
        print(f"{name}: median {statistics.median(t):.3f} ms  min {min(t):.3f} ms")
    print(f"B / A per round: median {statistics.median(ratios):.3f}  "
          f"(quartiles {quantile(ratios, 0.25):.3f}, {quantile(ratios, 0.75):.3f})")


if __name__ == "__main__":
    main()
