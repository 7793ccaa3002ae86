"""Unstructured sparsity end to end on CPU: does a pruned model run faster, and than whom?

Two models are built with torch (random weights, fixed seeds: speed only) and exported once
(TorchScript exporter, opset 17, static shapes) into a work dir:
  * bert-base-encoder: nn.TransformerEncoder, --layers (12) x TransformerEncoderLayer(d_model 768,
    12 heads, FFN 3072, GELU, dropout 0, batch_first), input [--batch, --seq, 768]. Exported with
    the MHA fast path off, so every attention in-proj, out-proj and FFN weight is an initializer
    read by a MatMul or Gemm (checked with onnx). Each parameter gets its own random values, as a
    trained BERT's layers have: the encoder deep-copies one layer, and the exporter would otherwise
    store the identical weights once, read by every layer through Identity nodes (lopper prunes
    such a weight once for all its readers, which would make the model one layer's weights).
  * mobilenet_v2: torchvision.models.mobilenet_v2(weights=None), input [1, 3, 224, 224].
and pruned with the lopper CLI:
  * bert-base-encoder: `lopper prune --method l1 --amount 0.9` (90% of every Gemm/MatMul weight,
    per layer);
  * mobilenet_v2: a recipe (written into the work dir) with one rule per 1x1 Conv (kernel 1x1,
    group 1, found in the ONNX graph), l1, amount 0.8; every other layer untouched;
  * bert-block8x1, mobilenet_v2-block8x1: the same with `--pattern block:8x1` (in the recipe:
    `pattern: "block:8x1"`), only when `lopper prune --help` lists a block pattern.

Then, in the same run, each dense and pruned file is timed on ONNX Runtime (in-process,
intra-op = --threads, inter-op 1, all graph optimisations), lopper (`lopper bench --json`, one
process per measurement) and DeepSparse when its venv exists (scripts/install-deepsparse.sh; a
worker process in that venv compiles every file once with num_cores = --threads). A measurement is
the median of --iters timed runs after --warmup; every (runtime, file) pair is measured once per
round, the order reversed every other round, and the reported figure is the median of the round
medians, so a slow spell of the shared machine hits every peer alike. Before timing, each runtime
runs every file once on the same input and its output is compared with ONNX Runtime's.
OpenVINO, where its venv exists (scripts/install-openvino.sh), times every file too, at its default
precision (bf16 on a CPU with bf16 arithmetic: the runtime a user of such a machine picks) and at
f32, one process per measurement (bench/openvino_peer.py; its outputs are not compared). --bf16
adds lopper at `--precision bf16`.

Ratios are speedups: "A vs B" = time(B) / time(A); above 1 means A is faster.

Usage: .venv/bin/python bench/sparse_e2e.py [--lopper build/lopper] [--threads N] [--quick]
       [--work DIR] [--rounds 3] [--iters 10] [--warmup 2] [--models bert,mobilenet_v2]
       [--deepsparse-python .venv-deepsparse/bin/python | --deepsparse-python ''] [--json PATH]
       [--openvino .venv-openvino/bin/python | none] [--bf16]
--quick: 2 encoder layers, 1 warm-up, 3 iters, 2 rounds; the JSON goes to --work or the temp dir, not
docs/ (under a minute).
"""

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import openvino_peer  # bench/openvino_peer.py
from results import cpu_model, git_rev, save_json  # bench/results.py
from timing import median_ms, round_ratio  # bench/timing.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BERT_AMOUNT, MOBILENET_AMOUNT = 0.9, 0.8
BLOCK = "block:8x1"


# --------------------------------------------------------------------------------------------
# DeepSparse worker: this same file, run by the DeepSparse venv's python (numpy + deepsparse only;
# torch and onnxruntime are imported in main() alone). One JSON request per stdin line, one JSON
# reply per line on the original stdout; whatever the engine prints goes to stderr.


def deepsparse_worker():
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    os.environ.setdefault("NM_DISABLE_ANALYTICS", "1")
    try:
        import deepsparse
        from deepsparse import compile_model
    except Exception as e:  # noqa: BLE001 - reported to the parent as the reason
        proto.write(json.dumps({"error": f"import deepsparse: {type(e).__name__}: {e}"}) + "\n")
        return
    proto.write(json.dumps({"version": deepsparse.__version__}) + "\n")
    engines = {}
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["cmd"] == "compile":
                t0 = time.perf_counter()
                e = compile_model(req["path"], batch_size=req["batch"], num_cores=req["cores"])
                engines[req["path"]] = e
                rep = {"compile_s": time.perf_counter() - t0,
                       "supported_ops": float(getattr(e, "fraction_of_supported_ops", float("nan")))}
            elif req["cmd"] == "run":
                y = engines[req["path"]].run([np.load(req["input"])])[0]
                np.save(req["output"], y)
                rep = {}
            elif req["cmd"] == "time":
                e, x = engines[req["path"]], [np.load(req["input"])]
                rep = {"median_ms": median_ms(lambda: e.run(x), req["warmup"], req["iters"])}
            else:
                rep = {"error": f"unknown command {req['cmd']}"}
        except Exception as ex:  # noqa: BLE001
            rep = {"error": f"{type(ex).__name__}: {ex}"}
        proto.write(json.dumps(rep) + "\n")


class DeepSparse:
    """The parent's end of the worker; `reason` says why it is not running (None: it is)."""

    def __init__(self, python, work):
        self.proc, self.version, self.reason = None, None, None
        if not python:
            self.reason = "not run: --deepsparse-python ''"
            return
        if not os.path.exists(python):
            self.reason = f"not run: {python} does not exist (scripts/install-deepsparse.sh sets it up)"
            return
        self.log = os.path.join(work, "deepsparse.log")
        env = dict(os.environ, NM_DISABLE_ANALYTICS="1")
        self.proc = subprocess.Popen([python, os.path.abspath(__file__), "--deepsparse-worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=open(self.log, "w"), text=True, env=env)
        hello = self._read()
        if "version" in hello:
            self.version = hello["version"]
        else:
            self.reason = "not run: " + hello.get("error", "no answer")
            self.close()

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            tail = open(self.log).read()[-2000:]
            return {"error": f"worker exited ({self.proc.poll()}): {tail.strip()}"}
        return json.loads(line)

    def ask(self, **req):
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        rep = self._read()
        if "error" in rep:
            raise RuntimeError(rep["error"])
        return rep

    def close(self):
        if self.proc:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
            self.proc = None


# --------------------------------------------------------------------------------------------


def export(model, x, path):
    import torch

    with torch.no_grad():
        torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17, input_names=["x"],
                          output_names=["y"])


def build_bert(path, layers, batch, seq):
    import onnx
    import torch
    import torch.nn as nn

    torch.backends.mha.set_fastpath_enabled(False)  # else one aten::_transformer_encoder_layer_fwd
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, activation="gelu", batch_first=True)
    model = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():  # BERT's init, but distinct per layer (see top)
            noise = torch.randn(p.shape, generator=g) * 0.02
            p.copy_(noise + 1 if name.endswith("norm1.weight") or name.endswith("norm2.weight") else noise)
    export(model, torch.randn(batch, seq, 768, generator=g), path)
    # Every Linear weight must reach a MatMul/Gemm as an initializer, or lopper cannot prune it.
    m = onnx.load(path, load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    read = [n for n in m.graph.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in inits]
    odd = {n.op_type for n in m.graph.node} & {"Attention", "MultiHeadAttention", "ATen"}
    if len(read) != 4 * layers or odd:
        sys.exit(f"bert export: {len(read)} MatMul/Gemm weights read from initializers "
                 f"(want {4 * layers}), fused ops {sorted(odd)}")
    return [batch, seq, 768]


def build_mobilenet(path):
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v2(weights=None).eval()
    export(model, torch.randn(1, 3, 224, 224), path)
    return [1, 3, 224, 224]


def pointwise_convs(path):
    """(node name, weight name) of every Conv whose weight initializer is [O, I, 1, 1], group 1."""
    import onnx

    g = onnx.load(path, load_external_data=False).graph
    dims = {i.name: list(i.dims) for i in g.initializer}
    out = []
    for n in g.node:
        if n.op_type != "Conv" or n.input[1] not in dims:
            continue
        group = next((a.i for a in n.attribute if a.name == "group"), 1)
        if dims[n.input[1]][2:] == [1, 1] and group == 1:
            out.append((n.name, n.input[1]))
    return out


def write_recipe(path, convs, amount, pattern):
    lines = [f"# bench/sparse_e2e.py: {amount:g} of each of the {len(convs)} 1x1 convolutions "
             f"(l1, {pattern}); every other layer matches no rule and stays dense.", "rules:"]
    for node, weight in convs:
        # match is searched in the node name and the weight name: anchor it on one of them.
        rx = "^" + re.escape(node or weight) + "$"
        lines.append(f"  - {{match: {json.dumps(rx)}, method: l1, amount: {amount}, "
                     f"pattern: {json.dumps(pattern)}}}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def lopper_prune(lopper, src, out, args):
    t0 = time.perf_counter()
    r = subprocess.run([lopper, "prune", src, "-o", out, "--json"] + args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"lopper prune {' '.join(args)}: {(r.stderr or r.stdout).strip()}")
    j = json.loads(r.stdout)
    pruned = [l for l in j["layers"] if not l.get("skipped")]
    params = sum(l["params"] for l in pruned)
    return {"args": " ".join(args), "prune_s": round(time.perf_counter() - t0, 2),
            "layers_pruned": len(pruned), "layers_seen": len(j["layers"]),
            # sparsity: of the pruned layers' weights; sparsity_prunable: of every Conv/Gemm/MatMul weight
            "sparsity": round(1 - sum(l["nonzero"] for l in pruned) / max(params, 1), 4),
            "params": j["params"], "nonzero": j["nonzero"], "sparsity_prunable": round(j["sparsity"], 4),
            "warnings": j.get("warnings", [])}


def lopper_bench(lopper, path, threads, warmup, iters, precision="fp32"):
    r = subprocess.run([lopper, "bench", path, "--json", "--threads", str(threads), "--warmup",
                        str(warmup), "--iters", str(iters), "--precision", precision],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"lopper bench {path}: {r.stderr.strip()}")
    return float(json.loads(r.stdout)["median_ms"])


def lopper_run(lopper, path, x_npy, out_dir, threads):
    os.makedirs(out_dir, exist_ok=True)
    r = subprocess.run([lopper, "run", path, "-i", f"x={x_npy}", "-o", out_dir, "--threads", str(threads)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"lopper run {path}: {r.stderr.strip()}")
    return np.load(os.path.join(out_dir, "y.npy"))


def rel_err(y, ref):
    return float(np.max(np.abs(y.astype(np.float64) - ref)) / max(float(np.max(np.abs(ref))), 1e-12))


def cpu_info():
    name, flags = platform.processor() or platform.machine(), []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and name in ("", platform.machine()):
                    name = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    have = line.split(":", 1)[1].split()
                    flags = [x for x in ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
                                         "amx_tile") if x in have]
                    break
    except OSError:
        pass
    return name, flags


def fmt(v, nd=2):
    return "-" if v is None else f"{v:.{nd}f}"


def main():
    if "--deepsparse-worker" in sys.argv:
        return deepsparse_worker()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lopper", default=os.path.join(ROOT, "build", "lopper"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--layers", type=int, help="encoder layers (12; --quick: 2)")
    ap.add_argument("--models", default="bert,mobilenet_v2")
    ap.add_argument("--rounds", type=int, help="rounds (3; --quick: 2)")
    ap.add_argument("--iters", type=int, help="timed runs a measurement (10; --quick: 3)")
    ap.add_argument("--warmup", type=int, help="untimed runs first (2; --quick: 1)")
    ap.add_argument("--quick", action="store_true", help="a smoke run in under a minute")
    ap.add_argument("--work", help="keep the models, recipes and outputs here (default: a temp dir)")
    default_ds = os.path.join(ROOT, ".venv-deepsparse", "bin", "python")
    ap.add_argument("--deepsparse-python", default=default_ds,
                    help="python of the DeepSparse venv ('' to skip; default %(default)s)")
    ap.add_argument("--openvino", default=openvino_peer.DEFAULT_PYTHON,
                    help="python of OpenVINO's venv ('none' to skip; default %(default)s)")
    ap.add_argument("--bf16", action="store_true", help="lopper at --precision bf16 too")
    ap.add_argument("--json", help="default docs/bench-sparse-e2e.json; --quick: bench-sparse-e2e.quick.json in "
                    "the work dir (--work) or the temp dir")
    a = ap.parse_args()
    q = a.quick
    a.layers = a.layers or (2 if q else 12)
    a.rounds = a.rounds or (2 if q else 3)
    a.iters = a.iters or (3 if q else 10)
    a.warmup = a.warmup if a.warmup is not None else (1 if q else 2)
    if not os.access(a.lopper, os.X_OK):
        sys.exit(f"{a.lopper} not found: build it first (make build)")

    import warnings

    warnings.filterwarnings("ignore")
    import onnxruntime as ort
    import torch
    import torchvision

    torch.set_num_threads(a.threads)
    work = a.work or tempfile.mkdtemp(prefix="lopper_sparse_e2e_")
    try:
        run(a, q, work, ort, torch, torchvision)
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)


def run(a, q, work, ort, torch, torchvision):
    os.makedirs(work, exist_ok=True)
    # The whole run times one binary, even if build/ is relinked meanwhile (its RUNPATH is absolute).
    lopper_src, a.lopper = a.lopper, os.path.join(work, "lopper")
    shutil.copy2(lopper_src, a.lopper)
    json_path = a.json or (os.path.join(a.work or tempfile.gettempdir(), "bench-sparse-e2e.quick.json") if q
                           else os.path.join(ROOT, "docs", "bench-sparse-e2e.json"))
    notes = []
    load_start = os.getloadavg()
    if load_start[0] > 0.5:
        notes.append(f"the machine was busy at the start (load average {load_start[0]:.2f}): timings of "
                     f"multi-threaded runtimes on a shared machine swing by multiples")
        print("note:", notes[-1], flush=True)
    help_text = subprocess.run([a.lopper, "prune", "--help"], capture_output=True, text=True).stdout
    has_block = re.search(r"block:(RxC|\d+x\d+)", help_text) is not None  # the --pattern syntax
    if not has_block:
        notes.append(f"`lopper prune --help` lists no block pattern: the {BLOCK} variants are skipped")
        print("note:", notes[-1], flush=True)

    # ---- build, export, prune -----------------------------------------------------------------
    # files: name -> {path, shape, model (the dense one it comes from), kind dense|sparse}
    files, prune_info = {}, {}
    for key in a.models.split(","):
        t0 = time.perf_counter()
        if key == "bert":
            name = "bert-base-encoder"
            src = os.path.join(work, name + ".onnx")
            shape = build_bert(src, a.layers, a.batch, a.seq)
            variants = [(name, ["--method", "l1", "--amount", str(BERT_AMOUNT)])]
            if has_block:
                variants.append(("bert-block8x1", ["--method", "l1", "--amount", str(BERT_AMOUNT),
                                                   "--pattern", BLOCK]))
        elif key == "mobilenet_v2":
            name = "mobilenet_v2"
            src = os.path.join(work, name + ".onnx")
            shape = build_mobilenet(src)
            convs = pointwise_convs(src)
            variants = []
            for vname, pattern in [(name, "unstructured")] + ([(name + "-block8x1", BLOCK)] if has_block else []):
                recipe = os.path.join(work, vname + ".recipe.yaml")
                write_recipe(recipe, convs, MOBILENET_AMOUNT, pattern)
                variants.append((vname, ["--recipe", recipe]))
        else:
            sys.exit(f"unknown model {key} (bert, mobilenet_v2)")
        print(f"exported {name} {shape} in {time.perf_counter() - t0:.1f}s -> {src}", flush=True)
        files[name + "/dense"] = dict(path=src, shape=shape, model=name, variant=name, kind="dense")
        for vname, args in variants:
            out = os.path.join(work, vname + ".pruned.onnx")
            try:
                info = lopper_prune(a.lopper, src, out, args)
            except RuntimeError as e:
                if vname == name:
                    sys.exit(str(e))
                notes.append(f"{vname} skipped: {e}")
                print("note:", notes[-1], flush=True)
                continue
            want = 4 * a.layers if key == "bert" else len(convs)
            if info["layers_pruned"] != want:
                sys.exit(f"{vname}: lopper pruned {info['layers_pruned']} layers, not the {want} meant")
            prune_info[vname] = info
            files[vname + "/sparse"] = dict(path=out, shape=shape, model=name, variant=vname, kind="sparse")
            print(f"pruned {vname}: {info['layers_pruned']}/{info['layers_seen']} layers, sparsity "
                  f"{info['sparsity']:.3f} of their weights, {info['prune_s']}s ({info['args']})", flush=True)

    # ---- runtimes -------------------------------------------------------------------------------
    rng = np.random.default_rng(0)
    inputs = {}
    for key, f in files.items():
        if f["model"] not in inputs:
            x = rng.standard_normal(f["shape"]).astype(np.float32)
            npy = os.path.join(work, f["model"] + ".input.npy")
            np.save(npy, x)
            inputs[f["model"]] = (x, npy)
        f["x"], f["npy"] = inputs[f["model"]]

    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sessions = {k: ort.InferenceSession(f["path"], so, providers=["CPUExecutionProvider"])
                for k, f in files.items()}

    ds = DeepSparse(a.deepsparse_python, work)
    runtimes = ["ort", "lopper"]
    ds_info = {}
    if ds.reason:
        print("DeepSparse", ds.reason, flush=True)
    else:
        print(f"DeepSparse {ds.version} from {a.deepsparse_python}", flush=True)
        runtimes.append("deepsparse")
        for k, f in files.items():
            try:
                rep = ds.ask(cmd="compile", path=f["path"], batch=f["shape"][0], cores=a.threads)
                ds_info[k] = {"compile_s": round(rep["compile_s"], 2),
                              "supported_ops": rep["supported_ops"]}
                print(f"deepsparse compiled {k} in {rep['compile_s']:.1f}s, "
                      f"{rep['supported_ops']:.3f} of its ops in the engine", flush=True)
            except RuntimeError as e:
                ds_info[k] = {"error": str(e)}
                print(f"deepsparse cannot compile {k}: {e}", flush=True)

    ov, ov_why = openvino_peer.resolve(a.openvino)
    ov_precision = {}
    if ov:
        runtimes += ["openvino", "openvino_f32"]
        print(f"OpenVINO {openvino_peer.version(ov)} from {ov}", flush=True)
    else:
        print("OpenVINO", ov_why, flush=True)
    if a.bf16:
        runtimes.append("lopper_bf16")

    def can(rt, k):
        return rt != "deepsparse" or "error" not in ds_info.get(k, {"error": ""})

    # ---- one run each on the same input: outputs against ONNX Runtime's ------------------------
    checks = {}
    for k, f in files.items():
        ref = sessions[k].run(None, {"x": f["x"]})[0].astype(np.float64)
        c = {"lopper": rel_err(lopper_run(a.lopper, f["path"], f["npy"], os.path.join(work, "out", k, "lopper"),
                                          a.threads), ref)}
        if "deepsparse" in runtimes and can("deepsparse", k):
            out = os.path.join(work, "out", k.replace("/", "_") + ".deepsparse.npy")
            try:
                ds.ask(cmd="run", path=f["path"], input=f["npy"], output=out)
                c["deepsparse"] = rel_err(np.load(out), ref)
            except RuntimeError as e:
                ds_info[k] = {"error": str(e)}
                print(f"deepsparse cannot run {k}: {e}", flush=True)
        checks[k] = c
        bad = [rt for rt, e in c.items() if e > 1e-3]
        print(f"check {k:32s} max |y - y_ort| / max |y_ort|: "
              + "  ".join(f"{rt} {e:.1e}" for rt, e in c.items()) + ("  MISMATCH " + ",".join(bad) if bad else ""),
              flush=True)
        if bad:
            notes.append(f"{k}: output differs from ONNX Runtime's ({', '.join(bad)})")

    # ---- timing: every (runtime, file) once a round, order reversed every other round ----------
    jobs = [(rt, k) for k in files for rt in runtimes if can(rt, k)]
    per_round = {j: [] for j in jobs}
    for r in range(a.rounds):
        for rt, k in (jobs if r % 2 == 0 else jobs[::-1]):
            f = files[k]
            if rt == "ort":
                s, x = sessions[k], f["x"]
                ms = median_ms(lambda: s.run(None, {"x": x}), a.warmup, a.iters)
            elif rt == "lopper":
                ms = lopper_bench(a.lopper, f["path"], a.threads, a.warmup, a.iters)
            elif rt == "lopper_bf16":
                ms = lopper_bench(a.lopper, f["path"], a.threads, a.warmup, a.iters, "bf16")
            elif rt.startswith("openvino"):
                prec = "f32" if rt == "openvino_f32" else "default"
                ms, _, ov_precision[rt], _ = openvino_peer.ms(ov, f["path"], f["shape"], prec,
                                                              a.threads, a.warmup, a.iters)
            else:
                ms = ds.ask(cmd="time", path=f["path"], input=f["npy"], warmup=a.warmup, iters=a.iters)["median_ms"]
            per_round[(rt, k)].append(ms)
            print(f"round {r + 1}/{a.rounds}  {rt:10s} {k:32s} {ms:9.2f} ms", flush=True)
            time.sleep(0.2)  # let the last runtime's spinning threads settle
    ds.close()
    med = {j: statistics.median(v) for j, v in per_round.items()}

    # ---- rows: one per pruned variant, with its dense peer ----------------------------------------
    rows = []
    for k, f in files.items():
        if f["kind"] != "sparse":
            continue
        d = f["model"] + "/dense"
        row = {"model": f["variant"], "dense_model": f["model"], "input": f["shape"],
               "pattern": BLOCK if "block" in f["variant"] else "unstructured",
               "prune": prune_info[f["variant"]]}
        for rt in runtimes:
            for kind, key in (("dense", d), ("sparse", k)):
                v = med.get((rt, key))
                row[f"{rt}_{kind}_ms"] = None if v is None else round(v, 2)
                row[f"{rt}_{kind}_rounds_ms"] = [round(x, 2) for x in per_round.get((rt, key), [])]
        row["check_rel_err"] = {"dense": checks[d], "sparse": checks[k]}
        if ds_info:
            row["deepsparse_compile"] = {"dense": ds_info.get(d), "sparse": ds_info.get(k)}

        def speedup(num, den):
            # the median of the rounds' ratios (runs made side by side), not a ratio of medians
            r = round_ratio(row.get(num[:-3] + "_rounds_ms"), row.get(den[:-3] + "_rounds_ms"))
            return None if r is None else round(r, 3)

        row["speedup"] = {
            "lopper_sparse_vs_ort_sparse": speedup("ort_sparse_ms", "lopper_sparse_ms"),
            "lopper_sparse_vs_lopper_dense": speedup("lopper_dense_ms", "lopper_sparse_ms"),
            "ort_sparse_vs_ort_dense": speedup("ort_dense_ms", "ort_sparse_ms"),
            "deepsparse_sparse_vs_deepsparse_dense": speedup("deepsparse_dense_ms", "deepsparse_sparse_ms"),
            "deepsparse_sparse_vs_lopper_sparse": speedup("lopper_sparse_ms", "deepsparse_sparse_ms"),
            # OpenVINO at its default precision on the dense model: what the pruned model must beat
            "lopper_sparse_vs_openvino_dense": speedup("openvino_dense_ms", "lopper_sparse_ms"),
            "lopper_bf16_sparse_vs_openvino_dense": speedup("openvino_dense_ms", "lopper_bf16_sparse_ms"),
            "lopper_sparse_vs_openvino_f32_sparse": speedup("openvino_f32_sparse_ms", "lopper_sparse_ms"),
            "lopper_bf16_sparse_vs_lopper_sparse": speedup("lopper_sparse_ms", "lopper_bf16_sparse_ms"),
        }
        rows.append(row)

    cpu, flags = cpu_info()
    ds_field = ds.reason or ds.version
    lopper_version = subprocess.run([a.lopper, "--version"], capture_output=True, text=True).stdout.strip()
    lopper_version += f" ({os.path.relpath(lopper_src, ROOT)}, built {time.strftime('%Y-%m-%d %H:%M', time.localtime(os.path.getmtime(a.lopper)))})"
    meta = {"machine": cpu, "isa": flags, "cpu": cpu_model(),
            "openvino": openvino_peer.version(ov) if ov else ov_why,
            "openvino_precision": ov_precision.get("openvino"), "cores": os.cpu_count(), "threads": a.threads,
            "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "torchvision": torchvision.__version__,
            "onnxruntime": ort.__version__, "deepsparse": ds_field, "deepsparse_python": a.deepsparse_python, "lopper": lopper_version,
            "git": git_rev(), "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d"), "loadavg_start": [round(x, 2) for x in load_start],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()], "quick": q, "encoder_layers": a.layers, "batch": a.batch,
            "seq": a.seq, "rounds": a.rounds, "iters": a.iters, "warmup": a.warmup,
            "bert_amount": BERT_AMOUNT, "mobilenet_1x1_amount": MOBILENET_AMOUNT,
            "speedup": "A vs B = time(B) / time(A), the median over rounds of each round's ratio; > 1: A is faster"}
    doc = {"meta": meta, "deepsparse": ds_field, "notes": notes, "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    save_json(json_path, doc, indent=1)

    have_ds = "deepsparse" in runtimes
    head = ["model", "pattern", "sparsity", "ORT dense ms", "ORT sparse ms", "lopper dense ms",
            "lopper sparse ms"]
    head += ["DeepSparse dense ms", "DeepSparse sparse ms"] if have_ds else []
    head += ["lopper sparse vs dense", "ORT sparse vs dense", "lopper vs ORT (sparse)"]
    head += ["DeepSparse sparse vs dense", "DeepSparse vs lopper (sparse)"] if have_ds else []
    print("\n| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        s = r["speedup"]
        cells = [r["model"], r["pattern"], f"{r['prune']['sparsity']:.2f}", fmt(r["ort_dense_ms"]),
                 fmt(r["ort_sparse_ms"]), fmt(r["lopper_dense_ms"]), fmt(r["lopper_sparse_ms"])]
        cells += [fmt(r["deepsparse_dense_ms"]), fmt(r["deepsparse_sparse_ms"])] if have_ds else []
        cells += [fmt(s["lopper_sparse_vs_lopper_dense"]), fmt(s["ort_sparse_vs_ort_dense"]),
                  fmt(s["lopper_sparse_vs_ort_sparse"])]
        cells += [fmt(s["deepsparse_sparse_vs_deepsparse_dense"]),
                  fmt(s["deepsparse_sparse_vs_lopper_sparse"])] if have_ds else []
        print("| " + " | ".join(cells) + " |")
    print(f"\nspeedups: A vs B = time(B) / time(A), > 1: A is faster. sparsity: of the pruned layers' weights.")
    print(f"{cpu} ({', '.join(flags)}), {os.cpu_count()} cores, {a.threads} threads; ORT {ort.__version__}, "
          f"torch {torch.__version__}, DeepSparse {ds_field}; {a.rounds} rounds x {a.iters} iters")
    if ov or a.bf16:
        print(f"\n| model | pattern | lopper sparse ms | lopper bf16 sparse ms | OpenVINO dense ms "
              f"({ov_precision.get('openvino', '-')}) | OpenVINO f32 sparse ms | lopper sparse vs "
              f"OpenVINO dense | lopper bf16 sparse vs OpenVINO dense | lopper bf16 vs fp32 (sparse) |")
        print("|" + "---|" * 9)
        for r in rows:
            s = r["speedup"]
            print(f"| {r['model']} | {r['pattern']} | {fmt(r['lopper_sparse_ms'])} | "
                  f"{fmt(r.get('lopper_bf16_sparse_ms'))} | {fmt(r.get('openvino_dense_ms'))} | "
                  f"{fmt(r.get('openvino_f32_sparse_ms'))} | {fmt(s['lopper_sparse_vs_openvino_dense'])} | "
                  f"{fmt(s['lopper_bf16_sparse_vs_openvino_dense'])} | "
                  f"{fmt(s['lopper_bf16_sparse_vs_lopper_sparse'])} |")
    for n in notes:
        print("note:", n)
    print(f"wrote {json_path}")


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as e:  # a lopper command that failed: its message, not a traceback
        sys.exit(f"error: {e}")
