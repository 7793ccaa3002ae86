"""Op coverage and exactness of lopper on a zoo of real models.

For every torchvision classification builder (and a few transformers architectures) it builds the
model with random weights (fixed seed, eval mode), exports it with both PyTorch exporters
(TorchScript: dynamo=False, opset 17; dynamo=True), runs `lopper run` on the file and compares with
PyTorch's own output: PASS when max|diff| <= 1e-4 * max|ref|.

Each model runs in its own worker process (per-model timeout); one line per model/exporter:
  PASS / FAIL(reason) / EXPORT-FAIL(reason; PyTorch's exporter, not lopper) / SKIP(reason)

Usage:
  .venv/bin/python bench/zoo_check.py [--only a,b] [--exporters ts,dynamo] [--out results.json]
                                      [--timeout 900] [--max-params 600e6] [--threads 1]
                                      [--bench-iters 3] [--no-hf]
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOPPER = os.path.join(ROOT, "build", "lopper")
TOL = 1e-4

# Input sizes that differ from 224 (the builders' default transforms).
SIZES = {"inception_v3": 299, "swin_v2_t": 256, "swin_v2_s": 256, "swin_v2_b": 256, "vit_h_14": 518}

HF_MODELS = ["hf_t5_encoder", "hf_distilbert", "hf_roberta", "hf_vit", "hf_whisper_encoder",
             "hf_albert", "hf_electra", "hf_mobilebert", "hf_deberta_v2", "hf_bart_encoder",
             "hf_convnext", "hf_swin", "hf_mistral", "hf_gpt_neox"]


def tv_models():
    import torchvision

    return torchvision.models.list_models(module=torchvision.models)


# ------------------------------------------------------------------------------------------------
# worker side


def randomize(model):
    """The parity fixtures' randomization (torchvision zero-inits some heads), shared."""
    fixtures = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
    sys.path.insert(0, fixtures)
    from make_models import randomize as fixture_randomize

    return fixture_randomize(model)


def hf_build(name):
    import torch
    import torch.nn as nn
    import transformers as tf

    eager = dict(attn_implementation="eager")
    ids = torch.randint(0, 100, (1, 16))

    class Wrap(nn.Module):
        def __init__(self, m, key):
            super().__init__()
            self.m, self.key = m, key

        def forward(self, x):
            out = self.m(x)
            return getattr(out, self.key) if self.key else out[0]

    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    if name == "hf_t5_encoder":
        cfg = tf.T5Config(vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, **eager)
        m = tf.T5EncoderModel(cfg)
        return Wrap(m, "last_hidden_state"), ids
    if name == "hf_distilbert":
        cfg = tf.DistilBertConfig(vocab_size=128, dim=64, n_layers=2, n_heads=4, hidden_dim=128, **eager)
        return Wrap(tf.DistilBertModel(cfg), "last_hidden_state"), ids
    if name == "hf_roberta":
        cfg = tf.RobertaConfig(vocab_size=128, max_position_embeddings=64, **small, **eager)
        return Wrap(tf.RobertaModel(cfg), "last_hidden_state"), ids
    if name == "hf_albert":
        cfg = tf.AlbertConfig(vocab_size=128, embedding_size=32, max_position_embeddings=64, **small, **eager)
        return Wrap(tf.AlbertModel(cfg), "last_hidden_state"), ids
    if name == "hf_electra":
        cfg = tf.ElectraConfig(vocab_size=128, embedding_size=32, max_position_embeddings=64, **small, **eager)
        return Wrap(tf.ElectraModel(cfg), "last_hidden_state"), ids
    if name == "hf_mobilebert":
        cfg = tf.MobileBertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, embedding_size=32, intra_bottleneck_size=32,
                                  true_hidden_size=32, max_position_embeddings=64, **eager)
        return Wrap(tf.MobileBertModel(cfg), "last_hidden_state"), ids
    if name == "hf_deberta_v2":
        cfg = tf.DebertaV2Config(vocab_size=128, max_position_embeddings=64, **small, **eager)
        return Wrap(tf.DebertaV2Model(cfg), "last_hidden_state"), ids
    if name == "hf_bart_encoder":
        cfg = tf.BartConfig(vocab_size=128, d_model=64, encoder_layers=2, decoder_layers=2,
                            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                            decoder_ffn_dim=128, max_position_embeddings=64, **eager)
        return Wrap(tf.BartModel(cfg).get_encoder(), "last_hidden_state"), ids
    if name == "hf_mistral":
        cfg = tf.MistralConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
                               use_cache=False, **eager)
        return Wrap(tf.MistralModel(cfg), "last_hidden_state"), ids
    if name == "hf_gpt_neox":
        cfg = tf.GPTNeoXConfig(vocab_size=128, max_position_embeddings=64, use_cache=False, **small, **eager)
        return Wrap(tf.GPTNeoXModel(cfg), "last_hidden_state"), ids
    img = torch.randn(1, 3, 32, 32)
    if name == "hf_vit":
        cfg = tf.ViTConfig(image_size=32, patch_size=8, **small, **eager)
        return Wrap(tf.ViTModel(cfg), "last_hidden_state"), img
    if name == "hf_convnext":
        cfg = tf.ConvNextConfig(num_channels=3, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1],
                                image_size=64)
        return Wrap(tf.ConvNextModel(cfg), "last_hidden_state"), torch.randn(1, 3, 64, 64)
    if name == "hf_swin":
        cfg = tf.SwinConfig(image_size=64, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4],
                            window_size=4, **eager)
        return Wrap(tf.SwinModel(cfg), "last_hidden_state"), torch.randn(1, 3, 64, 64)
    if name == "hf_whisper_encoder":
        cfg = tf.WhisperConfig(vocab_size=128, d_model=64, encoder_layers=2, decoder_layers=2,
                               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                               decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=32, pad_token_id=0,
                               bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, **eager)
        enc = tf.WhisperModel(cfg).get_encoder()
        return Wrap(enc, "last_hidden_state"), torch.randn(1, 16, 64)
    raise ValueError(f"unknown model {name}")


def build(name, max_params):
    """Returns (model, input) or raises Skip."""
    import torch
    import torchvision

    torch.manual_seed(0)
    if name.startswith("hf_"):
        m, x = hf_build(name)
        return randomize(m).eval(), x
    try:  # count on the meta device: no memory, no init time
        with torch.device("meta"):
            n = sum(p.numel() for p in torchvision.models.get_model(name, weights=None).parameters())
    except Exception:  # noqa: BLE001  (some inits copy data, e.g. RegNet's): the weights' metadata
        n = max((w.meta.get("num_params", 0) for w in torchvision.models.get_model_weights(name)), default=0)
    if n > max_params:
        raise Skip(f"{n / 1e6:.0f}M parameters > {max_params / 1e6:.0f}M")
    m = torchvision.models.get_model(name, weights=None)
    size = SIZES.get(name, 224)
    return randomize(m).eval(), torch.randn(1, 3, size, size)


class Skip(Exception):
    pass


def first_line(text, limit=300):
    for line in text.splitlines()[::-1]:
        if "error" in line.lower() or "[op]" in line:
            return line.strip()[:limit]
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    return (lines[-1] if lines else "")[:limit]


def export(model, x, path, exporter):
    import torch

    # Autograd on: under no_grad nn.MultiheadAttention takes its fused fast path, which does not export.
    if exporter == "ts":
        torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17, input_names=["input"],
                          output_names=["output"])
    else:
        prog = torch.onnx.export(model, (x,), dynamo=True, input_names=["input"], output_names=["output"],
                                 verbose=False)
        prog.save(path, external_data=True)


def worker(args):
    import numpy as np
    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    res_path = args.worker_out

    def emit(exporter, status, **kw):
        rec = dict(model=args.worker, exporter=exporter, status=status, **kw)
        with open(res_path, "a") as f:
            f.write(json.dumps(rec) + "\n")

    exporters = args.exporters.split(",")
    try:
        model, x = build(args.worker, args.max_params)
    except Skip as e:
        for ex in exporters:
            emit(ex, "SKIP", reason=str(e))
        return
    with torch.no_grad():
        ref = model(x)
    if not torch.is_tensor(ref):
        ref = ref[0]
    ref = ref.detach().numpy()
    work = tempfile.mkdtemp(prefix=f"zoo_{args.worker}_")
    try:
        np.save(os.path.join(work, "input.npy"), x.numpy())
        for ex in exporters:
            path = os.path.join(work, f"model.{ex}.onnx")
            t0 = time.time()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    export(model, x, path, ex)
            except Exception as e:  # noqa: BLE001
                msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                emit(ex, "EXPORT-FAIL", reason=msg[:300], export_s=round(time.time() - t0, 1))
                continue
            export_s = round(time.time() - t0, 1)
            import onnx

            mp = onnx.load(path, load_external_data=False)
            in_name = mp.graph.input[0].name
            out_dir = os.path.join(work, f"out.{ex}")
            shutil.rmtree(out_dir, ignore_errors=True)
            cmd = [LOPPER, "run", path, "--input", f"{in_name}={os.path.join(work, 'input.npy')}", "--out",
                   out_dir, "--threads", str(args.threads)]
            t0 = time.time()
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                emit(ex, "FAIL", reason=f"lopper timed out after {args.timeout}s", export_s=export_s)
                continue
            run_s = time.time() - t0
            if p.returncode != 0:
                emit(ex, "FAIL", reason=first_line(p.stderr + p.stdout), export_s=export_s)
                continue
            files = sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else []
            want = re.sub(r"[^A-Za-z0-9_.-]", "_", mp.graph.output[0].name) + ".npy"
            fname = want if want in files else (files[0] if len(files) == 1 else None)
            if fname is None:
                emit(ex, "FAIL", reason=f"no output file (have {files})", export_s=export_s)
                continue
            got = np.load(os.path.join(out_dir, fname))
            if got.shape != ref.shape:
                emit(ex, "FAIL", reason=f"shape {got.shape} != {ref.shape}", export_s=export_s)
                continue
            diff = float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64))))
            scale = float(np.max(np.abs(ref)))
            rel = diff / scale if scale > 0 else diff
            ok = bool(np.isfinite(diff)) and diff <= TOL * scale
            bench = {}
            if ok and args.bench_iters > 0:
                try:
                    b = subprocess.run([LOPPER, "bench", path, "--threads", str(args.threads), "--warmup", "1",
                                        "--iters", str(args.bench_iters), "--json"],
                                       capture_output=True, text=True, timeout=args.timeout)
                    bench = dict(lopper_ms=round(json.loads(b.stdout)["median_ms"], 2))
                except Exception:  # noqa: BLE001
                    pass
            emit(ex, "PASS" if ok else "FAIL", max_abs_diff=diff, max_ref=scale, rel_diff=rel,
                 run_s=round(run_s, 3), export_s=export_s, **bench,
                 **({} if ok else dict(reason=f"max|diff| {diff:.3g} > 1e-4 * max|ref| {scale:.3g}")))
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------------------------------------
# driver


def fmt(r):
    s = f"{r['model']:<22} {r['exporter']:<7} {r['status']}"
    if "rel_diff" in r:
        s += f"  rel {r['rel_diff']:.2e}"
    if "lopper_ms" in r:
        s += f"  lopper {r['lopper_ms']:.1f} ms/run"
    if "reason" in r:
        s += f"  ({r['reason']})"
    return s


def markdown(records):
    """The records as a Markdown table."""
    rows = ["| model | exporter | result | max rel diff | lopper ms/run | note |", "|---|---|---|---|---|---|"]
    for r in records:
        rel = f"{r['rel_diff']:.1e}" if "rel_diff" in r else ""
        ms = f"{r['lopper_ms']:.1f}" if "lopper_ms" in r else ""
        note = r.get("reason", "").replace("|", "\\|")
        rows.append(f"| {r['model']} | {r['exporter']} | {r['status']} | {rel} | {ms} | {note} |")
    return "\n".join(rows) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated model names (tv names or hf_*)")
    ap.add_argument("--exporters", default="ts,dynamo")
    ap.add_argument("--out", default="", help="write the records as JSON here")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per model (all exporters)")
    ap.add_argument("--max-params", type=float, default=600e6)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--bench-iters", type=int, default=3,
                    help="timed `lopper bench` runs (median, after one warm-up) for passing models; 0: none")
    ap.add_argument("--no-hf", action="store_true", help="leave out the transformers models")
    ap.add_argument("--table", default="", help="print results JSON files (comma-separated) as Markdown; runs nothing")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.table:
        records = []
        for path in args.table.split(","):
            with open(path) as f:
                records += json.load(f)
        sys.stdout.write(markdown(records))
        return 0

    names = [n for n in args.only.split(",") if n] or (tv_models() + ([] if args.no_hf else HF_MODELS))
    exporters = args.exporters.split(",")
    records = []
    for name in names:
        fd, tmp = tempfile.mkstemp(prefix="zoo_res_", suffix=".jsonl")
        os.close(fd)
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", name, "--worker-out", tmp, "--exporters",
               args.exporters, "--timeout", str(args.timeout), "--max-params", str(args.max_params),
               "--threads", str(args.threads), "--bench-iters", str(args.bench_iters)]
        t0 = time.time()
        err = ""
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            if p.returncode != 0:
                err = first_line(p.stderr + p.stdout)
        except subprocess.TimeoutExpired:
            err = f"timed out after {args.timeout:.0f}s"
        with open(tmp) as f:
            got = [json.loads(l) for l in f if l.strip()]
        os.unlink(tmp)
        done = {r["exporter"] for r in got}
        for ex in exporters:
            if ex not in done:
                got.append(dict(model=name, exporter=ex, status="SKIP", reason=f"worker: {err or 'no result'}"))
        got.sort(key=lambda r: exporters.index(r["exporter"]))
        for r in got:
            r["wall_s"] = round(time.time() - t0, 1)
            print(fmt(r), flush=True)
        records += got
        if args.out:
            with open(args.out, "w") as f:
                json.dump(records, f, indent=1)
    counts = {}
    for r in records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print("summary: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + f" (of {len(records)})")
    return 0


if __name__ == "__main__":
    sys.exit(main() or 0)
