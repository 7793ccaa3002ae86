"""Structured pruning of an LLM without recovery training: depth vs width vs both. Held-out
perplexity, parameters and the pruning's wall time after removing about 25% (and 50%) of the
parameters of a trained LLaMA by whole decoder layers, by width (attention heads, MLP neurons, the
hidden size) or by both, each from a fresh copy of the dense model, through
lopper.prune_structured in place.

The model is bench/llm_corpus.py's: a byte-level LLaMA (LlamaForCausalLM: 4 layers, hidden 256,
MLP 768, 4 heads of 64, untied lm_head; 3.54 M parameters) trained on Jane Austen's six novels,
cached in ~/.cache/lopper/llm-corpus/<key>/ after its first run. Calibration: its 128 training
windows of 128 bytes (calib.npy) as CALIB_BATCHES batches of {"input_ids": LongTensor[16, 128]},
all of them read (calib_batches=CALIB_BATCHES). Held-out: --eval-windows windows of heldout.npy
spread evenly over the split (llm_corpus.eval_subset; 0: all 2793), one evaluator for every row
(llm_corpus.perplexity on the pruned module itself). Example inputs (the export's shapes, the
checks' batch): the first 2 calibration windows.

Rows, per target share of the parameters (every count is the module's own parameters, embedding
and lm_head included; "removed" is the exact share, 1 - params / dense params):
  depth   unit="layer": method influence (ShortGPT's block influence), loss (the model's own loss
          with each layer skipped) and random (no data; seeds 0-3). A layer is 852,480 parameters
          (24.07%): 25% is one layer, 50% two.
  width   method="activation" (Minitron's activation importance), amounts solved so that the
          pruned sizes land nearest the target (solve_amount: the sizes each amount gives, as
          lopper rounds them, counted on a LlamaForCausalLM of that config on the meta device):
            mlp+hidden        unit="channel", one amount A: every MLP (intermediate 768) and the
                              hidden size (256: embedding, norms, every projection, lm_head's
                              input) lose round(A x size). On this model unit="channel" covers
                              those two only: q/k's head_dim is kept (rotary's Mul is a barrier)
                              and v/o's head_dim is kept (LlamaAttention reshapes by it); heads go
                              with unit="head".
            heads+mlp+hidden  unit="head", amount 0.25 (1 of 4 heads per layer, 7.4% of the
                              parameters), then unit="channel" with A solved for the rest (the
                              second call calibrates on the head-pruned model).
            mlp only          unit="channel" with a recipe: the hidden-size group skipped, the
                              MLPs at A.
            hidden only       unit="channel" with a recipe: the hidden size at A, the MLPs at 0.
            mlp+hidden random the mlp+hidden amount, method="random" (seed 0): the width baseline.
          The recipes name the hidden-size group by lm_head (its input columns are in the group:
          see RECIPE_HIDDEN); rules need a method to parse, and prune_structured's method= ranks.
          Every unit="channel" call has round_to = the head count: transformers' LlamaConfig
          refuses a hidden size that is not a multiple of the heads, and prune_structured
          (reloadable=True) refuses a prune whose config would not save. For the same reason the
          unit="head" call (4 -> 3 heads, hidden 256) runs with reloadable=False; the channel call
          after it makes the config describe heads and sizes (multiples of 3).
  both    unit="layer" influence, 1 layer, then the width axes (mlp+hidden) with A solved for the
          total (50% only: at 25% one layer is already 24.07% of the parameters).
Each pruned model also goes through save_pretrained + from_pretrained (its config must describe
it) and must give the same logits (reload in the JSON).

Usage:
  PYTHONPATH=build/python .venv/bin/python bench/llm_structured.py [--targets 0.25,0.5]
      [--eval-windows 1024] [--threads 2] [--only SUBSTRING] [--out docs/bench-llm-structured.json]
  --table FILE: print the markdown table of a results file.
"""

import argparse
import copy
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llm_corpus  # noqa: E402
from results import git_rev, save_json  # noqa: E402  (bench/results.py)

CALIB_BATCHES = 8  # x 16 windows = the 128 calibration windows
CALIB_BATCH = 16
EXAMPLE = 2  # example inputs: the first 2 calibration windows
HEAD_AMOUNT = 0.25  # 1 of 4 heads per layer
RANDOM_SEEDS = (0, 1, 2, 3)
# Recipes (unit="channel"): the hidden-size group is the one with lm_head's input columns (lm_head's
# own group, its output rows, is a graph output and kept); the MLP groups are matched by "mlp" (the
# hidden-size group holds the MLP projections too, so its rule comes first: first match wins).
RECIPE_HIDDEN = "^lm_head"


def log(msg):
    print(f"[llm-structured] {msg}", file=sys.stderr, flush=True)


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return platform.processor()
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    return (f"{fields.get('Model name', '?')} (family {fields.get('CPU family', '?')}, model "
            f"{fields.get('Model', '?')}), {fields.get('CPU(s)', '?')} CPUs")


# --- sizes --------------------------------------------------------------------------------------

def count_params(cfg):
    """Parameters of a LlamaForCausalLM of config dict cfg (built on the meta device)."""
    import torch
    import transformers as T

    with torch.device("meta"):
        m = T.LlamaForCausalLM(T.LlamaConfig(**cfg))
    return sum(p.numel() for p in m.parameters())


def removed(size, amount, round_to=1):
    """How many of a group's `size` channels lopper removes at share `amount`: round(amount x
    size), half to even as torch's round, at least one kept, the kept count rounded up to a
    multiple of round_to (src/prune/structured.cpp's cap)."""
    kept = size - min(size - 1, int(round(amount * size)))
    kept = min(size, -(-kept // round_to) * round_to)
    return size - kept


def sizes_after(cfg, axes, amount):
    """The config after pruning `axes` ("mlp", "hidden") at `amount` each, with round_to the
    head count (see ROUND_TO)."""
    out, r = dict(cfg), cfg["num_attention_heads"]
    if "mlp" in axes:
        out["intermediate_size"] = cfg["intermediate_size"] - removed(cfg["intermediate_size"], amount, r)
    if "hidden" in axes:
        out["hidden_size"] = cfg["hidden_size"] - removed(cfg["hidden_size"], amount, r)
    return out


def solve_amount(cfg, axes, goal, dense):
    """The amount (a multiple of 1/2000) whose sizes leave the count nearest `goal` parameters,
    with the share it removes from `dense`; cfg is the config before this call."""
    best, seen = None, {}
    for k in range(1, 1600):
        a = k / 2000
        after = sizes_after(cfg, axes, a)
        key = (after["intermediate_size"], after["hidden_size"])
        if key not in seen:
            try:
                seen[key] = count_params(after)
            except Exception:  # noqa: BLE001 (a config transformers refuses, hidden % heads: not a size
                seen[key] = None  # that prune_structured(reloadable=True) gives)
        if seen[key] is None:
            continue
        err = abs(seen[key] - goal)
        if best is None or err < best[0]:
            best = (err, a, seen[key])
    return best[1], 1 - best[2] / dense


# --- the configurations -------------------------------------------------------------------------

def jobs(targets, cfg, dense):
    """[(target, axis, name, [call, ...], note)]: each call a dict of prune_structured's keyword
    arguments (data added where the method reads it)."""
    out = []
    cfg = dict(cfg, head_dim=cfg["hidden_size"] // cfg["num_attention_heads"])
    layers, r = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    for t in targets:
        goal = (1 - t) * dense
        n = max(1, min(layers - 1, round(t * layers)))  # whole layers nearest the target
        for m in ("influence", "loss"):
            out.append((t, "depth", f"{n} layer(s), {m}", [dict(unit="layer", method=m, amount=n)], ""))
        for s in RANDOM_SEEDS:
            out.append((t, "depth", f"{n} layer(s), random seed {s}",
                        [dict(unit="layer", method="random", amount=n, seed=s)], ""))
        a, share = solve_amount(cfg, ("mlp", "hidden"), goal, dense)
        out.append((t, "width", "mlp+hidden", [dict(unit="channel", method="activation", amount=a, round_to=r)],
                    f"solved: {share:.4f}"))
        heads = dict(cfg, num_attention_heads=cfg["num_attention_heads"]
                     - removed(cfg["num_attention_heads"], HEAD_AMOUNT))
        heads["num_key_value_heads"] = heads["num_attention_heads"]
        a2, share2 = solve_amount(heads, ("mlp", "hidden"), goal, dense)
        out.append((t, "width", "heads+mlp+hidden",
                    [dict(unit="head", method="activation", amount=HEAD_AMOUNT, reloadable=False),
                     dict(unit="channel", method="activation", amount=a2,
                          round_to=heads["num_attention_heads"])], f"solved: {share2:.4f}"))
        a3, share3 = solve_amount(cfg, ("mlp",), goal, dense)
        if abs(share3 - t) < 0.02:  # the MLPs alone may not hold the target
            out.append((t, "width", "mlp only", [dict(unit="channel", method="activation", round_to=r, recipe={
                "defaults": {"method": "l1", "amount": 0.0},
                "rules": [{"match": RECIPE_HIDDEN, "skip": True}, {"match": "mlp", "amount": a3}]})],
                f"solved: {share3:.4f}"))
        a4, share4 = solve_amount(cfg, ("hidden",), goal, dense)
        out.append((t, "width", "hidden only", [dict(unit="channel", method="activation", round_to=r, recipe={
            "defaults": {"method": "l1", "amount": 0.0}, "rules": [{"match": RECIPE_HIDDEN, "amount": a4}]})],
            f"solved: {share4:.4f}"))
        out.append((t, "width", "mlp+hidden, random", [dict(unit="channel", method="random", amount=a,
                                                            round_to=r, seed=0)], f"solved: {share:.4f}"))
        if t > 0.3:  # one layer, the rest by width (at 25% one layer is already 24%)
            rest = dict(cfg, num_hidden_layers=layers - 1)
            a5, share5 = solve_amount(rest, ("mlp", "hidden"), goal, dense)
            out.append((t, "both", "1 layer (influence) + mlp+hidden",
                        [dict(unit="layer", method="influence", amount=1),
                         dict(unit="channel", method="activation", amount=a5, round_to=r)], f"solved: {share5:.4f}"))
    return out


# --- running ------------------------------------------------------------------------------------

def shape_of(model):
    c = model.config
    return dict(layers=c.num_hidden_layers, hidden=c.hidden_size, intermediate=c.intermediate_size,
                heads=c.num_attention_heads, kv_heads=c.num_key_value_heads,
                head_dim=getattr(c, "head_dim", None))


def reload_check(model, x):
    """save_pretrained + from_pretrained: the same shapes and logits (max |diff|), or the error."""
    import torch
    import transformers as T

    with tempfile.TemporaryDirectory(prefix="lopper-llm-structured-") as d:
        try:
            model.save_pretrained(d)
            back = T.LlamaForCausalLM.from_pretrained(d, attn_implementation="eager", dtype="float32").eval()
        except Exception as e:  # noqa: BLE001 (reported, not hidden)
            return dict(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
    with torch.no_grad():
        a, b = model(input_ids=x).logits, back(input_ids=x).logits
    diff = float((a - b).abs().max()) if a.shape == b.shape else float("inf")
    return dict(ok=diff <= 1e-5, max_abs_diff=diff)


def run_job(job, dense_model, batches, example, eval_ids, dense_params):
    import lopper

    target, axis, name, calls, note = job
    model = copy.deepcopy(dense_model)
    steps, t_all = [], 0.0
    for call in calls:
        kw = dict(call)
        if kw["method"] not in ("random",):
            kw["data"] = batches
            kw["calib_batches"] = CALIB_BATCHES
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            try:
                report = lopper.prune_structured(model, example, progress=False, **kw)
            except Exception as e:  # noqa: BLE001 (a failure is a result: recorded and reported)
                err = f"{type(e).__name__}: {str(e).splitlines()[0][:500]}"
                log(f"  {name}: lopper.prune_structured({call}) failed: {err}")
                return dict(target=target, axis=axis, name=name, calls=calls, note=note, error=err)
            dt = time.perf_counter() - t0
        t_all += dt
        step = dict(call=call, seconds=round(dt, 3), report_params_before=int(report.params_before),
                    report_params=int(report.params),
                    warnings=sorted({str(w.message)[:300] for w in caught}))
        if call["unit"] == "layer":
            step["layers_removed"] = [g.layers[0] if g.layers else g.id for g in report.groups
                                      if g.size_after < g.size_before]
            step["scores"] = [round(float(g.score), 6) for g in report.groups]
        steps.append(step)
    params = sum(p.numel() for p in model.parameters())
    t0 = time.perf_counter()
    ppl = llm_corpus.perplexity(model, eval_ids)
    eval_s = time.perf_counter() - t0
    import torch

    reload = reload_check(model, torch.from_numpy(example["input_ids"].numpy()))
    return dict(target=target, axis=axis, name=name, note=note, calls=calls, steps=steps,
                shape=shape_of(model), params=int(params), removed=1 - params / dense_params,
                prune_s=round(t_all, 3), ppl=ppl, eval_s=round(eval_s, 1), reload=reload)


def describe(row):
    """The table's 'what went' cell."""
    s = row.get("shape")
    if not s:
        return ""
    bits = []
    for st in row["steps"]:
        if "layers_removed" in st:
            bits.append("layers " + ", ".join(str(x).rsplit(".", 1)[-1] for x in st["layers_removed"]))
    bits.append(f"{s['layers']}L h{s['hidden']} mlp{s['intermediate']} {s['heads']}x{s['head_dim']}")
    return "; ".join(bits)


def amounts(row):
    out = []
    for c in row["calls"]:
        if "recipe" in c:
            r = [x for x in c["recipe"]["rules"] if "amount" in x]
            out.append(f"{c['unit']}, " + ", ".join(
                f"{'hidden' if x['match'] == RECIPE_HIDDEN else x['match']} {x['amount']:g}" for x in r))
        elif c["unit"] == "layer":
            out.append(f"layer: {c['amount']}")
        else:
            out.append(f"{c['unit']} {c['amount']:g}")
    return " + ".join(out)


def label(name):
    return name.replace("1 layer(s)", "1 layer").replace("layer(s)", "layers")


def table(res):
    """The markdown table; the random-layer rows of a target are one row (each seed's perplexity
    and layers, in seed order; the longest pruning time of them)."""
    lines = ["| target | axis | configuration | amount(s) | removed | params | held-out ppl | prune s | "
             "what is left |",
             "|---|---|---|---|---|---|---|---|---|",
             f"| — | dense | — | — | 0 | {res['dense_params']:,} | {res['dense_ppl']:.3f} | — | "
             f"{res['dense_shape']} |"]
    rows, done = res["rows"], set()
    for i, r in enumerate(rows):
        if i in done:
            continue
        if "error" in r:
            lines.append(f"| {r['target']:.0%} | {r['axis']} | {r['name']} | {amounts(r)} | — | — | "
                         f"failed: {r['error'][:80]} | — | — |")
            continue
        if ", random seed " in r["name"]:
            same = [j for j, q in enumerate(rows) if q.get("target") == r["target"] and "error" not in q
                    and q["name"].split(", random seed ")[0] == r["name"].split(", random seed ")[0]
                    and ", random seed " in q["name"]]
            done.update(same)
            group = [rows[j] for j in same]
            seeds = [g["name"].rsplit(" ", 1)[-1] for g in group]
            picked = ["+".join(str(x).rsplit(".", 1)[-1] for x in g["steps"][0]["layers_removed"]) for g in group]
            lines.append(
                f"| {r['target']:.0%} | {r['axis']} | {label(r['name'].split(', random seed ')[0])}, random "
                f"(seeds {', '.join(seeds)}) | {amounts(r)} | {r['removed']:.2%} | {r['params']:,} | "
                + " / ".join(f"{g['ppl']:.3f}" for g in group)
                + f" | ≤ {max(g['prune_s'] for g in group):.1f} | layers {' / '.join(picked)} |")
            continue
        lines.append(f"| {r['target']:.0%} | {r['axis']} | {label(r['name'])} | {amounts(r)} | {r['removed']:.2%} | "
                     f"{r['params']:,} | {r['ppl']:.3f} | {r['prune_s']:.1f} | {describe(r)} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="0.25,0.5", help="shares of the parameters to remove (0.25,0.5)")
    ap.add_argument("--eval-windows", type=int, default=1024,
                    help="held-out windows evaluated, spread over the split; 0: all (1024)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (2)")
    ap.add_argument("--only", default="", help="run only the rows whose axis or name contains this")
    ap.add_argument("--out", default="", help="write the results here (JSON)")
    ap.add_argument("--table", default="", help="print the table of a results file and stop")
    a = ap.parse_args()
    if a.table:
        import json

        with open(a.table) as f:
            print(table(json.load(f)))
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers as T

    import lopper

    torch.set_num_threads(a.threads)
    T.utils.logging.disable_progress_bar()
    info = llm_corpus.prepare(threads=a.threads)
    dense_model = llm_corpus.load_model(info["dir"])
    dense_params = sum(p.numel() for p in dense_model.parameters())
    calib = np.load(info["calib"])
    batches = [{"input_ids": torch.from_numpy(calib[i:i + CALIB_BATCH])}
               for i in range(0, CALIB_BATCHES * CALIB_BATCH, CALIB_BATCH)]
    example = {"input_ids": torch.from_numpy(calib[:EXAMPLE])}
    eval_ids = llm_corpus.eval_subset(np.load(info["heldout"]), a.eval_windows)
    cfg = dict(info["config"])
    if count_params(dict(cfg, head_dim=cfg["hidden_size"] // cfg["num_attention_heads"])) != dense_params:
        sys.exit("[llm-structured] the parameter count of the config is not the model's")
    t0 = time.perf_counter()
    dense_ppl = llm_corpus.perplexity(dense_model, eval_ids)
    log(f"model {info['key']}: {dense_params:,} params; dense held-out perplexity {dense_ppl:.4f} on "
        f"{len(eval_ids)} windows ({time.perf_counter() - t0:.1f} s)")
    todo = jobs([float(x) for x in a.targets.split(",") if x], cfg, dense_params)
    if a.only:
        todo = [j for j in todo if a.only in j[1] or a.only in j[2]]
    s = shape_of(dense_model)
    res = dict(what="structured pruning without recovery: depth vs width vs both (bench/llm_structured.py)",
               date=datetime.date.today().isoformat(),
               model=dict((k, info[k]) for k in ("key", "hf", "calib", "heldout", "config", "train", "corpus")),
               dense_params=int(dense_params), dense_ppl=dense_ppl, dense_ppl_all_windows=info["dense_ppl"],
               dense_shape=f"{s['layers']}L h{s['hidden']} mlp{s['intermediate']} {s['heads']}x{s['head_dim']}",
               unigram_ppl=info["unigram_ppl"], eval_windows=int(len(eval_ids)),
               eval_tokens=int(eval_ids[:, 1:].size),
               settings=dict(calib_batches=CALIB_BATCHES, calib_batch=CALIB_BATCH, calib_windows=int(len(calib)),
                             example_inputs=f"input_ids [{EXAMPLE}, {calib.shape[1]}]", head_amount=HEAD_AMOUNT,
                             random_seeds=list(RANDOM_SEEDS), threads=a.threads, recovery="none"),
               env=dict(cpu=cpu_model(), machine=platform.machine(), cpus=os.cpu_count(),
                        python=platform.python_version(), torch=torch.__version__, transformers=T.__version__,
                        lopper=getattr(lopper, "__version__", "?"), commit=git_rev()),
               rows=[])
    for job in todo:
        log(f"{job[0]:.0%} {job[1]}: {job[2]} {job[4]}")
        row = run_job(job, dense_model, batches, example, eval_ids, dense_params)
        if "error" not in row:
            log(f"  removed {row['removed']:.2%} ({row['params']:,} params), ppl {row['ppl']:.4f}, prune "
                f"{row['prune_s']:.1f} s, eval {row['eval_s']:.1f} s, {describe(row)}"
                + ("" if row["reload"]["ok"] else f"; RELOAD: {row['reload']}"))
        res["rows"].append(row)
        if a.out:  # partial results survive an interrupted run
            save_json(a.out, res, indent=1, default=str)
    res["table"] = table(res)
    print(res["table"])
    if a.out:
        save_json(a.out, res, indent=1, default=str)


if __name__ == "__main__":
    main()
