"""One-shot LLM pruning quality: held-out perplexity, wall time and peak memory of
lopper's magnitude, Wanda and SparseGPT, with and without OWL, beside llm-compressor on the same
model and the same tokens.

The model is bench/llm_corpus.py's: a small LLaMA (LlamaForCausalLM, 4 layers, hidden 256, MLP 768,
byte vocabulary) trained by that script on Jane Austen's six novels (Debian's r-cran-janeaustenr),
cached in ~/.cache/lopper/llm-corpus/<key>/ after the first run (training: 700 steps, ~0.9 s each
on one core of the 2-core machine, ~10-13 minutes).
Calibration: 128 random windows of 128 tokens of the training split (calib.npy), as the papers
take 128 segments of training text. Held-out: every 10th chapter of each novel (heldout.npy).

Jobs: method (magnitude, wanda, sparsegpt) x amount (0.5, 0.6, 0.7 unstructured; 2:4) x OWL (off;
on: lambda 0.08, M 5, the OWL paper's defaults; unstructured only). Every Linear of the decoder
layers is pruned, lm_head is not (--exclude lm_head; the embedding is a Gather and not a target).
  lopper          `lopper prune model.onnx --method l1|wanda|sparsegpt --amount A | --pattern 2:4
                  --data tokens:calib.npy --batch-size 8 --calib-batches 16 --exclude lm_head
                  [--owl-lambda 0.08 --owl-m 5]` (magnitude is --method l1 and takes no data unless
                  OWL needs activations; sparsegpt adds --block-size 128 --dampening 0.01):
                  lopper_command() below is the one place that spells the invocation.
  llm-compressor  tests/python/llmc_reference.py under .venv-llmc (scripts/install-llmcompressor.sh):
                  oneshot with WandaPruningModifier / SparseGPTModifier (sequential pipeline, the
                  same 128 samples, batch 8, block 128, dampening 0.01, OWL's sparsity_profile),
                  on the same weights (the save_pretrained folder the ONNX file was exported from).
                  It has no one-shot magnitude pruner, so magnitude rows have no llm-compressor side.
Measured per job: the pruning process's wall time and peak RSS (os.wait4's rusage of that process:
lopper's whole run including reading and writing the ONNX file; llm-compressor's whole Python
process including its imports and the model load — its own oneshot() seconds are in the JSON as
llmc_oneshot_s). Perplexity: one evaluator for every row (llm_corpus.perplexity: PyTorch, the
dense model with the pruned weights loaded back by parameter name — from lopper's ONNX file through
names.json, from llm-compressor's npz by key), on --eval-windows held-out windows spread evenly
over the split (0: all of them).

What to look for (the papers' ordering): Wanda ~ SparseGPT << magnitude from 50% on, the gap
growing with sparsity; 2:4 between 50% and 60%; OWL's non-uniform layer budgets helping at 70%.

Usage:
  .venv/bin/python bench/llm_quality.py --lopper build/lopper [--methods magnitude,wanda,sparsegpt]
      [--amounts 0.5,0.6,0.7,2:4] [--owl off,on] [--no-llmc] [--quick] [--threads 2]
      [--eval-windows 1024] [--lopper-eval] [--keep DIR] [--out results.json]
  --quick: amounts 0.5 and 2:4, OWL off, 256 evaluation windows, unless given.
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import llm_corpus  # noqa: E402
from results import save_json  # noqa: E402  (bench/results.py)

LLMC_PYTHON = os.path.join(ROOT, ".venv-llmc", "bin", "python")
LLMC_REFERENCE = os.path.join(ROOT, "tests", "python", "llmc_reference.py")
METHODS = ["magnitude", "wanda", "sparsegpt"]
AMOUNTS = ["0.5", "0.6", "0.7", "2:4"]
OWL_LAMBDA, OWL_M = 0.08, 5
BATCH, CALIB_BATCHES = 8, 16  # 128 calibration samples
BLOCK, DAMPENING = 128, 0.01


def log(msg):
    print(f"[llm-quality] {msg}", file=sys.stderr, flush=True)


# NOTE: a child forked from this process starts with this process's resident set (torch, the model)
# counted in its peak RSS — Linux keeps the pre-exec high-water mark in ru_maxrss — so every job is
# started by a small launcher (python -S, ~10 MB) that forks, execs and reports the job's own wall
# time and os.wait4 rusage. /usr/bin/time -v gives the same figures.
_LAUNCHER = r"""
import json, os, sys, time
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    except OSError as e:
        print(f"{sys.argv[2]}: {e}", file=sys.stderr)
    os._exit(127)
_, status, ru = os.wait4(pid, 0)
wall = time.perf_counter() - t0
with open(sys.argv[1], "w") as f:
    json.dump(dict(rc=os.waitstatus_to_exitcode(status), wall_s=wall, maxrss_kib=ru.ru_maxrss), f)
"""


def run_measured(cmd, env=None):
    """Runs cmd; returns rc, stdout, stderr, wall_s and peak_rss_mb of that process alone (see the
    note above)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile(suffix=".json") as rep:
        p = subprocess.run([sys.executable, "-S", "-c", _LAUNCHER, rep.name, *cmd], stdout=out, stderr=err, env=env)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace")
        try:
            with open(rep.name) as f:
                r = json.load(f)
        except ValueError:
            sys.exit(f"[llm-quality] the launcher failed (exit {p.returncode}) on {' '.join(cmd)}:\n{stderr[-2000:]}")
    return dict(rc=r["rc"], stdout=stdout, stderr=stderr, wall_s=r["wall_s"],
                peak_rss_mb=r["maxrss_kib"] / 1024.0)  # Linux: ru_maxrss in KiB


def last_line(text):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return lines[-1] if lines else ""


def lopper_command(lopper, model, out, method, amount, owl, calib, threads):
    """The lopper invocation of one job (the one-shot CLI)."""
    cmd = [lopper, "prune", model, "-o", out, "--method", "l1" if method == "magnitude" else method]
    cmd += ["--pattern", amount] if ":" in amount else ["--amount", amount]
    if method != "magnitude" or owl:
        cmd += ["--data", f"tokens:{calib}", "--batch-size", str(BATCH), "--calib-batches", str(CALIB_BATCHES)]
    if method == "sparsegpt":
        cmd += ["--block-size", str(BLOCK), "--dampening", str(DAMPENING)]
    if owl:
        cmd += ["--owl-lambda", str(OWL_LAMBDA), "--owl-m", str(OWL_M)]
    cmd += ["--exclude", "lm_head", "--threads", str(threads), "--json"]
    return cmd


def llmc_command(hf_dir, calib, out, method, amount, owl):
    cmd = [LLMC_PYTHON, LLMC_REFERENCE, "--model-dir", hf_dir, "--ids", calib, "--method", method]
    if ":" in amount:
        n, m = (int(v) for v in amount.split(":"))
        cmd += ["--sparsity", str(1 - n / m), "--mask-structure", amount]
    else:
        cmd += ["--sparsity", amount]
    if method == "sparsegpt":
        cmd += ["--block-size", str(BLOCK), "--dampening", str(DAMPENING)]
    if owl:
        cmd += ["--owl-m", str(OWL_M), "--owl-lmbda", str(OWL_LAMBDA)]
    return cmd + ["--batch-size", str(BATCH), "--out", out]


def llmc_missing():
    """Why llm-compressor cannot run here, or None."""
    if not os.path.exists(LLMC_REFERENCE):
        return f"{os.path.relpath(LLMC_REFERENCE, ROOT)} is not there yet"
    if not os.path.exists(LLMC_PYTHON):
        return ".venv-llmc is not installed (scripts/install-llmcompressor.sh)"
    return None


class Evaluator:
    """The dense PyTorch model; each call loads a set of pruned weights over a fresh copy of the dense
    ones and returns held-out perplexity and the sparsity of what was pruned."""

    def __init__(self, info, windows, threads):
        import torch

        torch.set_num_threads(threads)
        self.model = llm_corpus.load_model(info["dir"])
        self.dense = {k: v.clone() for k, v in self.model.state_dict().items()}
        with open(info["names"]) as f:
            self.names = json.load(f)
        self.ids = llm_corpus.eval_subset(np.load(info["heldout"]), windows)

    def __call__(self, weights=None):
        self.model.load_state_dict(self.dense)
        if weights:
            llm_corpus.with_weights(self.model, weights)
        t0 = time.perf_counter()
        ppl = llm_corpus.perplexity(self.model, self.ids)
        layers = {n: p for n, p in self.model.named_parameters() if n.startswith("model.layers.") and p.ndim == 2}
        zeros = sum(int((p == 0).sum()) for p in layers.values()) / sum(p.numel() for p in layers.values())
        untouched = all(bool((self.model.state_dict()[n] == self.dense[n]).all())
                        for n in ("lm_head.weight", "model.embed_tokens.weight"))
        return dict(ppl=ppl, sparsity=zeros, head_and_embedding_untouched=untouched,
                    eval_s=time.perf_counter() - t0)


def run_lopper(a, info, job, work, evaluate):
    method, amount, owl = job
    out = os.path.join(work, f"lopper-{method}-{amount.replace(':', 'of')}-{'owl' if owl else 'uniform'}.onnx")
    cmd = lopper_command(a.lopper, info["onnx"], out, method, amount, owl, info["calib"], a.threads)
    r = run_measured(cmd)
    row = dict(cmd=" ".join(cmd), rc=r["rc"], wall_s=round(r["wall_s"], 2), peak_rss_mb=round(r["peak_rss_mb"], 1))
    if r["rc"] != 0:
        row["error"] = last_line(r["stderr"]) or last_line(r["stdout"])
        return row
    try:
        row["report"] = json.loads(r["stdout"])
    except ValueError:
        pass
    ev = evaluate(llm_corpus.onnx_weights(out, evaluate.names))
    row.update(ppl=ev["ppl"], sparsity=round(ev["sparsity"], 4), untouched=ev["head_and_embedding_untouched"])
    if a.lopper_eval:
        e = run_measured([a.lopper, "eval", out, "--data", f"tokens:{a.eval_ids}", "--json",
                          "--batch-size", "32", "--threads", str(a.threads)])
        row["lopper_eval_ppl"] = json.loads(e["stdout"]).get("perplexity") if e["rc"] == 0 else None
    if not a.keep:
        os.remove(out)
    return row


def run_llmc(a, info, job, work, evaluate):
    method, amount, owl = job
    if method == "magnitude":
        return dict(skipped="llm-compressor has no one-shot magnitude pruner")
    why = llmc_missing()
    if why:
        return dict(skipped=why)
    out = os.path.join(work, f"llmc-{method}-{amount.replace(':', 'of')}-{'owl' if owl else 'uniform'}.npz")
    cmd = llmc_command(info["hf"], info["calib"], out, method, amount, owl)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    r = run_measured(cmd, env)
    row = dict(cmd=" ".join(cmd), rc=r["rc"], wall_s=round(r["wall_s"], 2), peak_rss_mb=round(r["peak_rss_mb"], 1))
    if r["rc"] != 0:
        row["error"] = last_line(r["stderr"]) or last_line(r["stdout"])
        return row
    z = dict(np.load(out))
    row["oneshot_s"] = round(float(z["wall_s"]), 2)
    weights = {k: v for k, v in z.items() if ":" not in k and not k.endswith("_s")}
    ev = evaluate(weights)
    row.update(ppl=ev["ppl"], sparsity=round(ev["sparsity"], 4), untouched=ev["head_and_embedding_untouched"])
    if not a.keep:
        os.remove(out)
    return row


def fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) else "—"


def table(res):
    head = ["method", "amount", "OWL", "lopper ppl", "llm-compressor ppl", "lopper s", "llmc s",
            "lopper peak RSS MB", "llmc peak RSS MB"]
    lines = [f"dense: held-out perplexity {res['dense_ppl']:.3f} on {res['eval_windows']} windows "
             f"({res['eval_tokens']} predicted tokens); byte unigram {res['unigram_ppl']:.2f}", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for r in res["rows"]:
        lo, lc = r["lopper"], r["llmc"]
        if "error" in lo:
            notes.append(f"lopper {r['method']} {r['amount']} OWL {r['owl']}: {lo['error']}")
        if "error" in lc:
            notes.append(f"llm-compressor {r['method']} {r['amount']} OWL {r['owl']}: {lc['error']}")
        lines.append("| " + " | ".join([
            r["method"], r["amount"], "on" if r["owl"] else "off",
            fmt(lo.get("ppl"), ".3f") if "error" not in lo else "error",
            fmt(lc.get("ppl"), ".3f") if "error" not in lc else "error",
            fmt(lo.get("wall_s"), ".1f"), fmt(lc.get("wall_s"), ".1f"),
            fmt(lo.get("peak_rss_mb"), ".0f"), fmt(lc.get("peak_rss_mb"), ".0f")]) + " |")
    skipped = sorted({r["llmc"]["skipped"] for r in res["rows"] if "skipped" in r["llmc"]})
    return "\n".join(lines + [""] + [f"llm-compressor skipped: {s}" for s in skipped] + notes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lopper", default=os.path.join(ROOT, "build", "lopper"))
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--amounts", help="fractions and N:M patterns (default " + ",".join(AMOUNTS) + ")")
    ap.add_argument("--owl", help="off, on or off,on (the default; on: unstructured amounts only)")
    ap.add_argument("--no-llmc", action="store_true", help="lopper only")
    ap.add_argument("--quick", action="store_true",
                    help="defaults for a short run: amounts 0.5,2:4, OWL off, 256 evaluation windows")
    ap.add_argument("--threads", type=int, default=2, help="threads of the pruners and the evaluator (2)")
    ap.add_argument("--eval-windows", type=int, help="held-out windows evaluated, 0: all (default 1024)")
    ap.add_argument("--lopper-eval", action="store_true",
                    help="also `lopper eval` each lopper-pruned model on the same windows (its own perplexity)")
    ap.add_argument("--keep", default="", help="keep the pruned models in this folder")
    ap.add_argument("--out", default="", help="write the results here (JSON)")
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    quick = dict(amounts="0.5,2:4", owl="off", eval_windows=256) if a.quick else {}
    a.amounts = a.amounts or quick.get("amounts", ",".join(AMOUNTS))
    a.owl = a.owl or quick.get("owl", "off,on")
    a.eval_windows = a.eval_windows if a.eval_windows is not None else quick.get("eval_windows", 1024)
    methods = [m for m in a.methods.split(",") if m]
    amounts = [x for x in a.amounts.split(",") if x]
    owls = [{"off": False, "on": True}[o] for o in a.owl.split(",") if o]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        sys.exit(f"[llm-quality] unknown method {bad[0]}; one of {', '.join(METHODS)}")
    if not os.path.exists(a.lopper):
        sys.exit(f"[llm-quality] {a.lopper}: no such program (make build)")
    jobs = [(m, x, o) for m in methods for x in amounts for o in owls if not (o and ":" in x)]

    info = llm_corpus.prepare(threads=min(a.threads, 2))
    log(f"model {info['key']}: {info['onnx']}; dense held-out perplexity {info['dense_ppl']:.3f} "
        f"(all {info['heldout_windows']} windows)")
    work = a.keep or tempfile.mkdtemp(prefix="lopper-llm-quality-")
    os.makedirs(work, exist_ok=True)
    evaluate = Evaluator(info, a.eval_windows, a.threads)
    a.eval_ids = os.path.join(work, "eval_ids.npy")
    np.save(a.eval_ids, evaluate.ids)
    dense = evaluate()
    res = dict(model=dict((k, info[k]) for k in ("key", "onnx", "hf", "calib", "heldout", "config", "train",
                                                  "corpus")),
               dense_ppl=dense["ppl"], dense_ppl_all_windows=info["dense_ppl"], unigram_ppl=info["unigram_ppl"],
               eval_windows=int(len(evaluate.ids)), eval_tokens=int(evaluate.ids[:, 1:].size),
               settings=dict(batch_size=BATCH, calib_batches=CALIB_BATCHES, owl_lambda=OWL_LAMBDA, owl_m=OWL_M,
                             block_size=BLOCK, dampening=DAMPENING, threads=a.threads, exclude="lm_head"),
               env=dict(machine=platform.machine(), cpus=os.cpu_count(), python=platform.python_version(),
                        lopper=a.lopper, llmc=None if a.no_llmc else (llmc_missing() or LLMC_PYTHON)),
               rows=[])
    if a.lopper_eval:
        e = run_measured([a.lopper, "eval", info["onnx"], "--data", f"tokens:{a.eval_ids}", "--json",
                          "--batch-size", "32", "--threads", str(a.threads)])
        res["dense_lopper_eval_ppl"] = (json.loads(e["stdout"]).get("perplexity") if e["rc"] == 0
                                        else last_line(e["stderr"]))
    if not a.no_llmc and llmc_missing():
        log(f"llm-compressor skipped: {llmc_missing()}")
    for job in jobs:
        method, amount, owl = job
        log(f"{method} {amount} OWL {'on' if owl else 'off'}: lopper")
        lo = run_lopper(a, info, job, work, evaluate)
        log(f"  lopper: " + (lo.get("error") or f"ppl {lo['ppl']:.3f}, sparsity {lo['sparsity']:.3f}, "
                             f"{lo['wall_s']:.1f} s, {lo['peak_rss_mb']:.0f} MB"))
        lc = dict(skipped="--no-llmc") if a.no_llmc else run_llmc(a, info, job, work, evaluate)
        if "ppl" in lc or "error" in lc:
            log(f"  llm-compressor: " + (lc.get("error") or f"ppl {lc['ppl']:.3f}, sparsity {lc['sparsity']:.3f}, "
                                         f"{lc['wall_s']:.1f} s ({lc['oneshot_s']:.1f} s oneshot), "
                                         f"{lc['peak_rss_mb']:.0f} MB"))
        res["rows"].append(dict(method=method, amount=amount, owl=owl, lopper=lo, llmc=lc))
        if a.out:  # partial results survive an interrupted run
            save_json(a.out, res, indent=1)
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    res["table"] = table(res)
    print(res["table"])
    if a.out:
        save_json(a.out, res, indent=1)


if __name__ == "__main__":
    main()
