"""Data-driven features on transformers models as people export them (issue 18, item 1).

Token-ID data (tokens:IDS.npy with a derived or given mask, labels, further named inputs) and the
named-inputs form (npy:NAME=F.npy,...) feed GPT-2, a LLaMA-style LM, a BERT masked LM and a BERT
sequence classifier, exported by both exporters. Checked:
  - eval: the loss lopper reports is the loss computed here from ONNX Runtime's logits on the same
    batches (next-token cross-entropy for causal LMs, masked positions left out; cross-entropy for
    the classifier; token classification); perplexity is exp(loss); masked-LM is deterministic;
  - the named-inputs form gives the same figures as tokens:;
  - train/finetune lowers the training loss, and the trained model runs in ONNX Runtime;
  - prune with grad and taylor (calibrated on tokens), sensitivity, a target with data and
    --report run on each model, and what they write runs in ONNX Runtime;
  - bad data gets one line naming the problem and a non-zero exit.

usage: check_language_models.py LOPPER FIXTURES_DIR
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnxruntime as ort

LOPPER, FIX = sys.argv[1], sys.argv[2]
TMP = tempfile.mkdtemp(prefix="lopper-lm-")
N, T, VOCAB, PAD = 16, 16, 1000, 0
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        failures.append(what)


def lopper(*args, expect_ok=True):
    p = subprocess.run([LOPPER, *map(str, args)], capture_output=True, text=True)
    if expect_ok and p.returncode != 0:
        raise SystemExit(f"lopper {' '.join(map(str, args))} failed:\n{p.stderr}")
    return p


def path(name):
    return os.path.join(TMP, name)


def model(stem):
    return os.path.join(FIX, stem + ".onnx")


# --- the data -----------------------------------------------------------------------------------
rng = np.random.default_rng(0)
ids = rng.integers(1, VOCAB, size=(N, T), dtype=np.int64)
lengths = rng.integers(T // 2, T + 1, size=N)
lengths[0] = T
mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.int64)
ids[mask == 0] = PAD
types = np.zeros((N, T), dtype=np.int64)
types[:, T // 2:] = 1
seq_labels = rng.integers(0, 3, size=N, dtype=np.int64)
tok_labels = rng.integers(0, VOCAB, size=(N, T), dtype=np.int64)
tok_labels[mask == 0] = -100
for name, a in [("ids", ids), ("mask", mask), ("types", types), ("y", seq_labels),
                ("ytok", tok_labels), ("ids32", ids.astype(np.int32))]:
    np.save(path(name + ".npy"), a)
np.save(path("float_ids.npy"), ids.astype(np.float32))
TOKENS = f"tokens:{path('ids.npy')},pad={PAD}"


# --- the peer: losses from ONNX Runtime's logits ------------------------------------------------
def ort_logits(stem, feeds_of, batch):
    s = ort.InferenceSession(model(stem), providers=["CPUExecutionProvider"])
    names = [i.name for i in s.get_inputs()]
    outs = []
    for b in range(0, N, batch):
        f = {k: v[b:b + batch] for k, v in feeds_of.items() if k in names}
        outs.append(s.run(None, f)[0])
    return np.concatenate(outs)


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def ce(logits, labels):
    """Mean cross-entropy over the labels that are not -100; and top-1 accuracy."""
    logits, labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    keep = labels != -100
    lp = log_softmax(logits[keep].astype(np.float64))
    lab = labels[keep]
    return -lp[np.arange(len(lab)), lab].mean(), (lp.argmax(1) == lab).mean(), int(keep.sum())


def causal_targets():
    lab = np.where(mask == 1, ids, -100)
    return lab[:, 1:]


def close(a, b, rel=1e-4):
    return abs(a - b) <= rel * max(1.0, abs(b))


def lopper_eval(stem, data, *extra, batch=2):
    p = lopper("eval", model(stem), "--data", data, "--batch-size", batch, "--json", *extra)
    return json.loads(p.stdout)


CAUSAL = ["gpt2.ts", "gpt2.dynamo", "llama.ts", "llama.dynamo"]
feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}

# --- eval ---------------------------------------------------------------------------------------
for stem in CAUSAL:
    logits = ort_logits(stem, feeds, 2)
    want, top1, tokens = ce(logits[:, :-1], causal_targets())
    got = lopper_eval(stem, TOKENS)
    check(got["loss_kind"] == "causal-lm" and got["tokens"] == tokens,
          f"{stem}: eval takes token data as a causal LM ({got.get('tokens')} tokens, "
          f"{tokens} expected)")
    check(close(got["loss"], want), f"{stem}: next-token loss {got['loss']:.6f} = ORT's "
          f"{want:.6f}")
    check(close(got["perplexity"], np.exp(want)) and close(got["top1"], top1),
          f"{stem}: perplexity {got['perplexity']:.3f} and token top-1 match ORT's")

# The mask derived from pad= is the mask given by file, and int32 IDs are taken as they are.
a = lopper_eval("gpt2.ts", f"tokens:{path('ids.npy')},mask={path('mask.npy')}")
b = lopper_eval("gpt2.ts", f"tokens:{path('ids32.npy')},pad={PAD}")
c = lopper_eval("gpt2.ts", TOKENS)
# Each process times its own kernel choices, which round differently: "the same" is to 1e-6.
check(close(a["loss"], c["loss"], 1e-6) and close(b["loss"], c["loss"], 1e-6) and
      a["tokens"] == c["tokens"] == b["tokens"],
      "gpt2: mask=FILE, pad=ID and int32 IDs give the same loss")
# Without a mask every position counts.
d = lopper_eval("gpt2.ts", f"tokens:{path('ids.npy')}")
want, _, _ = ce(ort_logits("gpt2.ts", {"input_ids": ids, "attention_mask": np.ones_like(ids)},
                           2)[:, :-1], ids[:, 1:])
check(close(d["loss"], want) and d["tokens"] == N * (T - 1),
      "gpt2: without a mask, every next token counts (mask of ones)")

# Sequence classification: BERT with ids, mask and token types, dynamic axes.
for stem in ["bert_cls.ts", "bert_cls.dynamo"]:
    logits = ort_logits(stem, feeds, 4)
    want, top1, _ = ce(logits, seq_labels)
    data = f"tokens:{path('ids.npy')},pad={PAD},token_type_ids={path('types.npy')}," \
           f"labels={path('y.npy')}"
    got = lopper_eval(stem, data, batch=4)
    check(got["loss_kind"] == "cross-entropy" and close(got["loss"], want) and
          close(got["top1"], top1),
          f"{stem}: sequence classification loss {got['loss']:.6f} = ORT's {want:.6f}")
    named = f"npy:input_ids={path('ids.npy')},attention_mask={path('mask.npy')}," \
            f"token_type_ids={path('types.npy')},labels={path('y.npy')}"
    got2 = lopper_eval(stem, named, batch=4)
    check(close(got2["loss"], got["loss"], 1e-6) and close(got2["top1"], got["top1"], 1e-6),
          f"{stem}: npy:NAME=F.npy,... gives what tokens: gives ({got2['loss']!r} vs "
          f"{got['loss']!r})")
    # token_type_ids left out: derived as zeros.
    logits0 = ort_logits(stem, {**feeds, "token_type_ids": np.zeros_like(types)}, 4)
    want0, _, _ = ce(logits0, seq_labels)
    got3 = lopper_eval(stem, f"tokens:{path('ids.npy')},pad={PAD},labels={path('y.npy')}", batch=4)
    check(close(got3["loss"], want0), f"{stem}: token_type_ids not given are zeros")

# Token classification (labels per token) on a per-token head; masked-LM on BERT.
for stem in ["bert_mlm.ts", "bert_mlm.dynamo"]:
    logits = ort_logits(stem, feeds, 4)
    want, _, _ = ce(logits, tok_labels)
    got = lopper_eval(stem, f"tokens:{path('ids.npy')},pad={PAD},labels={path('ytok.npy')}",
                      batch=4)
    check(got["loss_kind"] == "token-classification" and close(got["loss"], want),
          f"{stem}: token classification loss {got['loss']:.6f} = ORT's {want:.6f}")
    mlm = lopper_eval(stem, TOKENS, "--loss", "masked-lm", "--mask-token", 3, batch=4)
    mlm2 = lopper_eval(stem, TOKENS, "--loss", "masked-lm", "--mask-token", 3, batch=4)
    live = int(mask.sum())
    check(close(mlm["loss"], mlm2["loss"], 1e-6) and mlm["tokens"] == mlm2["tokens"] and 0.05 * live < mlm["tokens"] < 0.3 * live and
          close(mlm["perplexity"], np.exp(mlm["loss"])),
          f"{stem}: masked-LM picks ~15% of {live} tokens ({mlm['tokens']}), the same each run")

# --- training -----------------------------------------------------------------------------------
for stem, data, extra in [
        ("gpt2.dynamo", TOKENS, []),
        ("llama.ts", TOKENS, []),
        ("bert_mlm.dynamo", TOKENS, ["--loss", "masked-lm", "--mask-token", "3"]),
        ("bert_cls.ts", f"tokens:{path('ids.npy')},pad={PAD},token_type_ids={path('types.npy')},"
                        f"labels={path('y.npy')}", [])]:
    out = path(stem + ".trained.onnx")
    p = lopper("finetune", model(stem), "-o", out, "--data", data, "--batch-size", 4,
               "--epochs", 3, "--optimizer", "adam", "--lr", "0.002", *extra)
    epochs = json.load(open(out + ".train.json"))["epochs"]
    losses = [e["loss"] for e in epochs]
    check(losses[-1] < losses[0], f"{stem}: finetune lowers the training loss {losses}")
    s = ort.InferenceSession(out, providers=["CPUExecutionProvider"])
    names = [i.name for i in s.get_inputs()]
    y = s.run(None, {k: v[:2] for k, v in feeds.items() if k in names})[0]
    check(np.isfinite(y).all(), f"{stem}: the fine-tuned model runs in ONNX Runtime")

# --- data-driven pruning ------------------------------------------------------------------------
for stem, data, extra in [
        ("gpt2.ts", TOKENS, []),
        ("llama.dynamo", TOKENS, []),
        ("bert_mlm.ts", TOKENS, ["--loss", "masked-lm", "--mask-token", "3"]),
        ("bert_cls.dynamo", f"tokens:{path('ids.npy')},pad={PAD},labels={path('y.npy')}", [])]:
    for method in ["taylor", "grad"]:
        out = path(f"{stem}.{method}.onnx")
        lopper("prune", model(stem), "-o", out, "--method", method, "--amount", 0.5,
               "--data", data, "--batch-size", 4, "--calib-batches", 2, *extra)
        r = json.load(open(out + ".report.json"))
        s = ort.InferenceSession(out, providers=["CPUExecutionProvider"])
        names = [i.name for i in s.get_inputs()]
        y = s.run(None, {k: v[:2] for k, v in feeds.items() if k in names})[0]
        check(0.45 < r["sparsity"] < 0.55 and np.isfinite(y).all(),
              f"{stem}: prune --method {method} on token data ({100 * r['sparsity']:.1f}%), "
              f"runs in ONNX Runtime")
    sens = path(stem + ".sens.json")
    lopper("sensitivity", model(stem), "--data", data, "--batch-size", 4, "--eval-batches", 2,
           "--amounts", "0.5,0.9", "-o", sens, *extra)
    sj = json.load(open(sens))
    check(len(sj["layers"]) > 0 and all(np.isfinite(p["loss"]) for l in sj["layers"]
                                        for p in l["points"]),
          f"{stem}: sensitivity on token data ({len(sj['layers'])} layers)")
    out = path(stem + ".target.onnx")
    rep = path(stem + ".report.html")
    lopper("prune", model(stem), "-o", out, "--target-params", 0.6, "--data", data,
           "--batch-size", 4, "--eval-batches", 2, "--report", rep, *extra)
    r = json.load(open(out + ".report.json"))
    html = open(rep).read()
    check("measured" in r["target"]["loss"] and np.isfinite(r["target"]["loss"]["measured"]) and
          len(html) > 1000, f"{stem}: a parameter target with token data and --report")

# The sensitivity sweep's base loss is the loss ONNX Runtime's logits give on its batches.
sj = json.load(open(path("gpt2.ts.sens.json")))
k = sj["samples"]
want, _, _ = ce(ort_logits("gpt2.ts", feeds, 2)[:k, :-1], causal_targets()[:k])
check(close(sj["base"]["loss"], want),
      f"gpt2.ts: sensitivity's base loss {sj['base']['loss']:.6f} = ORT's {want:.6f} ({k} samples)")

# --- bad data: one line, non-zero exit ----------------------------------------------------------
bad = [
    (["eval", model("gpt2.ts"), "--data", f"tokens:{path('float_ids.npy')}"], "must be integers"),
    (["eval", model("gpt2.ts"), "--data", f"tokens:{path('nope.npy')}"], "no such file"),
    (["eval", model("gpt2.ts"), "--data", f"tokens:{path('ids.npy')},pad=x"], "pad must be"),
    (["eval", model("gpt2.ts"), "--data", f"tokens:{path('ids.npy')},pad=0,mask="
      f"{path('mask.npy')}"], "both mask= and pad="),
    (["eval", model("gpt2.ts"), "--data", f"npy:input_ids={path('ids.npy')},"
      f"colour={path('mask.npy')}"], "'colour', which the model does not take"),
    (["eval", model("bert_mlm.ts"), "--data", TOKENS, "--loss", "masked-lm"], "--mask-token"),
    (["eval", model("bert_cls.ts"), "--data", f"tokens:{path('ids.npy')},"
      f"labels={path('ytok.npy')}"], "not per token"),
    (["eval", model("gpt2.ts"), "--data", TOKENS, "--loss", "perplexity"], "unknown loss"),
    (["eval", model("mlp.ts"), "--data", TOKENS], "input"),
]
for args, words in bad:
    p = lopper(*args, expect_ok=False)
    lines = p.stderr.strip().splitlines()
    check(p.returncode != 0 and len(lines) == 1 and words in p.stderr,
          f"bad data: {words!r} -> {p.stderr.strip()[:140]!r}")

if failures:
    print(f"\n{len(failures)} check(s) failed; the files are kept in {TMP}")
    sys.exit(1)
shutil.rmtree(TMP, ignore_errors=True)
print("\nall language-model checks passed")
