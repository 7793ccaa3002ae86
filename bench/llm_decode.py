"""One decoding step of a pruned LLaMA-style model on the CPU, batch 1: lopper's sparse kernels
against the dense model in lopper, ONNX Runtime and PyTorch.

The model is transformers' LlamaForCausalLM with TinyLlama-1.1B's width (hidden 2048, MLP 5632,
32 heads, 4 KV heads, vocabulary 32000) and --layers decoder layers (default 8: 0.54B parameters,
2.2 GB in float32, far beyond the CPU's caches), random init (seeded). It is pruned by lopper's
Wanda (every Linear, the LM head too) at 50% unstructured and at 2:4, on calibration tokens drawn
at random (the pattern matters for speed, not the tokens), and the pruned weights are put back into
the PyTorch model. Each variant is then exported as one decoding step with its KV cache as inputs:
input_ids [1, 1], position_ids [1, 1] and per layer past key and value [1, 4, P, 64] with a past of
--past tokens (default 256); outputs: the logits and the new cache.

Timed, one process each, in interleaved rounds (--rounds), the median per-token latency over
--iters steps after --warmup:
  lopper    `lopper bench STEP.onnx` on the dense, 50% and 2:4 steps, float32 and --precision bf16
            (lopper's kernel choice per layer: dense, CSR or the bitmask format);
  ORT       onnxruntime's InferenceSession on the dense step, float32;
  PyTorch   the dense model in bfloat16 under torch.inference_mode;
  OpenVINO  where its venv exists (scripts/install-openvino.sh), the dense step at its default
            precision (bf16 on a CPU with bf16 arithmetic) and at f32 (bench/openvino_peer.py).
The memory bandwidth is measured too (a read of 1 GiB, the same threads), and each variant's bytes
read per token (weights in the format lopper chose, plus the KV cache) over it gives the floor.

    .venv/bin/python bench/llm_decode.py [--layers 8] [--past 256] [--threads 2] [--rounds 3]
        [--openvino .venv-openvino/bin/python | none] [--out FILE.json]

The models are cached in ~/.cache/lopper/llm-decode (or $LOPPER_CACHE/llm-decode).
"""
import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_streaming import Logits  # noqa: E402  (the model without a cache: what calibration feeds)
import openvino_peer  # noqa: E402
from options import int_options  # noqa: E402
from timing import round_ratio  # noqa: E402
from results import cpu_model, save_json  # noqa: E402
from timing import times_ms  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable

CONFIG = dict(hidden_size=2048, intermediate_size=5632, num_attention_heads=32,
              num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096,
              tie_word_embeddings=False)


def log(msg):
    print(f"[llm-decode] {msg}", file=sys.stderr, flush=True)


def cache_root():
    base = os.environ.get("LOPPER_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                           "lopper")
    return os.path.join(base, "llm-decode")


def step_module(model, layers):
    """One decoding step: (input_ids, position_ids, past k/v per layer) -> (logits, new k/v)."""
    import torch
    import transformers as T

    class Step(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, position_ids, *past):
            cache = T.DynamicCache()
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.m(input_ids=input_ids, position_ids=position_ids, past_key_values=cache,
                         use_cache=True)
            res = [out.logits]
            for layer in out.past_key_values.layers:
                res += [layer.keys, layer.values]
            return tuple(res)

    return Step(model).eval()


def step_inputs(cfg, past, dtype=None):
    import torch

    g = torch.Generator().manual_seed(1)
    kv, hd = cfg["num_key_value_heads"], cfg["hidden_size"] // cfg["num_attention_heads"]
    ids = torch.randint(1, cfg["vocab_size"], (1, 1), generator=g)
    pos = torch.tensor([[past]])
    cache = [torch.randn(1, kv, past, hd, generator=g) for _ in range(2 * cfg["num_hidden_layers"])]
    if dtype is not None:
        cache = [c.to(dtype) for c in cache]
    return ids, pos, cache


def input_names(layers):
    return ["input_ids", "position_ids"] + [f"past_{kv}_{i}" for i in range(layers)
                                            for kv in ("key", "value")]


def export_step(model, cfg, past, path):
    import torch

    layers = cfg["num_hidden_layers"]
    ids, pos, cache = step_inputs(cfg, past)
    outs = ["logits"] + [f"present_{kv}_{i}" for i in range(layers) for kv in ("key", "value")]
    with torch.no_grad():
        torch.onnx.export(step_module(model, layers), (ids, pos, *cache), path + ".tmp.onnx",
                          dynamo=True, external_data=True, input_names=input_names(layers),
                          output_names=outs)
    # NOTE: the external data file is named after the temporary path; both renamed together.
    os.replace(path + ".tmp.onnx.data", path + ".tmp.data")
    import onnx

    m = onnx.load(path + ".tmp.onnx", load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = os.path.basename(path) + ".data"
    onnx.save(m, path + ".tmp.onnx")
    os.replace(path + ".tmp.data", path + ".data")
    os.replace(path + ".tmp.onnx", path)


def prepare(a):
    """The dense model and the pruned ones, each exported as a decoding step (cached)."""
    import numpy as np
    import torch
    import transformers as T

    cfg = dict(CONFIG, num_hidden_layers=a.layers)
    key = hashlib.sha256(json.dumps([cfg, a.past], sort_keys=True).encode()).hexdigest()[:12]
    d = os.path.join(cache_root(), f"llama-{a.layers}l-p{a.past}-{key}")
    steps = {v: os.path.join(d, f"step-{v}.onnx") for v in ("dense", "50", "2:4")}
    if all(os.path.exists(p) for p in steps.values()):
        return cfg, d, steps
    os.makedirs(d, exist_ok=True)
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(**cfg, attn_implementation="eager")).eval()
    log(f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters; exporting to {d}")
    if not os.path.exists(steps["dense"]):
        export_step(model, cfg, a.past, steps["dense"])
    # The model without a cache, for calibration: lopper prunes it by Wanda.
    prefill = os.path.join(d, "prefill.onnx")
    if not os.path.exists(prefill):
        ids = torch.randint(1, cfg["vocab_size"], (2, 16))
        with torch.no_grad():
            torch.onnx.export(Logits(model).eval(), (ids,), prefill, dynamo=True, external_data=True,
                              input_names=["input_ids"], output_names=["logits"],
                              dynamic_shapes={"input_ids": {0: torch.export.Dim("batch", min=1),
                                                            1: torch.export.Dim("seq", min=2,
                                                                                max=4096)}})
    tokens = os.path.join(d, "calib.npy")
    np.save(tokens, np.random.default_rng(0).integers(1, cfg["vocab_size"], (8, 128)))
    dense_state = {k: v.clone() for k, v in model.state_dict().items()}
    for variant, pattern in (("50", ["--amount", "0.5"]), ("2:4", ["--pattern", "2:4"])):
        if os.path.exists(steps[variant]):
            continue
        pruned = os.path.join(d, f"prefill-{variant.replace(':', '')}.onnx")
        cmd = [a.lopper, "prune", prefill, "-o", pruned, "--method", "wanda", *pattern,
               "--data", f"tokens:{tokens}", "--batch-size", "2", "--calib-batches", "4",
               "--threads", str(a.threads)]
        log(" ".join(cmd))
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        import onnx
        from onnx import numpy_helper

        # The exporter stores a Linear's weight under its own name: a MatMul's is [in, out], the
        # parameter's transpose (square ones too: their shape cannot tell); the report names
        # each weight's PyTorch parameter and its op.
        m = onnx.load(pruned, load_external_data=True)
        weights = {t.name: t for t in m.graph.initializer}
        with open(pruned + ".report.json") as fh:
            report = json.load(fh)
        model.load_state_dict(dense_state)
        params = dict(model.named_parameters())
        moved = 0
        with torch.no_grad():
            for layer in report["layers"]:
                name = layer["param"][2:] if layer["param"].startswith("m.") else layer["param"]
                w = torch.from_numpy(numpy_helper.to_array(weights[layer["weight"]]).copy())
                p = params[name]
                if layer["op"] == "MatMul" or w.shape != p.shape:
                    w = w.t()
                assert w.shape == p.shape, f"{layer['weight']} {tuple(w.shape)} for {name}"
                p.copy_(w)
                moved += 1
        assert moved == 7 * a.layers + 1, f"{moved} Linear weights found in {pruned}"
        del m, weights
        export_step(model, cfg, a.past, steps[variant])
        for f in (pruned, pruned + ".data"):
            if os.path.exists(f):
                os.remove(f)
    model.load_state_dict(dense_state)
    return cfg, d, steps


# --- Workers: one process per measurement ------------------------------------------------------

def worker_ort(path, layers, past, threads, warmup, iters):
    import numpy as np
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    ids, pos, cache = step_inputs(dict(CONFIG, num_hidden_layers=layers), past)
    feeds = dict(zip(input_names(layers), [t.numpy() for t in (ids, pos, *cache)]))
    return times(lambda: s.run(None, feeds), warmup, iters)


def worker_torch_bf16(layers, past, threads, warmup, iters):
    import torch
    import transformers as T

    torch.set_num_threads(threads)
    cfg = dict(CONFIG, num_hidden_layers=layers)
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(**cfg, attn_implementation="eager")).eval()
    model = model.to(torch.bfloat16)
    step = step_module(model, layers)
    ids, pos, cache = step_inputs(cfg, past, torch.bfloat16)
    with torch.inference_mode():
        return times(lambda: step(ids, pos, *cache), warmup, iters)


def times(fn, warmup, iters):
    t = times_ms(fn, warmup, iters)
    return {"median_ms": statistics.median(t), "p10_ms": t[len(t) // 10],
            "p90_ms": t[min(len(t) - 1, len(t) * 9 // 10)]}


def worker_bandwidth(threads):
    """Read bandwidth: the sum of 1 GiB of floats, best of 5."""
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(1 << 28)
    best = min(times(lambda: x.sum(), 1, 5)["p10_ms"] for _ in range(2))
    return {"read_gb_s": x.numel() * 4 / (best / 1000) / 1e9}


# --- The run -----------------------------------------------------------------------------------

def run_worker(args):
    out = subprocess.run([PY, __file__, "--worker", json.dumps(args)], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_lopper(a, path, precision):
    cmd = [a.lopper, "bench", path, "--threads", str(a.threads), "--warmup", str(a.warmup),
           "--iters", str(a.iters), "--json"]
    if precision == "bf16":
        cmd += ["--precision", "bf16"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def weight_bytes(path, dtype_bytes):
    """Bytes a step reads of its Linear weights: dense, or in the bitmask format (1/8 byte per
    weight plus each kept value)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    m = onnx.load(path, load_external_data=True)
    dense = sparse = 0
    for t in m.graph.initializer:
        if len(t.dims) != 2 or "embed" in t.name:  # the Linear weights (exported as val_N)
            continue
        w = numpy_helper.to_array(t)
        dense += w.size * dtype_bytes
        sparse += w.size / 8 + int(np.count_nonzero(w)) * dtype_bytes
    return dense, sparse


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lopper", default=os.path.join(ROOT, "build", "lopper"))
    int_options(ap, layers=8, past=256, threads=2, rounds=3, warmup=3, iters=20)
    ap.add_argument("--openvino", default=openvino_peer.DEFAULT_PYTHON,
                    help="the python of OpenVINO's venv; none: skip it")
    ap.add_argument("--out", default="")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        w = json.loads(a.worker)
        kind = w.pop("kind")
        res = {"ort": worker_ort, "torch_bf16": worker_torch_bf16,
               "bandwidth": worker_bandwidth}[kind](**w)
        print(json.dumps(res))
        return

    cfg, d, steps = prepare(a)
    jobs = [("lopper", v, p) for p in ("fp32", "bf16") for v in ("dense", "50", "2:4")]
    jobs += [("ort", "dense", "fp32"), ("torch", "dense", "bf16")]
    ov, why = openvino_peer.resolve(a.openvino)
    if ov:
        # The step's inputs (token, position, KV cache), as the ORT worker feeds them.
        import numpy as np

        ids, pos, cache = step_inputs(dict(CONFIG, num_hidden_layers=a.layers), a.past)
        feeds = os.path.join(os.path.dirname(steps["dense"]), f"step_inputs_{a.past}.npz")
        np.savez(feeds, **dict(zip(input_names(a.layers), [t.numpy() for t in (ids, pos, *cache)])))
        jobs += [("openvino", "dense", "default"), ("openvino", "dense", "f32")]
        log(f"OpenVINO {openvino_peer.version(ov)}")
    else:
        log(f"OpenVINO {why}")
    res = {f"{t} {v} {p}": [] for t, v, p in jobs}
    bw = run_worker({"kind": "bandwidth", "threads": a.threads})["read_gb_s"]
    log(f"read bandwidth {bw:.1f} GB/s")
    for r in range(a.rounds):
        for tool, variant, precision in jobs:
            name = f"{tool} {variant} {precision}"
            if tool == "lopper":
                m = run_lopper(a, steps[variant], precision)
            elif tool == "openvino":
                m = openvino_peer.measure(ov, steps[variant], precision, a.threads, a.warmup,
                                          a.iters, inputs=feeds)
            elif tool == "ort":
                m = run_worker({"kind": "ort", "path": steps[variant], "layers": a.layers,
                                "past": a.past, "threads": a.threads, "warmup": a.warmup,
                                "iters": a.iters})
            else:
                m = run_worker({"kind": "torch_bf16", "layers": a.layers, "past": a.past,
                                "threads": a.threads, "warmup": a.warmup, "iters": a.iters})
            res[name].append(m)
            log(f"round {r + 1}: {name}: {m['median_ms']:.2f} ms "
                f"(p10 {m['p10_ms']:.2f}, p90 {m['p90_ms']:.2f})")
    med = {k: statistics.median(m["median_ms"] for m in v) for k, v in res.items()}

    def ratio(num, den):  # the median of the rounds' ratios (runs made side by side)
        return round_ratio([m["median_ms"] for m in res[num]], [m["median_ms"] for m in res[den]])

    spread = {k: max(m["p90_ms"] / m["p10_ms"] for m in v) for k, v in res.items()}
    # Bytes per token: the weights (dense, or the bitmask format) and the KV cache read.
    kv = 2 * a.layers * cfg["num_key_value_heads"] * a.past * 64
    floor = {}
    for variant in ("dense", "50", "2:4"):
        for precision, eb in (("fp32", 4), ("bf16", 2)):
            dense_b, sparse_b = weight_bytes(steps[variant], eb)
            b = (dense_b if variant == "dense" else sparse_b) + kv * 4
            floor[f"{variant} {precision}"] = {"bytes": b, "floor_ms": b / (bw * 1e9) * 1000}
    ratios = {
        "ORT dense fp32 / lopper 50% fp32": ratio("ort dense fp32", "lopper 50 fp32"),
        "lopper dense fp32 / lopper 50% fp32": ratio("lopper dense fp32", "lopper 50 fp32"),
        "ORT dense fp32 / lopper 2:4 fp32": ratio("ort dense fp32", "lopper 2:4 fp32"),
        "lopper dense fp32 / lopper 2:4 fp32": ratio("lopper dense fp32", "lopper 2:4 fp32"),
        "PyTorch dense bf16 / lopper 50% bf16": ratio("torch dense bf16", "lopper 50 bf16"),
        "PyTorch dense bf16 / lopper 2:4 bf16": ratio("torch dense bf16", "lopper 2:4 bf16"),
        "lopper dense bf16 / lopper 50% bf16": ratio("lopper dense bf16", "lopper 50 bf16"),
    }
    if ov:  # the targets: the sparse step >= 1.5x OpenVINO's default on the dense one
        for v, label in (("50", "50%"), ("2:4", "2:4")):
            for p in ("fp32", "bf16"):
                ratios[f"OpenVINO dense default / lopper {label} {p}"] = ratio(
                    "openvino dense default", f"lopper {v} {p}")
    print(f"\nLLaMA {a.layers} layers (hidden 2048), one token, past {a.past}, batch 1, "
          f"{a.threads} threads; read bandwidth {bw:.1f} GB/s")
    print(f"{'job':<22} {'median ms':>10} {'spread':>7} {'floor ms':>9} {'of floor':>9}")
    for k in res:
        tool, variant, precision = k.split()
        prec = {"default": "bf16", "f32": "fp32"}.get(precision, precision)  # OpenVINO's names
        f = floor[f"{variant} {prec}"]["floor_ms"] if tool == "lopper" else floor[
            f"dense {prec}"]["floor_ms"]
        print(f"{k:<22} {med[k]:>10.2f} {spread[k]:>7.2f} {f:>9.2f} {f / med[k]:>8.0%}")
    for k, v in ratios.items():
        print(f"{k:<40} {v:.2f}x")
    if a.out:
        save_json(a.out, {"cpu": cpu_model(), "layers": a.layers, "past": a.past, "threads": a.threads,
                          "read_gb_s": bw, "median_ms": med, "spread": spread, "floor": floor,
                          "ratios": ratios, "runs": res}, indent=1)


if __name__ == "__main__":
    main()
