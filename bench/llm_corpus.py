"""The language model of the one-shot pruning quality benchmark (bench/llm_quality.py): corpus, tokenizer,
training, export and evaluation, all cached.

Corpus: Jane Austen's six completed novels (Sense and Sensibility, Pride and Prejudice, Mansfield
Park, Emma, Northanger Abbey, Persuasion; Project Gutenberg texts, public domain) as Debian ships
them in r-cran-janeaustenr (MIT; data/Rdata.rdb, R's lazy-load database). The package is fetched
with `apt-get download` and unpacked with `dpkg-deb -x` into the cache (R itself is not needed:
the .rdx index is a gzipped R serialization and each .rdb record a zlib-compressed one; the small
reader below decodes the character vectors, one line of text per element). An installed copy
(/usr/lib/R/site-library/janeaustenr) is used as is. 4.0 MB of English prose, 269 chapters.

Text: each novel is split into chapters at its "CHAPTER ..."/"Chapter ..." headings (the title
page goes with chapter 1); paragraphs are unwrapped (Gutenberg's hard line breaks become spaces,
one paragraph per line). Held-out split by document: every 10th chapter of each novel (its 10th,
20th, ...; 25 chapters, ~9% of the text) — the rest is the training split.
Tokenizer: bytes (UTF-8; vocab 256, no special tokens), so the model, the calibration ids and the
held-out ids need nothing but numpy to reproduce.

Model: transformers' LlamaForCausalLM (RMSNorm, rotary, SwiGLU, untied lm_head), CONFIG below,
trained from a seeded init with AdamW (TRAIN below: cosine LR with linear warmup, batches of random
windows of the training split). Everything lands in CACHE/<key>/, key = hash of the corpus bytes,
the tokenizer, CONFIG and TRAIN, so changing any of them trains a new model:
  hf/                 save_pretrained (config.json + model.safetensors): what llm-compressor loads
  model.onnx          torch.onnx.export(dynamo=True), input "input_ids" [batch, seq] (both dynamic),
                      output "logits"; checked against PyTorch in ONNX Runtime
  names.json          {initializer: [PyTorch parameter name, transposed]}: the exporter keeps the
                      embedding's and the norms' names but stores each Linear weight as val_N,
                      transposed; its nodes' metadata names the parameter (export_onnx)
  calib.npy           int64 [128, 128]: 128 random windows of the training split (the papers'
                      calibration set: 128 random segments of training text), seeded
  heldout.npy         int64 [N, 128]: the held-out split cut into consecutive non-overlapping windows
  train_log.json      the training run: loss curve, held-out perplexity on the way, seconds
  train.json          all of the above's paths, the configuration, the dense model's perplexity
Perplexity = exp(mean next-token cross-entropy) over the held-out windows (each window on its own;
the first token of a window is context only), in PyTorch by `perplexity` below — one evaluator for
the dense model and for every pruned one (lopper's, loaded back through names.json from its ONNX
file — lopper keeps initializer names; llm-compressor's, from its npz keyed by parameter name).

Usage: .venv/bin/python bench/llm_corpus.py [--threads 1] [--force]   # prepares, prints the paths
Cache root: $LOPPER_CACHE or ~/.cache/lopper (this module uses its llm-corpus/ folder).
"""

import argparse
import glob
import gzip
import hashlib
import json
import math
import os
import re
import struct
import subprocess
import sys
import time
import zlib

import numpy as np
from results import save_json  # bench/results.py

CACHE = os.path.join(os.path.expanduser(os.environ.get("LOPPER_CACHE", "~/.cache/lopper")), "llm-corpus")
PACKAGE = "r-cran-janeaustenr"
INSTALLED = "/usr/lib/R/site-library/janeaustenr/data/Rdata"
NOVELS = ["sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey", "persuasion"]
HELDOUT_EVERY = 10  # every 10th chapter of each novel is held out

SEQ = 128
CONFIG = dict(vocab_size=256, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=SEQ,
              rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
              attention_bias=False, mlp_bias=False)
TRAIN = dict(steps=700, batch=32, seq=SEQ, lr=2e-3, warmup=50, min_lr_frac=0.1, weight_decay=0.1,
             betas=(0.9, 0.95), clip=1.0, seed=0)
CALIB = dict(samples=128, seq=SEQ, seed=1)
VERSION = 1  # bump when the text extraction or the training loop changes


def log(msg):
    print(f"[llm-corpus] {msg}", file=sys.stderr, flush=True)


# --- the corpus: Debian's r-cran-janeaustenr -----------------------------------------------------

class _RReader:
    """Just enough of R's XDR serialization (R Internals, "Serialization formats") for the lazy-load
    index (a named list of integer vectors) and character vectors."""

    def __init__(self, b):
        if b[:2] != b"X\n":
            raise ValueError("not an XDR R serialization")
        self.b, self.p, self.refs = b, 2, []
        version = self.int()
        self.int(), self.int()  # writer's R version, minimal reader version
        if version == 3:
            n = self.int()  # the native encoding's name follows
            self.p += n

    def int(self):
        v = struct.unpack_from(">i", self.b, self.p)[0]
        self.p += 4
        return v

    def item(self):
        flags = self.int()
        t, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if t in (254, 253, 242, 241, 251, 252, 247):  # NULL, environments, missing, unbound
            return None
        if t == 255:  # reference to an earlier symbol
            k = flags >> 8 or self.int()
            return self.refs[k - 1]
        if t == 1:  # symbol: its name follows as a CHARSXP
            s = ("sym", self.item())
            self.refs.append(s)
            return s
        if t == 9:  # CHARSXP
            n = self.int()
            if n == -1:
                return None
            raw = self.b[self.p:self.p + n]
            self.p += n
            levels = flags >> 12
            return raw.decode("latin-1") if levels & 4 else raw.decode("utf-8", "replace")
        if t in (2, 6):  # pairlist / call: attributes, tag, car, cdr
            if has_attr:
                self.item()
            tag = self.item() if has_tag else None
            car, cdr = self.item(), self.item()
            d = {(tag[1] if tag else None): car}
            if isinstance(cdr, dict):
                d.update(cdr)
            return d
        if t in (16, 19, 20):  # character vector, list, expression
            v = [self.item() for _ in range(self.int())]
        elif t in (10, 13):  # logical, integer
            n = self.int()
            v = list(struct.unpack_from(f">{n}i", self.b, self.p))
            self.p += 4 * n
        elif t == 14:  # double
            n = self.int()
            v = list(struct.unpack_from(f">{n}d", self.b, self.p))
            self.p += 8 * n
        else:
            raise ValueError(f"R serialization: SEXP type {t} is not supported by this reader")
        if has_attr:
            attrs = self.item()
            if t == 19 and isinstance(attrs, dict) and "names" in attrs:
                return dict(zip(attrs["names"], v))
        return v


def _read_lazyload(base):
    """{name: value} of an R lazy-load database (base.rdx + base.rdb)."""
    with gzip.open(base + ".rdx") as f:
        index = _RReader(f.read()).item()
    with open(base + ".rdb", "rb") as f:
        rdb = f.read()
    out = {}
    for name, (off, length) in index["variables"].items():
        rec = rdb[int(off):int(off) + int(length)]
        out[name] = _RReader(zlib.decompress(rec[4:])).item()  # 4 bytes: uncompressed length
    return out


def _fetch_package():
    """The path prefix of janeaustenr's Rdata.{rdx,rdb}: installed, or unpacked into the cache."""
    if os.path.exists(INSTALLED + ".rdb"):
        return INSTALLED
    root = os.path.join(CACHE, "deb")
    base = os.path.join(root, "root", INSTALLED.lstrip("/"))
    if os.path.exists(base + ".rdb"):
        return base
    os.makedirs(root, exist_ok=True)
    log(f"apt-get download {PACKAGE} into {root}")
    r = subprocess.run(["apt-get", "download", PACKAGE], cwd=root, capture_output=True, text=True)
    debs = sorted(glob.glob(os.path.join(root, f"{PACKAGE}_*.deb")))
    if r.returncode != 0 or not debs:
        sys.exit(f"[llm-corpus] apt-get download {PACKAGE} failed (run `apt-get update` first?):\n{r.stderr[-2000:]}")
    subprocess.run(["dpkg-deb", "-x", debs[-1], os.path.join(root, "root")], check=True)
    if not os.path.exists(base + ".rdb"):
        sys.exit(f"[llm-corpus] {debs[-1]} has no {INSTALLED}.rdb")
    return base


_CHAPTER = re.compile(r"^(CHAPTER|Chapter) [0-9IVXLC]+\.?\s*$")


def _paragraphs(lines):
    out, cur = [], []
    for line in lines:
        line = (line or "").strip()
        if line:
            cur.append(line)
        elif cur:
            out.append(" ".join(cur))
            cur = []
    if cur:
        out.append(" ".join(cur))
    return out


def documents():
    """[(novel, chapter number from 1, text)] in reading order; the text ends with a newline."""
    txt = os.path.join(CACHE, f"austen-v{VERSION}.json")
    if os.path.exists(txt):
        with open(txt) as f:
            return [tuple(d) for d in json.load(f)]
    data = _read_lazyload(_fetch_package())
    docs = []
    for novel in NOVELS:
        lines = data[novel]
        starts = [i for i, l in enumerate(lines) if l and _CHAPTER.match(l)]
        if len(starts) < 10:
            sys.exit(f"[llm-corpus] {novel}: {len(starts)} chapter headings, expected many more")
        starts[0] = 0  # the title page goes with chapter 1
        for k, (a, b) in enumerate(zip(starts, starts[1:] + [len(lines)])):
            docs.append((novel, k + 1, "\n".join(_paragraphs(lines[a:b])) + "\n"))
    os.makedirs(CACHE, exist_ok=True)
    save_json(txt, docs, indent=None)
    return docs


def encode(text):
    """The tokenizer: UTF-8 bytes, vocab 256."""
    return np.frombuffer(text.encode("utf-8"), np.uint8)


def decode(ids):
    return bytes(np.asarray(ids, np.uint8).tolist()).decode("utf-8", "replace")


def splits():
    """(train, heldout): uint8 token streams, chapters concatenated in reading order."""
    docs = documents()
    held = [d for d in docs if d[1] % HELDOUT_EVERY == 0]
    train = [d for d in docs if d[1] % HELDOUT_EVERY != 0]
    return encode("".join(d[2] for d in train)), encode("".join(d[2] for d in held))


# --- the model ----------------------------------------------------------------------------------

def key():
    train, held = splits()
    h = hashlib.sha256()
    h.update(json.dumps(dict(v=VERSION, tok="bytes", config=CONFIG, train=TRAIN, calib=CALIB,
                             heldout_every=HELDOUT_EVERY), sort_keys=True).encode())
    h.update(train.tobytes())
    h.update(held.tobytes())
    return h.hexdigest()[:16]


def model_dir():
    return os.path.join(CACHE, key())


def _llama_class():
    import transformers as T

    class LlamaLogits(T.LlamaForCausalLM):
        """LlamaForCausalLM whose forward takes input_ids only and returns the logits tensor: what
        the ONNX export traces, with the parameter names of LlamaForCausalLM."""

        def forward(self, input_ids):
            return super().forward(input_ids=input_ids, use_cache=False).logits

    return LlamaLogits


def new_model():
    import torch
    import transformers as T

    torch.manual_seed(TRAIN["seed"])
    cfg = T.LlamaConfig(**CONFIG)
    cfg._attn_implementation = "eager"
    return T.LlamaForCausalLM(cfg)


def load_model(path=None):
    """The trained dense model (LlamaForCausalLM, eval mode, fp32) from the cache."""
    import transformers as T

    T.utils.logging.disable_progress_bar()
    m = T.LlamaForCausalLM.from_pretrained(os.path.join(path or model_dir(), "hf"), attn_implementation="eager",
                                           dtype="float32")
    return m.eval()


def windows(stream, seq, n, rng):
    starts = rng.integers(0, len(stream) - seq, size=n)
    return np.stack([stream[s:s + seq] for s in starts]).astype(np.int64)


def perplexity(model, ids, batch=32):
    """exp(mean next-token cross-entropy) of model on ids [N, T] (each row on its own)."""
    import torch
    import torch.nn.functional as F

    total, count = 0.0, 0
    with torch.inference_mode():
        for i in range(0, len(ids), batch):
            x = torch.from_numpy(np.ascontiguousarray(ids[i:i + batch]))
            logits = model(input_ids=x).logits
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                   x[:, 1:].reshape(-1), reduction="sum")
            total += loss.item()
            count += x[:, 1:].numel()
    return math.exp(total / count)


def eval_subset(heldout, n):
    """n held-out windows spread evenly over the split (all of them when n is 0 or too large)."""
    if not n or n >= len(heldout):
        return heldout
    return heldout[np.linspace(0, len(heldout) - 1, n).round().astype(np.int64)]


def _lr(step):
    t = TRAIN
    if step < t["warmup"]:
        return t["lr"] * (step + 1) / t["warmup"]
    p = (step - t["warmup"]) / max(1, t["steps"] - t["warmup"])
    return t["lr"] * (t["min_lr_frac"] + (1 - t["min_lr_frac"]) * 0.5 * (1 + math.cos(math.pi * p)))


def train(out, threads=1):
    import torch

    torch.set_num_threads(threads)
    tr, held = splits()
    heldout = eval_subset(_heldout_windows(held), 256)
    model = new_model().train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=TRAIN["weight_decay"]),
                             dict(params=no_decay, weight_decay=0.0)], lr=TRAIN["lr"], betas=TRAIN["betas"])
    rng = np.random.default_rng(TRAIN["seed"])
    curve, t0 = [], time.perf_counter()
    nparams = sum(p.numel() for p in model.parameters())
    log(f"training LlamaForCausalLM ({nparams / 1e6:.2f} M params) on {len(tr)} train bytes: "
        f"{TRAIN['steps']} steps of {TRAIN['batch']}x{TRAIN['seq']}, {threads} thread(s)")
    for step in range(TRAIN["steps"]):
        for g in opt.param_groups:
            g["lr"] = _lr(step)
        x = torch.from_numpy(windows(tr, TRAIN["seq"], TRAIN["batch"], rng))
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), TRAIN["clip"])
        opt.step()
        if step % 50 == 0 or step == TRAIN["steps"] - 1:
            rec = dict(step=step, loss=round(loss.item(), 4), lr=_lr(step),
                       seconds=round(time.perf_counter() - t0, 1))
            if step % 250 == 0 or step == TRAIN["steps"] - 1:
                model.eval()
                rec["heldout_ppl"] = round(perplexity(model, heldout), 4)
                model.train()
            curve.append(rec)
            log(json.dumps(rec))
    seconds = time.perf_counter() - t0
    model.eval()
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(os.path.join(out, "hf"))
    return dict(seconds=round(seconds, 1), params=nparams, curve=curve)


def _heldout_windows(held):
    n = len(held) // SEQ
    return held[:n * SEQ].reshape(n, SEQ).astype(np.int64)


def export_onnx(path, hf_dir):
    """model.onnx from the saved model: input_ids [batch, seq] -> logits, dynamo exporter (as
    tests/fixtures/make_models.py and tests/python/check_llm_parity.py export LLaMA). Checked against
    PyTorch in ONNX Runtime. Returns {initializer name: [parameter name, transposed]}: the exporter
    keeps the names of the embedding and the norms but stores each Linear weight as val_N,
    transposed ([in, out], a MatMul's B), and says which parameter it came from in its node's
    metadata; the map (also written as names.json) is how pruned weights go back into PyTorch."""
    import onnxruntime as ort
    import torch

    import transformers as T

    T.utils.logging.disable_progress_bar()
    model = _llama_class().from_pretrained(hf_dir, attn_implementation="eager", dtype="float32").eval()
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(0))
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=SEQ)
    prog = torch.onnx.export(model, (ids,), dynamo=True, input_names=["input_ids"], output_names=["logits"],
                             dynamic_shapes={"input_ids": {0: batch, 1: seq}}, optimize=True, verbose=False)
    prog.save(path + ".tmp")
    os.replace(path + ".tmp", path)

    x = torch.randint(0, CONFIG["vocab_size"], (3, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(x).numpy()
    (got,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"input_ids": x.numpy()})
    err = float(np.abs(got - want).max())
    if err > 1e-3:
        sys.exit(f"[llm-corpus] {path}: ONNX Runtime's logits differ from PyTorch's by {err:.2e}")

    params = {n: p.detach().numpy() for n, p in model.state_dict().items()}
    names = {k: v for k, v in _param_map(path).items() if v[0] in params}  # not constants (new_ones)
    raw = _initializers(path)
    for init, (param, transposed) in names.items():
        w = raw[init].T if transposed else raw[init]
        if param not in params or w.shape != params[param].shape or not np.array_equal(w, params[param]):
            sys.exit(f"[llm-corpus] {path}: initializer {init} is not parameter {param}")
    missing = [n for n in params if n.endswith("proj.weight") and n not in {p for p, _ in names.values()}]
    if missing:
        sys.exit(f"[llm-corpus] {path}: no initializer found for {missing[:3]}")
    with open(os.path.join(os.path.dirname(path), "names.json"), "w") as f:
        json.dump(names, f, indent=1)
    return names


def _meta(node, k):
    for p in node.metadata_props:
        if p.key == k:
            return p.value
    return ""


def _param_map(path):
    """{initializer name: [parameter name, transposed]} of an exported model (see export_onnx)."""
    import ast

    import onnx

    m = onnx.load(path)
    inits = {t.name for t in m.graph.initializer}
    out = {}
    for node in m.graph.node:
        for i, w in enumerate(node.input):
            if w not in inits or w in out:
                continue
            if not w.startswith("val_"):
                out[w] = [w, False]  # kept its parameter name (embedding, norms)
            elif node.op_type in ("MatMul", "Gemm") and i == 1:
                scopes = ast.literal_eval(_meta(node, "pkg.torch.onnx.name_scopes") or "[]")
                if len(scopes) >= 2 and scopes[-2]:
                    param = scopes[-2] + ".weight"
                    if "%p_" + param.replace(".", "_") in _meta(node, "pkg.torch.onnx.fx_node"):
                        trans_b = node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute)
                        out[w] = [param, not trans_b]
    return out


def _initializers(path):
    import onnx
    from onnx import numpy_helper

    g = onnx.load(path).graph
    out = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    for s in g.sparse_initializer:
        vals, idx = numpy_helper.to_array(s.values), numpy_helper.to_array(s.indices)
        dense = np.zeros(int(np.prod(s.dims)), vals.dtype)
        flat = idx if idx.ndim == 1 else np.ravel_multi_index(tuple(idx.T), tuple(s.dims))
        dense[flat] = vals
        out[s.values.name] = dense.reshape(tuple(s.dims))
    return out


def onnx_weights(path, names):
    """{parameter name: array in PyTorch's layout} of a (pruned) copy of model.onnx, by the
    initializer names of names (export_onnx's map): lopper keeps the initializers' names."""
    raw = _initializers(path)
    out = {}
    for init, (param, transposed) in names.items():
        if init not in raw:
            sys.exit(f"[llm-corpus] {path}: no initializer {init} (parameter {param})")
        out[param] = raw[init].T if transposed else raw[init]
    return out


def with_weights(model, weights):
    """model with the parameters named in weights replaced (shape-checked); returns the names."""
    import torch

    state = model.state_dict()
    used = []
    with torch.no_grad():
        for name, p in state.items():
            if name in weights:
                w = np.asarray(weights[name])
                if tuple(w.shape) != tuple(p.shape):
                    sys.exit(f"[llm-corpus] {name}: pruned shape {list(w.shape)}, model wants {list(p.shape)}")
                p.copy_(torch.from_numpy(w.astype(np.float32)))
                used.append(name)
    return used


def sparsity(model, exclude=("lm_head", "embed_tokens")):
    """Share of exact zeros in the Linear weights of the decoder layers (what gets pruned)."""
    z = n = 0
    for name, p in model.named_parameters():
        if p.ndim == 2 and not any(e in name for e in exclude):
            z += int((p == 0).sum())
            n += p.numel()
    return z / max(1, n)


def prepare(threads=1, force=False):
    """Trains (or finds) the model and writes everything bench/llm_quality.py needs; returns the
    paths and the dense figures (train.json). Each step's output is kept, so an interrupted run
    resumes where it stopped."""
    import torch

    d = model_dir()
    meta = os.path.join(d, "train.json")
    if os.path.exists(meta) and not force:
        with open(meta) as f:
            return json.load(f)
    torch.set_num_threads(threads)
    tr, held = splits()
    os.makedirs(d, exist_ok=True)
    info = dict(key=os.path.basename(d), dir=d, hf=os.path.join(d, "hf"), onnx=os.path.join(d, "model.onnx"),
                names=os.path.join(d, "names.json"), calib=os.path.join(d, "calib.npy"),
                heldout=os.path.join(d, "heldout.npy"),
                corpus=dict(package=PACKAGE, license="novels: public domain (Project Gutenberg); package: MIT",
                            train_bytes=int(len(tr)), heldout_bytes=int(len(held)), documents=len(documents()),
                            heldout_every=HELDOUT_EVERY, tokenizer="bytes (vocab 256)"),
                config=CONFIG, train=TRAIN, calib_spec=CALIB)
    log_path = os.path.join(d, "train_log.json")
    if force or not os.path.exists(log_path):
        log_ = train(d, threads)
        with open(log_path, "w") as f:
            json.dump(log_, f, indent=1)
    with open(log_path) as f:
        info["training"] = json.load(f)
    np.save(info["calib"], windows(tr, CALIB["seq"], CALIB["samples"], np.random.default_rng(CALIB["seed"])))
    hw = _heldout_windows(held)
    np.save(info["heldout"], hw)
    t0 = time.perf_counter()
    export_onnx(info["onnx"], info["hf"])
    info["export_seconds"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    info["dense_ppl"] = perplexity(load_model(d), hw)
    info["dense_ppl_seconds"] = round(time.perf_counter() - t0, 1)
    info["heldout_windows"] = int(len(hw))
    info["unigram_ppl"] = unigram_ppl(tr, held)
    save_json(meta, info, indent=1)
    return info


def unigram_ppl(train, held):
    """The baseline a trained model must beat: byte frequencies of the training split (add-one)."""
    counts = np.bincount(train, minlength=256) + 1.0
    logp = np.log(counts / counts.sum())
    return float(np.exp(-logp[held].mean()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="torch threads for training and evaluation (1)")
    ap.add_argument("--force", action="store_true", help="train again even if the cache has this model")
    ap.add_argument("--sample", type=int, default=0, help="also print N bytes the model generates")
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    info = prepare(a.threads, a.force)
    print(json.dumps({k: v for k, v in info.items() if k != "training"} |
                     {"train_seconds": info["training"]["seconds"]}, indent=1))
    if a.sample:
        import torch

        m = load_model(info["dir"])
        x = torch.from_numpy(encode("It is a truth universally acknowledged").astype(np.int64))[None]
        torch.manual_seed(0)
        with torch.no_grad():
            for _ in range(a.sample):
                p = torch.softmax(m(input_ids=x[:, -SEQ:]).logits[0, -1] / 0.8, -1)
                x = torch.cat([x, torch.multinomial(p, 1)[None]], 1)
        print(decode(x[0].numpy()))


if __name__ == "__main__":
    main()
