"""SparseGPT 50% on a LLaMA-style model of about 1B parameters, on the CPU: lopper (the CLI
streaming the model's external data block by block, and lopper.prune from Python on the
transformers model in place) beside llm-compressor (its sequential pipeline), the same
model and the same calibration tokens. Measured per job: wall time and peak RSS of that process.

The model is transformers' LlamaForCausalLM with TinyLlama-1.1B's shape (hidden 2048, MLP 5632,
22 layers, 32 heads, 4 KV heads, vocabulary 32000), random init (seeded), float32: 4.4 GB of
weights. It is exported once with torch.onnx (dynamo, external data) and saved with save_pretrained
for llm-compressor, both cached in ~/.cache/lopper/llm-1b (or $LOPPER_CACHE/llm-1b).

    .venv/bin/python bench/llm_streaming.py [--samples 16] [--seq 256] [--layers 22] [--no-llmc]
        [--no-cli] [--no-python]

lopper.prune from Python (the third job) loads the saved model and prunes it in place through its
own decoder layers, never exported.

NOTE: the papers calibrate on 128 sequences of 2048 tokens; on a 2-core CPU one forward pass of a
1B model over 262k tokens alone takes hours, so the default here is 16 x 256 tokens (both tools the
same). Memory does not depend much on it: the calibration activations are 16 x 256 x 2048 floats
(32 MB) per carried value.
"""
import argparse
import hashlib
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_quality import run_measured  # noqa: E402  (the launcher measuring one process alone)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLMC_PY = os.path.join(ROOT, ".venv-llmc", "bin", "python")

CONFIG = dict(hidden_size=2048, intermediate_size=5632, num_attention_heads=32,
              num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048,
              tie_word_embeddings=False)

# llm-compressor's oneshot with SparseGPTModifier on the saved model and the same token IDs (no
# weights written out: the job is the pruning).
LLMC_JOB = r"""
import os, sys, time
import numpy as np, torch
from datasets import Dataset
from transformers import AutoModelForCausalLM
from llmcompressor import oneshot
from llmcompressor.modifiers.pruning import SparseGPTModifier
sys.path.insert(0, sys.argv[3])
from llmc_reference import placeholder_tokenizer
torch.set_num_threads(int(sys.argv[4]))
ids = np.load(sys.argv[2])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32,
                                             attn_implementation="eager").eval()
data = Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": np.ones_like(ids).tolist()})
t = time.perf_counter()
oneshot(model=model, recipe=[SparseGPTModifier(sparsity=0.5, mask_structure="0:0", block_size=128,
                                               dampening_frac=0.01, targets=[r"re:model\.layers\.\d+$"],
                                               ignore=["re:.*lm_head"])],
        dataset=data, tokenizer=placeholder_tokenizer(), pipeline="sequential", batch_size=4,
        num_calibration_samples=len(ids), shuffle_calibration_samples=False,
        max_seq_length=ids.shape[1])
ws = [m.weight for n, m in model.model.layers.named_modules() if isinstance(m, torch.nn.Linear)]
zeros = sum(int((w == 0).sum()) for w in ws) / sum(w.numel() for w in ws)
print("oneshot_s", time.perf_counter() - t, "sparsity", zeros)
"""


# lopper.prune from Python on the same saved model and tokens: the transformers model pruned in
# place through its own decoder layers (no export), lm_head left alone by default.
PY_JOB = r"""
import sys, time
import numpy as np, torch
from transformers import AutoModelForCausalLM
import lopper
torch.set_num_threads(int(sys.argv[3]))
ids = torch.from_numpy(np.load(sys.argv[2]))
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32,
                                             attn_implementation="eager").eval()
batches = [{"input_ids": ids[i:i + 4]} for i in range(0, len(ids), 4)]
t = time.perf_counter()
report = lopper.prune(model, batches[0], method="sparsegpt", amount=0.5, data=batches,
                      masks=False, progress=False)
ws = [m.weight for n, m in model.model.layers.named_modules() if isinstance(m, torch.nn.Linear)]
zeros = sum(int((w == 0).sum()) for w in ws) / sum(w.numel() for w in ws)
print("oneshot_s", time.perf_counter() - t, "sparsity", zeros)
"""


def log(msg):
    print(f"[llm-streaming] {msg}", file=sys.stderr, flush=True)


def Logits(m):  # noqa: N802  (a module class, made on first use: torch is imported late)
    """A causal LM as input_ids -> logits, no KV cache: what calibration feeds."""
    import torch

    class _Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids):
            return self.m(input_ids=input_ids, use_cache=False).logits

    return _Logits(m)


def prepare(layers, cache_root, onnx=True):
    """The model (ONNX with external data unless not `onnx`, and a save_pretrained folder),
    cached."""
    import torch
    import transformers as T

    cfg = dict(CONFIG, num_hidden_layers=layers)
    key = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:12]
    d = os.path.join(cache_root, f"llama-{layers}l-{key}")
    onnx_path, hf_dir = os.path.join(d, "model.onnx"), os.path.join(d, "hf")
    have_hf = os.path.exists(os.path.join(hf_dir, "config.json"))
    if have_hf and (os.path.exists(onnx_path) or not onnx):
        return d, onnx_path, hf_dir
    os.makedirs(d, exist_ok=True)
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(**cfg, attn_implementation="eager")).eval()
    n = sum(p.numel() for p in model.parameters())
    if not have_hf:
        log(f"saving a {n / 1e9:.2f}B-parameter LLaMA to {hf_dir} (once)")
        model.save_pretrained(hf_dir)
    if not onnx:
        return d, onnx_path, hf_dir
    log(f"exporting it to {onnx_path} (once; minutes)")

    ids = torch.randint(1, cfg["vocab_size"], (2, 16))
    batch, seq = torch.export.Dim("batch", min=1), torch.export.Dim("seq", min=2, max=2048)
    with torch.no_grad():
        torch.onnx.export(Logits(model), (ids,), onnx_path, dynamo=True, external_data=True,
                          input_names=["input_ids"], output_names=["logits"],
                          dynamic_shapes={"input_ids": {0: batch, 1: seq}})
    return d, onnx_path, hf_dir


def cli_job(a, d, onnx_path, ids_path):
    """`lopper prune` on the ONNX export, streamed: wall time, peak RSS, sparsity."""
    with tempfile.TemporaryDirectory(dir=d) as work:
        out = os.path.join(work, "pruned.onnx")
        cmd = [a.lopper, "prune", onnx_path, "-o", out, "--method", "sparsegpt", "--amount", "0.5",
               "--data", "tokens:" + ids_path, "--batch-size", "4",
               "--calib-batches", str(a.samples // 4), "--exclude", "lm_head",
               "--threads", str(a.threads), "--json"]
        log("lopper: " + " ".join(cmd))
        r = run_measured(cmd)
    if r["rc"] != 0:
        sys.exit(f"lopper failed: {r['stderr'][-2000:]}")
    pruned = [l for l in json.loads(r["stdout"])["layers"] if l["method"]]
    zeros = sum(l["params"] - l["nonzero"] for l in pruned) / sum(l["params"] for l in pruned)
    log(f"lopper: {r['wall_s']:.0f} s, peak RSS {r['peak_rss_mb']:.0f} MB")
    return dict(wall_s=r["wall_s"], peak_rss_mb=r["peak_rss_mb"], sparsity=zeros)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lopper", default=os.path.join(ROOT, "build", "lopper"))
    ap.add_argument("--layers", type=int, default=22, help="decoder layers (22: 1.1B parameters)")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-llmc", action="store_true")
    ap.add_argument("--no-cli", action="store_true", help="skip the CLI (and the ONNX export)")
    ap.add_argument("--no-python", action="store_true", help="skip lopper.prune from Python")
    ap.add_argument("--out", default="", help="write the results here (JSON)")
    a = ap.parse_args()

    import numpy as np

    cache = os.path.join(os.environ.get("LOPPER_CACHE", os.path.expanduser("~/.cache/lopper")),
                         "llm-1b")
    d, onnx_path, hf_dir = prepare(a.layers, cache, onnx=not a.no_cli)
    data_bytes = sum(os.path.getsize(os.path.join(hf_dir, f)) for f in os.listdir(hf_dir)
                     if f.endswith(".safetensors"))
    ids_path = os.path.join(d, f"ids-{a.samples}x{a.seq}.npy")
    np.save(ids_path, np.random.default_rng(0).integers(1, CONFIG["vocab_size"], (a.samples, a.seq)))
    res = dict(layers=a.layers, samples=a.samples, seq=a.seq, weights_gb=data_bytes / 1e9, jobs={})

    if not a.no_cli:
        res["jobs"]["lopper"] = cli_job(a, d, onnx_path, ids_path)
    if not a.no_python:
        log("lopper.prune from Python: the transformers model in place, block by block")
        path = os.pathsep.join(x for x in (os.path.join(ROOT, "build", "python"),
                                           os.environ.get("PYTHONPATH")) if x)
        r = run_measured([sys.executable, "-c", PY_JOB, hf_dir, ids_path, str(a.threads)],
                         env=dict(os.environ, PYTHONPATH=path))
        if r["rc"] != 0:
            sys.exit(f"lopper.prune failed: {r['stderr'][-2000:]}")
        line = [x for x in r["stdout"].splitlines() if x.startswith("oneshot_s")][-1].split()
        res["jobs"]["lopper (Python)"] = dict(wall_s=r["wall_s"], peak_rss_mb=r["peak_rss_mb"],
                                              oneshot_s=float(line[1]), sparsity=float(line[3]))
        log(f"lopper.prune: {r['wall_s']:.0f} s, peak RSS {r['peak_rss_mb']:.0f} MB")
    if not a.no_llmc:
        if not os.path.exists(LLMC_PY):
            log("llm-compressor: no .venv-llmc (scripts/install-llmcompressor.sh): skipped")
        else:
            env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                       TRANSFORMERS_OFFLINE="1")
            cmd = [LLMC_PY, "-c", LLMC_JOB, hf_dir, ids_path,
                   os.path.join(ROOT, "tests", "python"), str(a.threads)]
            log("llm-compressor: oneshot SparseGPTModifier(0.5), sequential pipeline")
            r = run_measured(cmd, env=env)
            if r["rc"] != 0:
                sys.exit(f"llm-compressor failed: {r['stderr'][-2000:]}")
            line = [x for x in r["stdout"].splitlines() if x.startswith("oneshot_s")][-1].split()
            res["jobs"]["llm-compressor"] = dict(wall_s=r["wall_s"], peak_rss_mb=r["peak_rss_mb"],
                                                 oneshot_s=float(line[1]), sparsity=float(line[3]))
            log(f"llm-compressor: {r['wall_s']:.0f} s, peak RSS {r['peak_rss_mb']:.0f} MB")

    print(f"SparseGPT 50%, {a.layers} layers ({res['weights_gb']:.2f} GB of fp32 weights), "
          f"{a.samples} x {a.seq} calibration tokens, {a.threads} threads")
    print(f"{'job':<16} {'wall s':>8} {'peak RSS MB':>12} {'sparsity':>9}")
    for name, j in res["jobs"].items():
        print(f"{name:<16} {j['wall_s']:>8.0f} {j['peak_rss_mb']:>12.0f} {j['sparsity']:>9.3f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
