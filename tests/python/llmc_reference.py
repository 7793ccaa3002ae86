"""llm-compressor's one-shot Wanda or SparseGPT on a transformers causal LM: the peer of lopper's
(tests/python/check_llm_parity.py). Runs under .venv-llmc/bin/python
(scripts/install-llmcompressor.sh), on CPU, float32, offline.

It calls llm-compressor's own entry point, `oneshot`, with a WandaPruningModifier or a
SparseGPTModifier whose targets are the decoder layers (`re:model.layers.N`: the Linear layers
inside them are pruned, lm_head is ignored) and the sequential pipeline (pipeline="sequential", one
subgraph per decoder layer: every Linear of a layer is calibrated on the outputs of the
already-pruned layers before it, then the layer is pruned and its pruned outputs feed the next
one). Every row of --ids is one calibration sample, in order (no shuffling), batched --batch-size
at a time.

Writes --out (npz): the pruned weight of every pruned Linear keyed by its PyTorch parameter name
(model.layers.0.self_attn.q_proj.weight, ...), and what llm-compressor computed on the way:
"scalars:NAME" (Wanda: the per-input-column mean of squared inputs, S, whose sqrt scales |W|),
"hessian:NAME" (SparseGPT: H = 2/n sum X X^T, before dead columns and dampening),
"sparsity:NAME" (the sparsity it was asked for, per layer: OWL's with --owl-m, see
owl_sparsities), "wall_s" (oneshot's wall time) and "total_s" (with the imports and the model's
load).

Usage: llmc_reference.py --model-dir DIR --ids IDS.npy --method wanda|sparsegpt [--sparsity 0.5]
       [--mask-structure 0:0|2:4] [--block-size 128] [--dampening 0.01] [--batch-size 4]
       [--owl-m M --owl-lmbda L] --out OUT.npz
"""

import argparse
import os
import sys
import time

T0 = time.time()
for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ[k] = "1"  # no hub at all
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--method", required=True, choices=["wanda", "sparsegpt"])
    ap.add_argument("--sparsity", type=float, default=0.5)
    ap.add_argument("--mask-structure", default="0:0")
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--dampening", type=float, default=0.01)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--owl-m", type=float, default=None)
    ap.add_argument("--owl-lmbda", type=float, default=None)
    ap.add_argument("--out", required=True)
    return ap.parse_args()


def placeholder_tokenizer():
    """oneshot loads a processor from the model's folder whenever a dataset is given, and fails if
    there is none; the data here is token IDs already, so any tokenizer does: a one-word one."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({"<unk>": 0}, "<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>")


def owl_sparsities(model, data, args, common):
    """OWL's per-decoder-layer sparsities by llm-compressor's own code (the modifier's
    _infer_owl_layer_sparsity and its activation hooks), on the calibration batches.

    NOTE: llmcompressor 0.14.0.1's oneshot fails with sparsity_profile="owl": the modifier collects
    OWL's activations in on_initialize through the basic pipeline, whose calibration_start event the
    lifecycle refuses before initialization ("Cannot invoke event before initializing"), and the
    per-layer dict it would then hold is passed whole as each layer's sparsity. So the activations
    pass runs here as plain forward passes, and the sparsities go to oneshot as the list (one per
    target decoder layer) that the modifiers accept."""
    import torch
    from compressed_tensors.utils import match_named_modules

    import llmcompressor.pipelines.basic as basic
    from llmcompressor.modifiers.pruning import WandaPruningModifier

    def forward_only(model, dataloader):
        with torch.no_grad():
            for batch in dataloader:
                model(**batch)

    basic.run_calibration = forward_only  # _get_activations imports it when called
    probe = WandaPruningModifier(**{**common, "sparsity_profile": "owl", "owl_m": args.owl_m,
                                    "owl_lmbda": args.owl_lmbda})
    layers = dict(match_named_modules(model, common["targets"]))
    loader = torch.utils.data.DataLoader(data.with_format("torch"), batch_size=args.batch_size)
    by_layer = probe._infer_owl_layer_sparsity(model, layers, loader)
    return [float(by_layer[name]) for name in layers]


def main():
    args = parse()
    import numpy as np
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    import llmcompressor
    from llmcompressor import oneshot
    from llmcompressor.modifiers.pruning import SparseGPTModifier, WandaPruningModifier
    from llmcompressor.modifiers.pruning.sparsegpt import base as sgpt_base
    from llmcompressor.modifiers.pruning.wanda import base as wanda_base

    torch.manual_seed(0)
    ids = np.load(args.ids)
    if ids.ndim != 2 or ids.dtype.kind not in "iu":
        sys.exit(f"{args.ids}: want integer token IDs [N, T], got {ids.dtype} {list(ids.shape)}")
    n, t = ids.shape

    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    # Every sample the same length: no padding, no truncation; a mask of ones (causal attention
    # only, as the ONNX export without an attention_mask input computes).
    data = Dataset.from_dict({"input_ids": ids.astype(np.int64).tolist(),
                              "attention_mask": np.ones_like(ids, dtype=np.int64).tolist()})

    # What llm-compressor computed, per module, captured as it prunes (the calls are its own).
    names, captured = {}, {}

    def capture(module_stats, key, orig):
        def wrapped(module, **kw):
            name = names[module]
            stats = kw[module_stats]
            captured[f"{key}:{name}"] = stats[module].detach().clone().cpu().numpy()
            captured[f"sparsity:{name}"] = np.float64(kw["sparsity"])
            return orig(module=module, **kw)
        return wrapped

    wanda_base.sparsify_weight = capture("row_scalars_dict", "scalars", wanda_base.sparsify_weight)
    sgpt_base.sparsify_weight = capture("hessians_dict", "hessian", sgpt_base.sparsify_weight)

    common = dict(sparsity=args.sparsity, mask_structure=args.mask_structure,
                  targets=[r"re:model\.layers\.\d+$"], ignore=["re:.*lm_head"])
    if args.owl_m is not None:
        common["sparsity"] = owl_sparsities(model, data, args, common)
    if args.method == "wanda":
        modifier = WandaPruningModifier(**common)
    else:
        modifier = SparseGPTModifier(block_size=args.block_size, dampening_frac=args.dampening,
                                     **common)

    # NOTE: keyed by module (llm-compressor's hooks see modules, not names).
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            names[module] = f"{name}.weight"

    t0 = time.time()
    oneshot(model=model, tokenizer=placeholder_tokenizer(), dataset=data, recipe=modifier,
            pipeline="sequential", batch_size=args.batch_size, num_calibration_samples=n,
            shuffle_calibration_samples=False, max_seq_length=t, output_dir=None)
    wall = time.time() - t0

    pruned = {k[len("sparsity:"):] for k in captured if k.startswith("sparsity:")}
    if not pruned:
        sys.exit("llm-compressor pruned no layer")
    params = dict(model.named_parameters())
    out = {name: params[name].detach().cpu().numpy().astype(np.float32) for name in sorted(pruned)}
    out.update(captured)
    out["wall_s"] = np.float64(wall)
    out["total_s"] = np.float64(time.time() - T0)
    np.savez(args.out, **out)
    zeros = sum(int((out[k] == 0).sum()) for k in pruned) / sum(out[k].size for k in pruned)
    print(f"llm-compressor {llmcompressor.__version__} {args.method} {args.mask_structure} "
          f"sparsity {args.sparsity}: {len(pruned)} layers, {zeros:.4f} zeros, oneshot {wall:.1f}s "
          f"(torch {torch.__version__}, {n} samples x {t} tokens)")


if __name__ == "__main__":
    main()
