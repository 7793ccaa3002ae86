"""Where a model loses time against ONNX Runtime: its prefixes up to given tensors, each timed in
both runtimes.

For every cut (a tensor name of the model) the model is cut after it (onnx.utils.extract_model,
from the graph's input to that tensor) and a GlobalAveragePool is appended, so that the prefix's
output is small and neither runtime pays for converting a large activation back to NCHW at the
end. Both runtimes take turns for --rounds rounds on the same file (ONNX Runtime in-process, intra-op
threads = T, inter-op 1; lopper through `lopper bench --json`, its own latency helper); each figure
is the median of the round medians. The difference between two consecutive prefixes is the cost of
the segment between the cuts (and of the pooling moving to a smaller map). ONNX Runtime's own
profiler adds a per-node cost that doubles or triples small models' times, so it cannot say this.

Usage: .venv/bin/python bench/prefix_compare.py --lopper build/lopper --model m.onnx \
           --cuts /stem/Relu_output_0,/layer1/Relu_output_0 [--threads 2] [--rounds 5] [--iters 50]
Cut names: the outputs of the model's nodes (`lopper inspect m.onnx` or onnx's graph).
"""

import argparse
import os
import sys
import tempfile

import numpy as np
import onnx
import onnx.helper
import onnx.utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from structured import lopper_ms, ort_ms, ort_session  # noqa: E402  bench/structured.py


def prefix(model_path, cut, out_path):
    """The model from its first input to `cut`, then GlobalAveragePool, saved to out_path."""
    m = onnx.load(model_path)
    inp = m.graph.input[0].name
    onnx.utils.extract_model(model_path, out_path, [inp], [cut])
    p = onnx.load(out_path)
    p.graph.node.append(onnx.helper.make_node("GlobalAveragePool", [cut], ["pooled"]))
    del p.graph.output[:]
    p.graph.output.append(onnx.helper.make_tensor_value_info("pooled", onnx.TensorProto.FLOAT, None))
    onnx.save(p, out_path)
    dims = [d.dim_value or 1 for d in m.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(0).standard_normal(dims).astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lopper", default="build/lopper")
    ap.add_argument("--model", required=True)
    ap.add_argument("--cuts", required=True, help="comma-separated tensor names")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=50)
    a = ap.parse_args()
    previous = None
    print(f"{'prefix up to':60s} {'lopper ms':>9s} {'ORT ms':>8s} {'ratio':>6s}   segment: lopper - ORT ms")
    with tempfile.TemporaryDirectory() as tmp:
        for i, cut in enumerate(c for c in a.cuts.split(",") if c):
            path = os.path.join(tmp, f"prefix{i}.onnx")
            x = prefix(a.model, cut, path)
            sess = ort_session(path, a.threads)
            lo, oo = [], []
            for _ in range(a.rounds):
                oo.append(ort_ms(sess, x, a.iters)[0])
                lo.append(lopper_ms(a.lopper, path, a.threads, a.iters)[0])
            l, o = float(np.median(lo)), float(np.median(oo))
            seg = "" if previous is None else f"{(l - previous[0]) - (o - previous[1]):+.3f}"
            print(f"{cut[-60:]:60s} {l:9.3f} {o:8.3f} {l / o:6.2f}   {seg}", flush=True)
            previous = (l, o)


if __name__ == "__main__":
    main()
