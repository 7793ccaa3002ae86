"""lopper.prune_structured(unit="layer"): whole decoder layers removed from a transformers model, in
place (depth pruning: ShortGPT's block influence, Minitron's depth axis).

This file runs the model: hooks on its decoder layers hand each layer's input and output hidden
states to lopper's C++ block influence (lopper/depth.h, the one `lopper prune --structured block`
uses), or run the model with one layer skipped for the loss criterion. The library chooses the
layers (amount, exclude, ties, random); this file takes them out of the model's layer list and
makes the model's bookkeeping follow: each kept layer's ``layer_idx`` (the key/value cache's slot),
the config's ``num_hidden_layers`` and its per-layer lists (``layer_types``, ...), so that
``generate()`` and ``save_pretrained`` + ``from_pretrained`` work. The shrunk model is checked
against the model run with the removed layers skipped; on any failure it is put back.
"""
import copy
import math

import torch

from lopper import _blocks, _hf, _lopper
from lopper._prune import _first_line, _Progress, _same_outputs, _split_inputs

_METHODS = ("influence", "loss", "random")


def prune_layers(module, example_inputs, *, method, amount, exclude, seed, data, calib_batches,
                 device, rtol, progress, reloadable, loss):
    if method is None:
        method = "influence"
    _lopper._prune_structured_onnx(b"", check_only=True, unit="block", method=method,
                                   amount=amount, exclude=exclude, seed=seed, data=data,
                                   calib_batches=int(calib_batches))
    if loss not in ("auto", "causal-lm"):
        raise ValueError(f"[prune] unit='layer' ranks layers by the model's own loss: loss must "
                         f"be 'auto' or 'causal-lm', got {loss!r}")
    if not _hf.is_transformers_model(module):
        raise ValueError(
            f"[prune] unit='layer' removes the decoder layers of a transformers model; "
            f"{type(module).__name__} is not one: export it to ONNX and run `lopper prune "
            f"--structured block` (residual blocks of any model)")
    holder, attr, layers = _decoder_layers(module)
    names = [f"{holder}.{attr}.{i}".lstrip(".") for i in range(len(layers))]
    args, kwargs = _split_inputs(example_inputs, module=module)
    kwargs = _hf.without_cache(module, kwargs)
    if device is None:
        first = next(module.parameters(), None)
        device = str(first.device) if first is not None else "cpu"
    was_training = module.training
    module.eval()
    try:
        scores = None
        if method != "random":
            items = list(_take(data, int(calib_batches)))
            if not items:
                raise ValueError("[prune] data gave no batch to calibrate on")
            bar = _Progress("calibrate") if progress else None
            try:
                if method == "influence":
                    scores = _influence(module, layers, items, device, bar)
                else:
                    scores = _loss_increase(module, layers, items, device, bar)
            finally:
                if bar is not None:
                    bar.close()
        gone, blocked, scores = _lopper._choose_layers(scores, names, amount, exclude=exclude, seed=seed)
        params_before = sum(p.numel() for p in module.parameters())
        with torch.no_grad():
            reference = _skipping(layers, gone, lambda: module(*args, **kwargs))
        undo = _remove(module, holder, attr, layers, gone)
        try:
            with torch.no_grad():
                got = module(*args, **kwargs)
            wrong = _difference(got, reference, rtol)
            if wrong is not None:
                raise RuntimeError(
                    f"[prune] the model without layers {list(gone)} does not compute what it "
                    f"computes with them skipped ({wrong}): it is as it was")
            if reloadable:
                why = _builds_back(module)
                if why is not None:
                    raise RuntimeError(f"[prune] {why}: the model is as it was (reloadable=False "
                                       f"removes the layers all the same)")
        except BaseException:
            undo()
            raise
    finally:
        module.train(was_training)
    params_after = sum(p.numel() for p in module.parameters())
    gone_set = set(gone)
    groups = []
    for i, name in enumerate(names):
        params = sum(p.numel() for p in layers[i].parameters())
        groups.append(_lopper._group(i, "layer", [name], 1, 0 if i in gone_set else 1,
                                     [0] if i in gone_set else [], scores[i], blocked[i], params))
    given = {"unit": "layer", "method": method, "amount": amount}
    if exclude is not None:
        given["exclude"] = exclude
    command = "lopper.prune_structured({})".format(", ".join(
        [type(module).__name__] + [f"{k}={v!r}" for k, v in given.items()]))
    return _lopper._report_in_place("layer", method, groups, params_before, params_after, [],
                                    "layers", type(module).__name__, command)


def _take(data, n):
    if data is None:
        return
    for i, item in enumerate(data):
        if i >= n:
            return
        yield item


def _decoder_layers(module):
    """(holder name, attribute, ModuleList) of the model's decoder layers: the ModuleList whose
    length is the config's num_hidden_layers."""
    cfg = _text_config(module.config)
    n = getattr(cfg, "num_hidden_layers", None)
    found = []
    for name, sub in module.named_modules():
        for attr, child in sub.named_children():
            if isinstance(child, torch.nn.ModuleList) and len(child) == n and n:
                found.append((name, attr, child))
    if len(found) != 1:
        raise ValueError(
            f"[prune] {type(module).__name__}: cannot tell its decoder layers (the ModuleList of "
            f"config.num_hidden_layers={n} layers): found {len(found)}")
    return found[0]


def _text_config(cfg):
    return getattr(cfg, "text_config", None) or cfg


def _hidden_in(args, kwargs):
    x = args[0] if args else kwargs.get("hidden_states")
    return x if isinstance(x, torch.Tensor) else None


def _hidden_out(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _influence(module, layers, items, device, bar):
    acc = [_lopper._BlockInfluence() for _ in layers]
    hooks = []
    for i, layer in enumerate(layers):
        def see(_, args, kwargs, out, i=i):
            x, y = _hidden_in(args, kwargs), _hidden_out(out)
            if x is None or not isinstance(y, torch.Tensor) or x.shape != y.shape:
                raise RuntimeError(f"[prune] decoder layer {i} does not take and give hidden "
                                   f"states of one shape")
            acc[i].add(x.float().cpu(), y.float().cpu(), -1)
        hooks.append(layer.register_forward_hook(see, with_kwargs=True))
    try:
        batches = _blocks.batches(module, items, device)
        with torch.no_grad():
            for k, (args, kwargs) in enumerate(batches):
                _blocks._call(module, "the model", k, args, kwargs)
                if bar is not None:
                    bar(k + 1, len(batches), "")
    finally:
        for h in hooks:
            h.remove()
    return [a.value for a in acc]


def _labelled(module, items, device):
    """(args, kwargs) per batch with labels for the model's own loss: the item's, else its
    input_ids (a causal LM shifts them itself)."""
    out = []
    for (args, kwargs), item in zip(_blocks.batches(module, items, device), items):
        labels = item.get("labels") if isinstance(item, dict) else None
        if labels is None:
            labels = kwargs.get("input_ids", args[0] if args else None)
        if not isinstance(labels, torch.Tensor):
            raise ValueError("[prune] method='loss' needs token batches (input_ids) or labels")
        out.append((args, dict(kwargs, labels=labels.to(device))))
    return out


def _mean_loss(module, batches):
    total = 0.0
    with torch.no_grad():
        for k, (args, kwargs) in enumerate(batches):
            out = _blocks._call(module, "the model", k, args, kwargs)
            loss = getattr(out, "loss", None)
            if loss is None and isinstance(out, dict):
                loss = out.get("loss")
            if loss is None:
                raise ValueError(f"[prune] method='loss' needs a model that returns its loss "
                                 f"given labels (a ...ForCausalLM); {type(module).__name__} "
                                 f"does not")
            total += float(loss)
    return total / len(batches)


def _loss_increase(module, layers, items, device, bar):
    batches = _labelled(module, items, device)
    base = _mean_loss(module, batches)
    scores = []
    for i in range(len(layers)):
        scores.append(_skipping(layers, [i], lambda: _mean_loss(module, batches)) - base)
        if bar is not None:
            bar(i + 1, len(layers), f"loss {base:.4f}")
    return scores


def _skipping(layers, skipped, run):
    """run() with the layers `skipped` handing their input hidden states straight on."""
    hooks = []
    for i in skipped:
        def skip(_, args, kwargs, out):
            x = _hidden_in(args, kwargs)
            return (x,) + tuple(out[1:]) if isinstance(out, tuple) else x
        hooks.append(layers[i].register_forward_hook(skip, with_kwargs=True))
    try:
        return run()
    finally:
        for h in hooks:
            h.remove()


def _remove(module, holder, attr, layers, gone):
    """Takes layers `gone` out of the model and makes its bookkeeping follow; returns undo()."""
    parent = module.get_submodule(holder) if holder else module
    keep = [i for i in range(len(layers)) if i not in set(gone)]
    cfg = _text_config(module.config)
    saved_cfg = copy.deepcopy(cfg.__dict__)
    idx_attrs = []  # (module, old layer_idx)
    for new, old in enumerate(keep):
        for sub in layers[old].modules():
            v = sub.__dict__.get("layer_idx")
            if isinstance(v, int) and not isinstance(v, bool):
                idx_attrs.append((sub, v))
                sub.layer_idx = new
    n_old = len(layers)
    setattr(parent, attr, torch.nn.ModuleList([layers[i] for i in keep]))
    cfg.num_hidden_layers = len(keep)
    for key, value in list(cfg.__dict__.items()):
        if key.startswith("_") or key == "num_hidden_layers":
            continue
        if isinstance(value, (list, tuple)) and len(value) == n_old and key.endswith("_types"):
            setattr(cfg, key, type(value)(value[i] for i in keep))
        elif key == "mlp_only_layers" and isinstance(value, (list, tuple)):
            setattr(cfg, key, [j for j, i in enumerate(keep) if i in set(value)])
        elif key == "max_window_layers" and isinstance(value, int):
            setattr(cfg, key, sum(1 for i in keep if i < value))

    def undo():
        setattr(parent, attr, layers)
        for sub, v in idx_attrs:
            sub.layer_idx = v
        cfg.__dict__.clear()
        cfg.__dict__.update(saved_cfg)

    return undo


def _builds_back(module):
    """None when the model's class built from its config has the model's shapes, else why not."""
    try:
        with torch.device("meta"):
            fresh = type(module)._from_config(copy.deepcopy(module.config))
    except Exception as e:  # noqa: BLE001 (a config the class refuses: say so)
        return (f"{type(module).__name__} does not build from the pruned config "
                f"({type(e).__name__}: {_first_line(e)})")
    want = {n: tuple(t.shape) for n, t in module.state_dict().items()}
    got = {n: tuple(t.shape) for n, t in fresh.state_dict().items()}
    missing = sorted(set(want) ^ set(got))
    if missing:
        return (f"{type(module).__name__} built from the pruned config has other tensors "
                f"({missing[0]})")
    wrong = [n for n in want if got[n] != want[n]]
    if wrong:
        return (f"{type(module).__name__} built from the pruned config has {wrong[0]} "
                f"{list(got[wrong[0]])}, not {list(want[wrong[0]])}")
    return None


def _difference(got, want, rtol):
    """None when `got` matches `want` within rtol of each output's largest magnitude."""
    g = [t for t in _leaves(got)]
    w = [t for t in _leaves(want)]
    if len(g) != len(w):
        return f"{len(g)} outputs, not {len(w)}"
    for a, b in zip(g, w):
        if a.shape != b.shape:
            return f"an output of shape {list(a.shape)}, not {list(b.shape)}"
        scale = float(b.abs().max()) if b.numel() else 0.0
        diff = float((a.float() - b.float()).abs().max()) if b.numel() else 0.0
        if not math.isfinite(diff) or diff > rtol * max(scale, 1e-12):
            return f"max |diff| {diff:.3g} against {scale:.3g}"
    return None


def _leaves(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if hasattr(x, "to_tuple"):
        x = x.to_tuple()
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in _leaves(item)]
    return []
