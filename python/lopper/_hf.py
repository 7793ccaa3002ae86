"""What lopper does for a transformers model (a PreTrainedModel, passed as it comes): run it
without its key/value cache, and make its config describe the shapes pruning left, so that
save_pretrained + from_pretrained gives back the pruned model. Nothing here imports transformers:
a model is recognised by what it has (a config with to_dict, a class that builds from one)."""

import copy
import re
import inspect

import torch

# The config keys of an MLP's inner width, by architecture (LLaMA/Qwen2/BERT, GPT-2, DistilBERT,
# OPT/BART).
_INNER = ("intermediate_size", "n_inner", "hidden_dim", "ffn_dim")
# The config keys of the hidden size (the residual stream's width), by architecture.
_HIDDEN = ("hidden_size", "n_embd", "d_model", "dim")
# An MLP's first projections (their outputs are the inner width): LLaMA's gate/up, GPT-2's c_fc,
# DistilBERT's lin1, OPT's fc1; BERT's BertIntermediate.dense.
_UP = ("gate_proj", "up_proj", "c_fc", "lin1", "fc1", "w1", "w3")


def is_transformers_model(module):
    cfg = getattr(module, "config", None)
    return cfg is not None and hasattr(cfg, "to_dict") and hasattr(type(module), "_from_config")


def without_cache(module, kwargs):
    """`kwargs` with use_cache=False for a transformers model that would return its key/value
    cache (a DynamicCache no exporter knows, and a cost no pruning step needs): the model's config
    is left as it is, and a caller's own use_cache wins."""
    if module is None or "use_cache" in kwargs:
        return kwargs
    if getattr(getattr(module, "config", None), "use_cache", None) is None:
        return kwargs
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return kwargs
    if "use_cache" not in params:
        return kwargs
    return dict(kwargs, use_cache=False)


def out_features(sub):
    """A linear layer's output width (transformers' Conv1D keeps its weight [in, out])."""
    w = getattr(sub, "weight", None)
    if w is None or w.dim() != 2:
        return None
    return int(w.shape[1] if type(sub).__name__ == "Conv1D" else w.shape[0])


def first_attr(sub, names):
    """(name, value) of the first of `names` that `sub` holds as an int, else (None, None)."""
    for n in names:
        v = sub.__dict__.get(n)
        if isinstance(v, int) and not isinstance(v, bool):
            return n, v
    return None, None


def _widths(module, heads_names, kv_names, head_dim_names, query, key, fused):
    """The widths of every attention and MLP of `module`: sets of head counts, key/value head
    counts, head sizes and MLP inner widths (one value each where every layer agrees)."""
    heads, kv, head_dims, inner = set(), set(), set(), set()
    for sub in module.modules():
        children = dict(sub.named_children())
        hd = first_attr(sub, head_dim_names)[1]
        q = next((children[n] for n in query if n in children), None)
        k = next((children[n] for n in key if n in children), None)
        if hd and q is not None and k is not None and out_features(q) and out_features(k):
            heads.add(out_features(q) // hd)
            kv.add(out_features(k) // hd)
            head_dims.add(hd)
        elif hd and any(n in children for n in fused) and first_attr(sub, heads_names)[1]:
            heads.add(first_attr(sub, heads_names)[1])
            head_dims.add(hd)
        up = [children[n] for n in _UP if n in children and out_features(children[n])]
        if type(sub).__name__.endswith("Intermediate") and "dense" in children:
            up.append(children["dense"])
        if up:
            inner.add(out_features(up[0]))
    return heads, kv, head_dims, inner


def _shapes(module):
    return {n: tuple(t.shape) for n, t in module.state_dict().items()}


def follow_config(module, names, set_attr):
    """Makes a transformers model's config describe what pruning left: head and key/value head
    counts, the head size, the MLP's inner width, the hidden size (the input embedding's width),
    each under the architecture's own key, set through `set_attr(config, key, value)` (so that it
    can be undone). The new config is checked
    first by building the model's class from it (on the meta device: no memory) and comparing
    every tensor's shape. Returns None when the config describes the model, else (what, suspect):
    why save_pretrained + from_pretrained would not give this model back, and the parameter
    whose size the config cannot give ("" when it is not one). `names`: _structured's attribute
    names (heads, kv heads, head size, query, key, fused qkv)."""
    if not is_transformers_model(module):
        return None
    cfg = module.config
    heads, kv, head_dims, inner = _widths(module, *names)
    given = cfg.to_dict()
    updates = {}
    uneven = []
    hidden = set()
    try:
        emb = module.get_input_embeddings()
    except Exception:  # noqa: BLE001 (a model without one)
        emb = None
    if isinstance(getattr(emb, "weight", None), torch.Tensor) and emb.weight.dim() == 2:
        hidden.add(int(emb.weight.shape[1]))
    for what, values, keys in (("attention heads", heads, ("num_attention_heads",)),
                               ("key/value heads", kv, ("num_key_value_heads",)),
                               ("MLP widths", inner, _INNER),
                               ("hidden sizes", hidden, _HIDDEN)):
        key = next((k for k in keys if k in given or hasattr(cfg, k)), None)
        if key is None or not values:
            continue
        if len(values) > 1:
            uneven.append(f"{what} {sorted(values)}")
            continue
        (v,) = values
        if getattr(cfg, key, None) != v:
            updates[key] = v
    # The head size, where a new head count or hidden size would change the one the class
    # derives (hidden_size // num_attention_heads) or the config has its own.
    changed = "num_attention_heads" in updates or any(k in updates for k in _HIDDEN)
    if len(head_dims) == 1 and (changed or "head_dim" in given):
        (hd,) = head_dims
        if getattr(cfg, "head_dim", None) != hd:
            updates["head_dim"] = hd
    if uneven:
        return (f"the layers differ in width ({', '.join(uneven)}), and a config gives one width "
                f"to all", "")
    if not updates:
        return None
    new = copy.deepcopy(cfg)
    for k, v in updates.items():
        setattr(new, k, v)
    try:
        if hasattr(new, "validate"):  # the class validators save_pretrained runs (strict configs)
            new.validate()
        with torch.device("meta"):
            fresh = type(module)._from_config(new)
    except Exception as e:  # noqa: BLE001 (a config the class refuses: say so)
        why = e.__cause__ or e  # a failed validator's own error, not its wrapper's
        first = str(why).splitlines()[0] if str(why) else ""
        return (f"{type(module).__name__} does not build from a config with {_listed(updates)} "
                f"({type(why).__name__}: {first})", "")
    want, got = _shapes(module), _shapes(fresh)
    wrong = [n for n in want if n in got and got[n] != want[n]]
    if wrong:
        return (f"{type(module).__name__} built from its config with {_listed(updates)} has "
                f"{wrong[0]} {list(got[wrong[0]])}, not {list(want[wrong[0]])}: the config cannot "
                f"give that size", wrong[0])
    for k, v in updates.items():
        set_attr(cfg, k, v)
    return None


def _listed(updates):
    return ", ".join(f"{k}={v}" for k, v in updates.items())


def head_excluded(module, exclude):
    """`exclude` (a regex, or None) widened to the output head of a transformers model
    (get_output_embeddings(): lm_head), which lopper.prune leaves alone by default as
    llm-compressor and ModelOpt do; as it is for any other module."""
    if not is_transformers_model(module) or not isinstance(exclude, (str, type(None))):
        return exclude
    try:
        head = module.get_output_embeddings()
    except Exception:  # noqa: BLE001 (a model without one)
        return exclude
    if head is None or getattr(head, "weight", None) is None:
        return exclude
    names = set()
    for prefix, sub in module.named_modules(remove_duplicate=False):
        if sub is head:
            names.update({prefix, f"{prefix}.weight"})
    first = next((n for n, p in module.named_parameters() if p is head.weight), None)
    if first is not None:
        names.add(first)
    if not names:
        return exclude
    head_re = "^(?:{})$".format("|".join(re.escape(n) for n in sorted(names)))
    return head_re if exclude is None else f"(?:{exclude})|{head_re}"
