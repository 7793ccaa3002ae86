"""Structured pruning of nn.Modules in Python: lopper.prune_structured vs Torch-Pruning.

Every model is built once (random weights, fixed seed, eval mode) and deep-copied for each pruning,
so every tool prunes the same weights; each prunes its copy in place, half the channels:

  * lopper: `lopper.prune_structured(model, example_inputs, amount=0.5)` (whole channels, l1,
    local: each channel group loses half its channels; lopper exports the module to ONNX, prunes
    the export, shrinks the module to match and checks that the shrunk module computes what the
    pruned graph computes, raising when it does not).
  * lopper_heads (models with attention only): `prune_structured(..., unit="head", amount=0.5)`
    then the call above on the result: half the heads, then half of each channel group, the
    nearest lopper comes to what Torch-Pruning removes from a transformer in one call.
  * tp, Torch-Pruning (the peer, PyPI `torch-pruning`) as its README and examples use it
    (README's BasePruner, examples/torchvision_models, examples/transformers/prune_hf_bert.py,
    examples/LLMs/prune_llm.py): `tp.pruner.BasePruner(model, example_inputs, importance=
    tp.importance.GroupMagnitudeImportance(p=1), pruning_ratio=0.5, global_pruning=False,
    ignored_layers=<the output layers>)` then `pruner.step()`; ViT with `round_to=num_heads` and
    `model.hidden_dim` set after; the transformers models with `num_heads={q/k/v Linear: heads}`,
    `prune_num_heads=True, prune_head_dims=False, head_pruning_ratio=0.5` and the attention
    modules' head counts set after, as those examples do (LLaMA also `round_to=4`, as
    prune_llm.py). The output layers left whole: the torchvision classifier (the Linear with 1000
    outputs), BERT's `classifier`, LLaMA's `lm_head`. p=1 and local ranking match lopper's l1,
    local (the examples use p=2 and, for BERT, global ranking).

Measured per tool: wall time (and the process's CPU time, all threads) of the pruning call
(lopper: everything prune_structured does, the export and its check included; Torch-Pruning:
building the pruner, i.e. tracing the module into its dependency graph, plus step() and the
attribute fix-ups), params (sum of p.numel()) and MACs after, both tools' results counted by one
counter (`tp.utils.count_ops_and_params`: module hooks on Conv/Linear/norm/MultiheadAttention...,
so the transformers models' attention-score matmuls, which are functional, are not counted), and
whether the pruned module runs on the example input and on a batch of 2 with the original output's
shape (batch aside) and finite values. Each tool first prunes a small CNN once, untimed (imports,
the exporter's first use). The tools take turns --repeats times per model (order reversed every
other time); the times are medians, the wall time's range is shown; params, MACs and the runs
check are from the first pruning. A tool's failure on a model is that row's "error: <first line>"
(the traceback is in the JSON) and the run goes on; a pruning that takes longer than --timeout
seconds is stopped (a Python loop only: SIGALRM) and is an error. torch runs on --threads threads.

Models: torchvision resnet18, resnet50, mobilenet_v2, mobilenet_v3_small, densenet121,
efficientnet_b0, vit_b_16 (weights=None, 1x3x224x224); transformers (random init from a config, no
hub): bert — BertForSequenceClassification, hidden 256, 4 layers, 4 heads, FFN 1024 (BERT-mini's
shape), 2 labels, input_ids/attention_mask/token_type_ids [1, 32]; llama — LlamaForCausalLM,
hidden 256, 4 layers, 8 heads, 4 key/value heads (grouped-query attention), FFN 688, vocab 32000,
use_cache off, input_ids [1, 32]; llama_mha — the same with 8 key/value heads.

Usage: PYTHONPATH=build/python .venv/bin/python bench/python_structured.py [--models a,b,...]
       [--tools lopper,lopper_heads,tp] [--amount 0.5] [--repeats 3] [--timeout 300]
       [--threads 2] [--json PATH]
"""

import argparse
import copy
import gc
import os
import platform
import signal
import statistics
import sys
import time
import traceback
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402

from results import git_rev, save_json  # noqa: E402 (bench/results.py)

VISION = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "densenet121",
          "efficientnet_b0", "vit_b_16"]
DEFAULT = VISION + ["bert", "llama", "llama_mha"]


class Spec:
    """A model to prune: the module, how it is called, and how Torch-Pruning is told about it."""

    def __init__(self, name, model, inputs, inputs2, kind):
        self.name, self.model, self.inputs, self.inputs2, self.kind = name, model, inputs, inputs2, kind


def build(name):
    torch.manual_seed(0)
    if name in VISION:
        import torchvision

        model = getattr(torchvision.models, name)(weights=None).eval()
        g = torch.Generator().manual_seed(1)
        return Spec(name, model, torch.randn(1, 3, 224, 224, generator=g),
                    torch.randn(2, 3, 224, 224, generator=g), "vit" if name.startswith("vit") else "cnn")
    g = torch.Generator().manual_seed(1)
    if name == "bert":
        from transformers import BertConfig, BertForSequenceClassification

        cfg = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                         intermediate_size=1024, num_labels=2)
        model = BertForSequenceClassification(cfg).eval()

        def feed(b):
            ids = torch.randint(0, cfg.vocab_size, (b, 32), generator=g)
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                    "token_type_ids": torch.zeros_like(ids)}

        return Spec(name, model, feed(1), feed(2), "bert")
    if name in ("llama", "llama_mha"):
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                          num_key_value_heads=4 if name == "llama" else 8, intermediate_size=688,
                          use_cache=False)
        model = LlamaForCausalLM(cfg).eval()

        def feed(b):
            return {"input_ids": torch.randint(0, cfg.vocab_size, (b, 32), generator=g)}

        return Spec(name, model, feed(1), feed(2), "llama")
    raise SystemExit(f"unknown model {name} (known: {', '.join(DEFAULT)})")


def call(model, inputs):
    with torch.no_grad():
        out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    return out.logits if hasattr(out, "logits") else out


def params(model):
    return sum(p.numel() for p in model.parameters())


def macs(model, inputs):
    import torch_pruning as tp

    with torch.no_grad():
        m, _ = tp.utils.count_ops_and_params(model, inputs)
    return int(m)


def first_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


# ---- the tools -------------------------------------------------------------------------------


def prune_lopper(spec, model, amount):
    import lopper

    report = lopper.prune_structured(model, spec.inputs, amount=amount)
    return {"report": report.to_dict() if hasattr(report, "to_dict") else str(report)}


def prune_lopper_heads(spec, model, amount):
    import lopper

    heads = lopper.prune_structured(model, spec.inputs, unit="head", amount=amount)
    channels = lopper.prune_structured(model, spec.inputs, amount=amount)
    return {"report": [r.to_dict() if hasattr(r, "to_dict") else str(r) for r in (heads, channels)]}


def prune_tp(spec, model, amount):
    import torch_pruning as tp

    imp = tp.importance.GroupMagnitudeImportance(p=1)
    kw = dict(importance=imp, pruning_ratio=amount, global_pruning=False, iterative_steps=1)
    if spec.kind in ("cnn", "vit"):
        ignored = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == 1000]
        if spec.kind == "vit":
            kw["round_to"] = model.encoder.layers[0].num_heads  # examples/torchvision_models
        pruner = tp.pruner.BasePruner(model, spec.inputs, ignored_layers=ignored, **kw)
        pruner.step()
        if spec.kind == "vit":  # torchvision's ViT reshapes with hidden_dim
            model.hidden_dim = model.conv_proj.out_channels
    elif spec.kind == "bert":
        from transformers.models.bert.modeling_bert import BertSelfAttention

        num_heads = {}
        for m in model.modules():
            if isinstance(m, BertSelfAttention):
                for lin in (m.query, m.key, m.value):
                    num_heads[lin] = m.num_attention_heads
        pruner = tp.pruner.BasePruner(
            model, spec.inputs, num_heads=num_heads, prune_num_heads=True, prune_head_dims=False,
            head_pruning_ratio=amount, output_transform=lambda out: out.logits.sum(),
            ignored_layers=[model.classifier], **kw)
        pruner.step()
        for m in model.modules():  # examples/transformers/prune_hf_bert.py
            if isinstance(m, BertSelfAttention):
                m.num_attention_heads = pruner.num_heads[m.query]
                m.attention_head_size = m.query.out_features // m.num_attention_heads
                m.all_head_size = m.query.out_features
    elif spec.kind == "llama":
        cfg = model.config
        num_heads = {}
        for name, m in model.named_modules():
            if name.endswith("self_attn"):
                num_heads[m.q_proj] = cfg.num_attention_heads
                num_heads[m.k_proj] = cfg.num_key_value_heads
                num_heads[m.v_proj] = cfg.num_key_value_heads
        pruner = tp.pruner.BasePruner(
            model, spec.inputs, num_heads=num_heads, prune_num_heads=True, prune_head_dims=False,
            head_pruning_ratio=amount, output_transform=lambda out: out.logits.sum(),
            ignored_layers=[model.lm_head], round_to=4, **kw)  # examples/LLMs/prune_llm.py
        pruner.step()
        model.config.hidden_size = model.lm_head.in_features
        for name, m in model.named_modules():
            if name.endswith("self_attn"):
                m.num_key_value_groups = m.q_proj.out_features // m.k_proj.out_features
            elif name.endswith("mlp"):
                model.config.intermediate_size = m.gate_proj.out_features
    else:
        raise AssertionError(spec.kind)
    return {}


TOOLS = {"lopper": prune_lopper, "lopper_heads": prune_lopper_heads, "tp": prune_tp}
TOOL_NAMES = {"lopper": "lopper", "lopper_heads": "lopper, heads then channels",
              "tp": "Torch-Pruning"}


def runs(model, inputs, want):
    """'yes' when the module runs on inputs with the original output's shape (batch aside)."""
    try:
        y = call(model, inputs)
    except Exception as e:  # noqa: BLE001 - the cell says why
        return f"no ({first_line(e)})"
    if tuple(y.shape[1:]) != tuple(want[1:]):
        return f"no: output {list(y.shape)}, was {list(want)}"
    if not torch.isfinite(y).all():
        return "no: non-finite output"
    return "yes"


class Timeout(Exception):
    pass


def on_alarm(signum, frame):
    raise Timeout(f"did not finish in {on_alarm.limit} s")


def measure(spec, tool, amount, before, limit, full=True):
    """One pruning of a fresh copy by `tool`: its row (time, or the error), and with `full` what
    the result is: params, MACs, whether it runs."""
    model = copy.deepcopy(spec.model)
    row = {"model": spec.name, "tool": tool}
    # NOTE: SIGALRM interrupts Python code only (a pure-Python loop such as Torch-Pruning's group
    # search); a C++ call that holds on runs to its end first.
    on_alarm.limit = limit
    # NOTE: the garbage of the tool before (Torch-Pruning's dependency graph: a large cycle of
    # Python objects) is collected first, untimed: else the next tool's own collections walk it,
    # and lopper, which allocates many objects, ran 2.5x slower right after Torch-Pruning.
    gc.collect()
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(limit)
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        extra = TOOLS[tool](spec, model, amount)
    except Exception as e:  # noqa: BLE001 - one model's failure is a row, not the end of the run
        row["prune_s"] = round(time.perf_counter() - t0, 2)
        row["cpu_s"] = round(time.process_time() - c0, 2)
        row["error"] = first_line(e)
        row["traceback"] = traceback.format_exc(limit=-6)
        return row
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    row["prune_s"] = round(time.perf_counter() - t0, 2)
    row["cpu_s"] = round(time.process_time() - c0, 2)
    if not full:
        return row
    row.update(extra)
    model.eval()
    row["params"] = params(model)
    try:
        row["macs"] = macs(model, spec.inputs)
    except Exception as e:  # noqa: BLE001
        row["macs"] = None
        row["macs_error"] = first_line(e)
    row["runs_b1"] = runs(model, spec.inputs, before["out_shape"])
    row["runs_b2"] = runs(model, spec.inputs2, before["out_shape"]) if before["b2_ok"] else "n/a"
    return row


def warm_up(tools, amount):
    """Each tool prunes a small CNN once, untimed: what a process pays once (imports, the ONNX
    exporter's first use) is not charged to the first model."""
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 16, 3),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 1000)).eval()
    x = torch.randn(1, 3, 32, 32)
    spec = Spec("warm-up", model, x, x, "cnn")
    for tool in tools:
        if tool != "lopper_heads":
            row = measure(spec, tool, amount, {"out_shape": [1, 1000], "b2_ok": False}, 300, full=False)
            print(f"warm-up {tool}: {row['prune_s']:.2f}s" + (f" error: {row['error']}" if "error" in row else ""),
                  flush=True)


def fmt_ratio(after, before):
    return "-" if after is None else f"{after / 1e6:.2f} M ({after / before:.3f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(DEFAULT))
    ap.add_argument("--tools", default="lopper,lopper_heads,tp")
    ap.add_argument("--amount", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3,
                    help="prune each model this many times per tool, timing the median (default 3)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds a tool may take on a model")
    ap.add_argument("--json", help="write the rows and the machine here")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tools = a.tools.split(",")
    for t in tools:
        if t not in TOOLS:
            sys.exit(f"unknown tool {t} ({', '.join(TOOLS)})")
    for m in a.models.split(","):
        if m not in DEFAULT:
            sys.exit(f"unknown model {m} ({', '.join(DEFAULT)})")
    versions = {"torch": torch.__version__, "python": platform.python_version()}
    for mod, key in (("torchvision", "torchvision"), ("transformers", "transformers"),
                     ("torch_pruning", "torch-pruning"), ("lopper", "lopper")):
        try:
            versions[key] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001
            versions[key] = f"not importable: {first_line(e)}"
    try:
        import importlib.metadata as md

        versions["torch-pruning"] = md.version("torch-pruning")  # its __version__ says 1.6.0
    except Exception:  # noqa: BLE001
        pass
    load_start = os.getloadavg()
    print(f"load average at start: {load_start[0]:.2f}; {versions}", flush=True)
    if load_start[0] > 0.5:
        print("note: the machine is busy: with another process on a core, every torch op's OpenMP team "
              "waits for its descheduled thread, and times swing by multiples", flush=True)

    warm_up(tools, a.amount)
    rows, befores = [], {}
    names = a.models.split(",")
    for i, name in enumerate(names):
        t0 = time.perf_counter()
        try:
            spec = build(name)
            y = call(spec.model, spec.inputs)
            try:
                b2_ok = call(spec.model, spec.inputs2).shape[0] == 2
            except Exception:  # noqa: BLE001
                b2_ok = False
            before = {"params": params(spec.model), "macs": macs(spec.model, spec.inputs),
                      "out_shape": list(y.shape), "b2_ok": b2_ok}
        except Exception as e:  # noqa: BLE001
            print(f"[{i + 1}/{len(names)}] {name}: cannot build: {first_line(e)}", flush=True)
            rows.append({"model": name, "tool": "-", "error": f"build: {first_line(e)}"})
            continue
        befores[name] = before
        print(f"[{i + 1}/{len(names)}] {name}: {before['params'] / 1e6:.2f} M params, "
              f"{before['macs'] / 1e6:.1f} M MACs, output {before['out_shape']} "
              f"({time.perf_counter() - t0:.1f}s to build and count)", flush=True)
        # NOTE: the tools take turns, the order reversed every other repetition, so that a slow
        # spell of the shared machine hits both; the time is the median over the repetitions,
        # what the result is comes from the first. A tool that failed is not run again.
        mine = [t for t in tools if not (t == "lopper_heads" and spec.kind == "cnn")]  # no heads
        first = {}
        for rep in range(a.repeats):
            for tool in (mine if rep % 2 == 0 else mine[::-1]):
                if rep > 0 and "error" in first[tool]:
                    continue
                row = measure(spec, tool, a.amount, before, a.timeout, full=rep == 0)
                if rep == 0:
                    row.update(params_before=before["params"], macs_before=before["macs"],
                               out_shape=before["out_shape"], prune_s_all=[row["prune_s"]],
                               cpu_s_all=[row["cpu_s"]])
                    first[tool] = row
                elif "error" in row:
                    first[tool].setdefault("repeat_errors", []).append(row["error"])
                else:
                    first[tool]["prune_s_all"].append(row["prune_s"])
                    first[tool]["cpu_s_all"].append(row["cpu_s"])
                if "error" in row:
                    what = f"  error: {row['error']}"
                elif rep == 0:
                    m = "-" if row["macs"] is None else f"{row['macs'] / before['macs']:.3f}"
                    what = (f"  params {row['params'] / before['params']:.3f}  MACs {m}  runs b1 "
                            f"{row['runs_b1']}  b2 {row['runs_b2']}")
                else:
                    what = ""
                print(f"    {tool:12s} #{rep + 1} {row['prune_s']:7.2f}s (CPU {row['cpu_s']:6.2f}s){what}",
                      flush=True)
        for tool in mine:
            row = first[tool]
            row["prune_s"] = round(statistics.median(row["prune_s_all"]), 2)
            row["cpu_s"] = round(statistics.median(row["cpu_s_all"]), 2)
            rows.append(row)
        del spec, first

    meta = {"machine": cpu_name(), "cores": os.cpu_count(), "threads": a.threads,
            "platform": platform.platform(), "versions": versions, "amount": a.amount,
            "command": " ".join(["bench/python_structured.py"] + sys.argv[1:]),
            "git": git_rev(), "date": time.strftime("%Y-%m-%d"),
            "loadavg_start": [round(x, 2) for x in load_start],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            "macs_counter": "torch_pruning.utils.count_ops_and_params (module hooks)"}

    print("\n| model | params / MACs before | tool | prune s (range) | CPU s | params after (/ before) "
          "| MACs after (/ before) | runs, output shape kept (batch 1 / 2) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        b = befores.get(r["model"])
        head = f"{b['params'] / 1e6:.2f} M / {b['macs'] / 1e6:.0f} M" if b else "-"
        name = TOOL_NAMES.get(r["tool"], r["tool"])
        if "error" in r:
            print(f"| {r['model']} | {head} | {name} | {r.get('prune_s', '-')} | {r.get('cpu_s', '-')} "
                  f"| error: {r['error']} | | |")
            continue
        times = r["prune_s_all"]
        spread = f" ({min(times):.2f}–{max(times):.2f})" if len(times) > 1 else ""
        print(f"| {r['model']} | {head} | {name} | {r['prune_s']:.2f}{spread} | {r['cpu_s']:.2f} "
              f"| {fmt_ratio(r['params'], b['params'])} "
              f"| {fmt_ratio(r['macs'], b['macs'])} | {r['runs_b1']} / {r['runs_b2']} |")
    print(f"\n{meta['machine']}, {meta['cores']} cores, torch on {a.threads} threads; load average "
          f"{meta['loadavg_start'][0]} at start, {meta['loadavg_end'][0]} at the end; {versions}")
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        save_json(a.json, {"meta": meta, "before": befores, "rows": rows}, indent=1, default=str)
        print(f"wrote {a.json}")


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    main()
