"""lopper's one-shot LLM pruning (Wanda, SparseGPT) prunes what llm-compressor prunes.

Builds a tiny LLaMA (transformers LlamaForCausalLM: hidden 128, MLP 256, 2 layers, 4 heads, 2 KV
heads, vocabulary 512; seeded, float32), saves it with save_pretrained (WORKDIR/hf), exports it with
torch.onnx.export(dynamo=True) as people do (input_ids only, dynamic batch and sequence:
WORKDIR/model.onnx, checked against PyTorch in ONNX Runtime) and writes 16 sequences of 64 token IDs
(WORKDIR/ids.npy). Then, per case, prunes every Linear of the decoder layers (not lm_head) with
llm-compressor's oneshot (tests/python/llmc_reference.py in .venv-llmc, sequential pipeline, every
sequence a calibration sample) and with `lopper prune` on the same tokens, and compares the weights
by PyTorch parameter name (the export names the Linear weights val_N, transposed: its nodes'
metadata says which parameter each is):
  - wanda 0.5 unstructured, wanda 2:4: the masks (w == 0) are identical, and the weights kept are
    the original ones;
  - sparsegpt 2:4: the masks are identical and the weights equal within 1e-4 relative
    (max |a - b| / max |b| per weight);
  - sparsegpt 0.5 unstructured: measured, not checked: llm-compressor prunes per 128-column block
    `score <= sorted[int(numel * s)]`, one weight more per block than int(numel * s), where lopper
    prunes round(amount * count) of the layer, so the masks differ by design. The table shows the
    mask agreement and the largest relative difference.
A mask difference is allowed only where llm-compressor's own Wanda scores tie the threshold to float
rounding (1e-5 relative); such ties are counted in the table. Prints one table (case, weights
compared, mask agreement, max relative difference, seconds in lopper and in llm-compressor) and,
for a failed comparison, one line naming the weight; exits 1 then.

Without .venv-llmc (scripts/install-llmcompressor.sh, which install-deps.sh runs) it skips with one
line and exits 0, unless LOPPER_REQUIRE_LLMC is set (ctest sets it): then it fails.

Usage: check_llm_parity.py LOPPER WORKDIR
"""

import ast
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
LLMC_PYTHON = ROOT / ".venv-llmc" / "bin" / "python"
REFERENCE = ROOT / "tests" / "python" / "llmc_reference.py"

SAMPLES, TOKENS, VOCAB = 16, 64, 512
BATCH = 4
BLOCK, DAMPENING = 128, 0.01
WEIGHT_RTOL = 1e-4  # sparsegpt: max |a - b| / max |b| per weight
TIE_RTOL = 1e-5     # wanda: a mask may differ only where the scores tie the threshold this closely


@dataclass
class Case:
    name: str
    method: str        # wanda | sparsegpt
    pattern: str       # "0:0" (unstructured, --amount 0.5) | "2:4"
    checked: bool      # False: measured and printed only


CASES = [
    Case("wanda 0.5", "wanda", "0:0", True),
    Case("wanda 2:4", "wanda", "2:4", True),
    Case("sparsegpt 2:4", "sparsegpt", "2:4", True),
    Case("sparsegpt 0.5", "sparsegpt", "0:0", False),
]
AMOUNT = 0.5


def stem(case):
    return case.name.replace(" ", "_").replace(":", "of")


# ------------------------------------------------------------------------------------------------
# The model, its export and the tokens.

def make_model(workdir):
    import onnxruntime as ort
    import torch
    import transformers as T

    torch.manual_seed(0)
    cfg = T.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                        max_position_embeddings=128, use_cache=False)
    model = T.LlamaForCausalLM(cfg).float().eval()
    model.config._attn_implementation = "eager"  # what llmc_reference.py loads it with
    model.save_pretrained(workdir / "hf")

    ids = np.random.default_rng(0).integers(1, VOCAB, size=(SAMPLES, TOKENS), dtype=np.int64)
    np.save(workdir / "ids.npy", ids)

    # As tests/fixtures/make_models.py exports: torch.export-based, optimized, dynamic batch and
    # sequence. LlamaForCausalLM without a cache returns the logits alone.
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=128)
    example = torch.from_numpy(ids[:2, :16])
    program = torch.onnx.export(model, (example,), dynamo=True, input_names=["input_ids"],
                                output_names=["logits"], optimize=True, verbose=False,
                                dynamic_shapes={"input_ids": {0: batch, 1: seq}})
    path = workdir / "model.onnx"
    program.save(str(path))

    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(ids[:4])).logits.numpy()
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {"input_ids": ids[:4]})
    err = float(np.abs(got - want).max())
    if err > 1e-4:
        sys.exit(f"FAIL: the ONNX export's logits differ from PyTorch's by {err:.2e}")
    return {name: p.detach().numpy().copy() for name, p in model.named_parameters()}


# ------------------------------------------------------------------------------------------------
# Reading the Linear weights of an ONNX model by PyTorch parameter name.

def _meta(node, key):
    for p in node.metadata_props:
        if p.key == key:
            return p.value
    return ""


def param_of(node, weight):
    """The PyTorch parameter an exported MatMul/Gemm's weight came from: the initializer's own name
    where the exporter kept it, else from torch.export's metadata on the node (name_scopes: the
    modules, innermost last before the call itself; fx_node: the aten call naming p_<path>)."""
    if not (weight.startswith("val_") or weight.startswith("onnx::") or "/" in weight
            or weight.isdigit()):
        return weight
    scopes = _meta(node, "pkg.torch.onnx.name_scopes")
    if not scopes:
        return None
    scopes = ast.literal_eval(scopes)
    if len(scopes) < 2 or not scopes[-2]:
        return None
    param = scopes[-2] + ".weight"
    if "%p_" + param.replace(".", "_") not in _meta(node, "pkg.torch.onnx.fx_node"):
        return None
    return param


def linear_weights(path, fallback=None):
    """{parameter name: (initializer name, weight in PyTorch's [out, in] layout)} for every
    MatMul/Gemm whose weight is an initializer. fallback: {initializer name: parameter name}, for a
    model whose nodes lost their metadata (the same initializer names as the source)."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(path))
    inits = {t.name: t for t in m.graph.initializer}
    out = {}
    for node in m.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            continue
        w = node.input[1]
        if w not in inits:
            continue
        param = param_of(node, w) or (fallback or {}).get(w)
        if param is None:
            continue
        a = numpy_helper.to_array(inits[w])
        trans_b = node.op_type == "Gemm" and any(x.name == "transB" and x.i for x in node.attribute)
        out[param] = (w, a if trans_b else a.T)
    return out


# ------------------------------------------------------------------------------------------------
# The two sides.

def run_reference(workdir, case):
    """llm-compressor's pruned weights ({name: [out, in]}), its stats and its oneshot seconds."""
    out = workdir / f"{stem(case)}.llmc.npz"
    cmd = [str(LLMC_PYTHON), str(REFERENCE), "--model-dir", str(workdir / "hf"),
           "--ids", str(workdir / "ids.npy"), "--method", case.method, "--sparsity", str(AMOUNT),
           "--mask-structure", case.pattern, "--block-size", str(BLOCK),
           "--dampening", str(DAMPENING), "--batch-size", str(BATCH), "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-20:])
        sys.exit(f"FAIL: {case.name}: llmc_reference.py exited {r.returncode}:\n{tail}")
    z = dict(np.load(out))
    weights = {k: v for k, v in z.items() if ":" not in k and not k.endswith("_s")}
    return weights, z, float(z["wall_s"])


def run_lopper(lopper, workdir, case):
    """`lopper prune` on the same model and tokens: the path it wrote and its seconds."""
    out = workdir / f"{stem(case)}.onnx"
    cmd = [lopper, "prune", str(workdir / "model.onnx"), "-o", str(out), "--method", case.method]
    cmd += ["--amount", str(AMOUNT)] if case.pattern == "0:0" else ["--pattern", case.pattern]
    cmd += ["--data", f"tokens:{workdir / 'ids.npy'}", "--batch-size", str(BATCH),
            "--calib-batches", str(SAMPLES // BATCH), "--exclude", "lm_head"]
    if case.method == "sparsegpt":
        cmd += ["--block-size", str(BLOCK), "--dampening", str(DAMPENING)]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.time() - t0
    if r.returncode != 0:
        tail = (r.stderr.strip() or r.stdout.strip()).splitlines()[-1:] or [""]
        sys.exit(f"FAIL: {case.name}: lopper exited {r.returncode}: {tail[0]}\n  {' '.join(cmd)}")
    return out, seconds


# ------------------------------------------------------------------------------------------------
# Comparison.

def wanda_ties(case, w0, s, differ):
    """Whether every differing position ties llm-compressor's Wanda threshold to float rounding:
    its score |W| * sqrt(S) lies within TIE_RTOL of the boundary between the pruned and the kept
    scores of its comparison group (its row; for N:M, its group of M inputs in the row)."""
    score = np.abs(w0.astype(np.float64)) * np.sqrt(s.astype(np.float64))[None, :]
    rows, cols = score.shape
    if case.pattern == "0:0":
        groups, k = score, int(cols * AMOUNT)
        idx = lambda i, j: (i, slice(None))  # noqa: E731
    else:
        n, m = (int(x) for x in case.pattern.split(":"))
        groups, k = score.reshape(rows, cols // m, m), n
        idx = lambda i, j: (i, j // m, slice(None))  # noqa: E731
    for i, j in zip(*np.nonzero(differ)):
        g = np.sort(groups[idx(i, j)])
        lo, hi = g[k - 1], g[k]
        tol = TIE_RTOL * max(hi, 1e-30)
        if not (hi - lo <= tol and lo - tol <= score[i, j] <= hi + tol):
            return False
    return True


def compare(case, ref, stats, got, original):
    """(row for the table, failure line or None)."""
    names = sorted(ref)
    agree = total = ties = 0
    max_rel = 0.0
    failure = None
    for name in names:
        if name not in got:
            failure = failure or f"{case.name}: {name}: not among lopper's output's Linear weights"
            continue
        a, b = got[name][1], ref[name]
        if a.shape != b.shape:
            failure = failure or (f"{case.name}: {name}: shape {list(a.shape)} != "
                                  f"llm-compressor's {list(b.shape)}")
            continue
        ma, mb = a == 0, b == 0
        differ = ma != mb
        total += a.size
        agree += int((~differ).sum())
        rel = float(np.abs(a.astype(np.float64) - b).max() / max(np.abs(b).max(), 1e-30))
        if case.method == "wanda":
            kept = ~ma & ~mb
            if not np.array_equal(a[kept], original[name][kept]):
                failure = failure or f"{case.name}: {name}: lopper changed weights Wanda keeps"
            if differ.any():
                scalars = stats[f"scalars:{name}"]
                if case.checked and not wanda_ties(case, original[name], scalars, differ):
                    failure = failure or (f"{case.name}: {name}: {int(differ.sum())} of {a.size} "
                                          f"mask entries differ from llm-compressor's")
                else:
                    ties += int(differ.sum())
        else:
            if case.checked and differ.any():
                failure = failure or (f"{case.name}: {name}: {int(differ.sum())} of {a.size} mask "
                                      f"entries differ from llm-compressor's")
            elif case.checked and rel > WEIGHT_RTOL:
                failure = failure or (f"{case.name}: {name}: max |lopper - llm-compressor| / "
                                      f"max |llm-compressor| = {rel:.2e} > {WEIGHT_RTOL:g}")
        max_rel = max(max_rel, rel)
    return (len(names), agree / max(total, 1), max_rel, ties), failure


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.rsplit("Usage: ", 1)[1])
    lopper, workdir = sys.argv[1], Path(sys.argv[2])
    if not LLMC_PYTHON.exists():
        msg = f"{LLMC_PYTHON.parent.parent} is missing (scripts/install-llmcompressor.sh makes it)"
        if os.environ.get("LOPPER_REQUIRE_LLMC"):
            sys.exit(f"FAIL: {msg}")
        print(f"SKIP: {msg}")
        return
    workdir.mkdir(parents=True, exist_ok=True)
    original = make_model(workdir)
    src = linear_weights(workdir / "model.onnx")
    by_init = {init: param for param, (init, _) in src.items()}

    rows, failures = [], []
    for case in CASES:
        ref, stats, ref_s = run_reference(workdir, case)
        missing = sorted(set(ref) - set(src))
        if missing:
            sys.exit(f"FAIL: the export has no Linear weight for {missing[0]} (of {len(missing)})")
        out, lopper_s = run_lopper(lopper, workdir, case)
        got = linear_weights(out, fallback=by_init)
        (count, agreement, max_rel, ties), failure = compare(case, ref, stats, got, original)
        rows.append((case, count, agreement, max_rel, ties, lopper_s, ref_s))
        if failure:
            failures.append(failure)

    print(f"{'case':<16} {'weights':>7} {'mask agreement':>15} {'max rel diff':>13} {'ties':>5} "
          f"{'lopper s':>9} {'llm-compressor s':>17}  check")
    failed = {f.split(":")[0] for f in failures}
    for case, count, agreement, max_rel, ties, lopper_s, ref_s in rows:
        what = ("FAIL" if case.name in failed else "pass") if case.checked else "measured"
        print(f"{case.name:<16} {count:>7} {agreement:>15.6f} {max_rel:>13.2e} {ties:>5} "
              f"{lopper_s:>9.2f} {ref_s:>17.2f}  {what}")
    for case, _, agreement, max_rel, *_ in rows:
        if not case.checked:
            print(f"measurement: {case.name}: mask disagreement {1 - agreement:.6f}, "
                  f"max relative weight difference {max_rel:.2e} (llm-compressor prunes "
                  f"int(numel * s) + 1 per {BLOCK}-column block)")
    for f in failures:
        print(f"FAIL: {f}")
    if failures:
        sys.exit(1)
    print(f"{sum(c.checked for c in CASES)} cases agree with llm-compressor")


if __name__ == "__main__":
    main()
