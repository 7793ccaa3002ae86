"""lopper's REAP expert pruning keeps the experts llm-compressor's REAPPruningModifier keeps.

Builds tiny mixture-of-experts language models with transformers (random init, seeded, float32,
8 experts per layer, top-2 routing): Mixtral (3 MoE layers; its router renormalises the top-2
weights), Qwen2-MoE (a shared expert beside the routed ones, layer 1 a dense MLP through
mlp_only_layers, top-k weights not renormalised) and Qwen3-MoE (renormalised); saves each with
save_pretrained (WORKDIR/<model>/hf) and writes 16 sequences of 32 token IDs (WORKDIR/ids.npy).
Then, per model and sparsity (0.25 and 0.5 of each layer's experts):
  - llm-compressor: this file under .venv-llmc's python with --reference loads the saved model,
    linearizes its experts (linearize_moe) and runs `oneshot` with REAPPruningModifier(sparsity,
    report_path) on the tokens (sequential pipeline, one subgraph per decoder layer, batches of 4,
    no shuffling): the retained experts per layer (its report JSON) and the saliencies it chose by
    (captured from REAPSaliencyTracker.compute_retained_experts);
  - lopper: lopper.prune_structured(model, unit="expert", method="reap", amount=sparsity,
    data=the same 4 batches) on the same saved model, in the main venv.
Checked: the experts kept per layer are the same, and the saliencies agree within 1e-4 relative
(max |a - b| / max |b| per layer). A layer's choice may differ only where llm-compressor's own
saliencies tie at the boundary within 1e-6 relative (counted and printed). Prints one table
(model, sparsity, layers, kept equal, max relative saliency difference, seconds in lopper and in
llm-compressor's oneshot) and one line for each failure; exits 1 then.

Without .venv-llmc (scripts/install-llmcompressor.sh) it skips with one line and exits 0, unless
LOPPER_REQUIRE_LLMC is set (ctest sets it): then it fails.

Usage: check_expert_parity.py WORKDIR
       check_expert_parity.py --reference --model-dir DIR --ids IDS.npy --sparsity S
                              --batch-size B --out OUT.json      (under .venv-llmc's python)
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
LLMC_PYTHON = ROOT / ".venv-llmc" / "bin" / "python"

SAMPLES, TOKENS, VOCAB, BATCH = 16, 32, 256, 4
SPARSITIES = (0.25, 0.5)
SCORE_RTOL = 1e-4  # saliencies: max |lopper - llm-compressor| / max |llm-compressor| per layer
TIE_RTOL = 1e-6    # a different choice is allowed only where llm-compressor's saliencies tie so


def models():
    """{name: (class name, config)}: tiny MoE configs (hidden 64, 8 experts, top-2)."""
    import transformers as T

    common = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=64, num_experts_per_tok=2, use_cache=False,
                  tie_word_embeddings=False)
    return {
        "mixtral": ("MixtralForCausalLM",
                    T.MixtralConfig(intermediate_size=96, num_hidden_layers=3,
                                    num_local_experts=8, **common)),
        "qwen2_moe": ("Qwen2MoeForCausalLM",
                      T.Qwen2MoeConfig(intermediate_size=128, moe_intermediate_size=48,
                                       shared_expert_intermediate_size=64, num_hidden_layers=3,
                                       num_experts=8, decoder_sparse_step=1, mlp_only_layers=[1],
                                       norm_topk_prob=False, **common)),
        "qwen3_moe": ("Qwen3MoeForCausalLM",
                      T.Qwen3MoeConfig(intermediate_size=128, moe_intermediate_size=48,
                                       num_hidden_layers=3, num_experts=8, norm_topk_prob=True,
                                       head_dim=16, **common)),
    }


# ------------------------------------------------------------------------------------------------
# The reference (under .venv-llmc).

def placeholder_tokenizer():
    """oneshot loads a processor whenever a dataset is given; the data is token IDs already, so a
    one-word tokenizer does (as tests/python/llmc_reference.py)."""
    from tokenizers import Tokenizer, models as tm
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(tm.WordLevel({"<unk>": 0}, "<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>")


def reference(argv):
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--reference", action="store_true")
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--sparsity", type=float, required=True)
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[k] = "1"
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from llmcompressor import oneshot
    from llmcompressor.modeling.moe.linearize import linearize_moe
    from llmcompressor.modifiers.pruning.reap import REAPPruningModifier
    from llmcompressor.modifiers.pruning.reap import utils as reap_utils

    # NOTE: llm-compressor 0.14 forces eager attention while it calibrates
    # (utils.helpers.use_eager_attention), and its sequential pipeline's trace of Mixtral's and
    # Qwen3-MoE's model forward (transformers 5.17: `mask_function = create_causal_mask if ...`)
    # hands their decoder layers no mask at all: eager attention then runs bidirectional (every
    # token's hidden state but the last differs from the model's own forward). Left to sdpa, a
    # missing mask is causal, as the model computes: so the model keeps sdpa here.
    import contextlib

    import llmcompressor.utils.helpers as llmc_helpers

    llmc_helpers.use_eager_attention = lambda model: contextlib.nullcontext()
    torch.manual_seed(0)
    ids = np.load(args.ids)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    linearize_moe(model)
    data = Dataset.from_dict({"input_ids": ids.astype(np.int64).tolist(),
                              "attention_mask": np.ones_like(ids, dtype=np.int64).tolist()})
    # What llm-compressor chose by: each layer's mean saliency, in the order it prunes them.
    saliencies = []
    choose = reap_utils.REAPSaliencyTracker.compute_retained_experts

    def recorded(self, *a, **k):
        saliencies.append(self.mean_saliency.tolist())
        return choose(self, *a, **k)

    reap_utils.REAPSaliencyTracker.compute_retained_experts = recorded
    report = args.out + ".retained.json"
    t0 = time.time()
    oneshot(model=model, tokenizer=placeholder_tokenizer(), dataset=data,
            recipe=REAPPruningModifier(sparsity=args.sparsity, report_path=report),
            pipeline="sequential", batch_size=args.batch_size, num_calibration_samples=len(ids),
            shuffle_calibration_samples=False, max_seq_length=ids.shape[1], output_dir=None)
    wall = time.time() - t0
    with open(report) as f:
        retained = json.load(f)
    if len(saliencies) != len(retained):
        sys.exit(f"{len(saliencies)} saliency records for {len(retained)} layers")
    with open(args.out, "w") as f:
        json.dump({"retained": retained, "saliency": dict(zip(retained, saliencies)),
                   "wall_s": wall}, f)


# ------------------------------------------------------------------------------------------------
# The check (main venv).

def make(workdir):
    import torch
    import transformers as T

    ids = np.random.default_rng(0).integers(1, VOCAB, size=(SAMPLES, TOKENS), dtype=np.int64)
    np.save(workdir / "ids.npy", ids)
    for name, (cls, cfg) in models().items():
        torch.manual_seed(0)
        model = getattr(T, cls)(cfg).float().eval()
        # NOTE: transformers' init draws the routers from a normal of std 0.02: every expert then
        # scores alike. Wider rows give the experts distinct shares, as a trained router does.
        with torch.no_grad():
            for mod_name, p in model.named_parameters():
                if mod_name.endswith("mlp.gate.weight"):
                    p.normal_(0, 0.5)
        model.save_pretrained(workdir / name / "hf")
    return ids


def run_reference(workdir, name, sparsity):
    out = workdir / name / f"llmc-{sparsity}.json"
    cmd = [str(LLMC_PYTHON), str(Path(__file__).resolve()), "--reference", "--model-dir",
           str(workdir / name / "hf"), "--ids", str(workdir / "ids.npy"), "--sparsity",
           str(sparsity), "--batch-size", str(BATCH), "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-20:])
        sys.exit(f"FAIL: {name} {sparsity}: the llm-compressor reference exited {r.returncode}:"
                 f"\n{tail}")
    with open(out) as f:
        return json.load(f)


def run_lopper(workdir, name, ids, sparsity):
    import torch
    import transformers as T

    import lopper

    cls = models()[name][0]
    model = getattr(T, cls).from_pretrained(workdir / name / "hf", dtype=torch.float32,
                                            attn_implementation="sdpa").eval()
    ids_t = torch.from_numpy(ids)
    data = [{"input_ids": ids_t[i:i + BATCH], "attention_mask": torch.ones_like(ids_t[i:i + BATCH])}
            for i in range(0, SAMPLES, BATCH)]
    t0 = time.time()
    report = lopper.prune_structured(model, {"input_ids": ids_t[:1]}, unit="expert",
                                     method="reap", amount=sparsity, data=data, progress=False)
    seconds = time.time() - t0
    kept = {g.layers[0]: sorted(set(range(g.size_before)) - set(g.removed))
            for g in report.groups}
    return kept, report.scores, seconds


def tie_at_boundary(saliency, drop):
    s = np.sort(np.asarray(saliency, dtype=np.float64))
    lo, hi = s[drop - 1], s[drop]
    return hi - lo <= TIE_RTOL * max(abs(hi), 1e-30)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--reference":
        reference(sys.argv[1:])
        return
    if len(sys.argv) != 2:
        sys.exit(__doc__.rsplit("Usage: ", 1)[1])
    workdir = Path(sys.argv[1])
    if not LLMC_PYTHON.exists():
        msg = f"{LLMC_PYTHON.parent.parent} is missing (scripts/install-llmcompressor.sh makes it)"
        if os.environ.get("LOPPER_REQUIRE_LLMC"):
            sys.exit(f"FAIL: {msg}")
        print(f"SKIP: {msg}")
        return
    workdir.mkdir(parents=True, exist_ok=True)
    ids = make(workdir)
    rows, failures = [], []
    for name in models():
        for sparsity in SPARSITIES:
            ref = run_reference(workdir, name, sparsity)
            kept, scores, lopper_s = run_lopper(workdir, name, ids, sparsity)
            equal = ties = 0
            max_rel = 0.0
            what = f"{name} {sparsity}"
            if set(kept) != set(ref["retained"]):
                failures.append(f"{what}: lopper pruned layers {sorted(kept)}, llm-compressor "
                                f"{sorted(ref['retained'])}")
                continue
            for layer, want in ref["retained"].items():
                sal = np.asarray(ref["saliency"][layer], dtype=np.float64)
                got = np.asarray(scores[layer], dtype=np.float64)
                rel = float(np.abs(got - sal).max() / max(np.abs(sal).max(), 1e-30))
                max_rel = max(max_rel, rel)
                if rel > SCORE_RTOL:
                    failures.append(f"{what}: {layer}: saliencies differ by {rel:.2e} relative "
                                    f"(lopper {got.round(6).tolist()}, llm-compressor "
                                    f"{sal.round(6).tolist()})")
                if sorted(want) == kept[layer]:
                    equal += 1
                elif tie_at_boundary(sal, len(sal) - len(want)):
                    ties += 1
                else:
                    failures.append(f"{what}: {layer}: lopper keeps {kept[layer]}, "
                                    f"llm-compressor {sorted(want)}")
            rows.append((name, sparsity, len(kept), equal, ties, max_rel, lopper_s,
                         ref["wall_s"]))
    print(f"{'model':<10} {'sparsity':>8} {'layers':>6} {'kept equal':>10} {'ties':>4} "
          f"{'max rel saliency diff':>21} {'lopper s':>8} {'llm-compressor s':>16}")
    for name, sparsity, layers, equal, ties, max_rel, lopper_s, ref_s in rows:
        print(f"{name:<10} {sparsity:>8} {layers:>6} {equal:>10} {ties:>4} {max_rel:>21.2e} "
              f"{lopper_s:>8.2f} {ref_s:>16.2f}")
    for f in failures:
        print(f"FAIL: {f}")
    if failures:
        sys.exit(1)
    print(f"{len(rows)} cases: lopper's REAP keeps the experts llm-compressor's keeps")


if __name__ == "__main__":
    main()
