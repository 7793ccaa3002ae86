"""lopper.prune_structured(model, ..., unit="expert"): removes whole experts from the
mixture-of-experts layers of a model (transformers' Mixtral, Qwen2-MoE, Qwen3-MoE and others with
fused experts), in place.

lopper's C++ library (lopper._lopper._ExpertPruning, lopper/experts.h) checks the arguments, keeps
each layer's statistics and chooses the experts to remove. This file only does what has to run in
PyTorch: it finds the MoE layers (a block with a router, ``gate`` or ``router``, and an
``experts`` module holding every expert's weights in fused tensors [E, ...]), runs the model's own
decoder layers on the calibration batches one at a time (_blocks.Runner: each on the outputs of
the layers before it, already pruned, as llm-compressor's sequential pipeline), hands each layer's
routing over through a forward hook on its experts module (the top-k indices and weights the
module receives, and each routed token's expert output norm), and removes the chosen experts: the
fused tensors, the router's rows, the modules' expert counts and the config's.

lopper.sensitivity(model, ..., structured="expert") (sweep_experts) ranks every layer the same way
on the unpruned model, then removes each layer's chosen experts alone at each amount, runs the
model on the evaluation batches (the library measures the loss on its logits) and puts the layer
back (lopper._lopper._ExpertSweep, lopper/experts.h's ExpertSweep).
"""
import collections.abc
import copy
import inspect
import warnings

import torch
import torch.nn.functional as F

from lopper import _blocks, _hf, _lopper
from lopper._lopper import ExpertReport  # noqa: F401 (re-exported)
from lopper._prune import _first_line, _Progress, _pruned, _split_inputs

__all__ = ["ExpertReport"]

_ROUTERS = ("gate", "router")
# The attributes and config keys that hold a layer's expert count (transformers' names).
_COUNTS = ("num_experts", "num_local_experts", "n_experts", "n_routed_experts", "moe_num_experts")
_TOP_K = ("top_k", "num_experts_per_tok", "moe_top_k")
# What a router holds per expert (a row each): its weight, a bias, DeepSeek's score correction.
_ROUTER_TENSORS = ("weight", "bias", "e_score_correction_bias")


class _Layer:
    """One MoE layer: its block, router and experts modules, and every tensor that holds one slice
    per expert (owner module, attribute, qualified name, "param" or "buffer")."""

    def __init__(self, name, block, router, experts, count, top_k, tensors):
        self.name, self.block, self.router, self.experts = name, block, router, experts
        self.count, self.top_k, self.tensors = count, top_k, tensors

    def as_dict(self):
        per = sum(getattr(o, a).numel() for o, a, _, _ in self.tensors) // max(self.count, 1)
        return {"name": self.name, "experts": self.count, "top_k": self.top_k,
                "params_per_expert": per}


def prune_experts(module, example_inputs, *, method, amount, seed, data, calib_batches, device,
                  progress, others):
    """lopper.prune_structured(module, example_inputs, unit="expert", ...): see its docstring.
    `others`: prune_structured's other arguments by name, refused unless at their defaults."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"[prune] module must be a torch.nn.Module, got {type(module).__name__}")
    from lopper._structured import prune_structured

    defaults = inspect.signature(prune_structured).parameters
    given = [k for k, v in others.items() if not _same(v, defaults[k].default)]
    options = dict(method=method, amount=amount, seed=seed, data=data is not None,
                   channel_options=given)
    _lopper._check_experts(**options)
    if _pruned(module):
        raise ValueError("[prune] the module carries torch.nn.utils.prune masks: make them "
                         "permanent first (torch.nn.utils.prune.remove) or prune its experts "
                         "before unstructured")
    args, kwargs = _split_inputs(example_inputs, module=module)
    here = _device_where(module, device, "prune", "pruned")
    layers = _moe_layers(module)
    pruning = _lopper._ExpertPruning([l.as_dict() for l in layers], **options)
    new_counts = {l.name: l.count - pruning.drop(l.name) for l in layers}
    config_keys = _config_check(module, layers, new_counts)
    items = _lopper._expert_batches(data, calib_batches) if pruning.needs_data else []
    items = [_samples(it) for it in items]

    params_before = _params(module)
    undo = _Undo()
    modes = [(m, m.training) for m in module.modules()]
    bar = _Progress("calibrate") if progress and items else None
    module.eval()
    try:
        with torch.no_grad():
            _run(module, layers, pruning, items, here, bar,
                 lambda l: _remove(l, pruning.choose(l.name)[0], undo))
            for cfg, key, value in config_keys:
                undo.set(cfg, key, value)
            _check_runs(module, args, kwargs)
    except BaseException:
        undo.back()
        raise
    finally:
        for m, mode in modes:
            m.training = mode
        if bar is not None:
            bar.close()
    undo.forget()
    command = "lopper.prune_structured({})".format(", ".join(
        [type(module).__name__, "unit='expert'", f"method={method!r}", f"amount={amount!r}"] +
        ([f"seed={seed!r}"] if seed is not None else [])))
    report = pruning.report(params_before, _params(module), type(module).__name__, command)
    for w in report.warnings:
        warnings.warn(f"[prune] {w}", stacklevel=3)
    return report


def _device_where(module, device, op, done):
    """The module's device, after checking that `device` (None: not given) names it: the experts
    are `done` (pruned, swept) where the model is."""
    here = _device_of(module)
    if device is not None:
        if not isinstance(device, (str, torch.device)):
            raise TypeError(f"[{op}] device must be a str, got {type(device).__name__}")
        if torch.device(device) != torch.device(here):
            raise ValueError(f"[{op}] device {device}: the model's experts are {done} where the "
                             f"model is ({here}); move it there first")
    return here


def sweep_experts(module, example_inputs, data, *, method, amounts, eval_batches, seed, loss,
                  calib_batches, device, progress, others):
    """lopper.sensitivity(module, example_inputs, data, structured="expert", ...): see its
    docstring. `others`: sensitivity's other arguments by name, refused unless at their
    defaults."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"[sensitivity] module must be a torch.nn.Module, got "
                        f"{type(module).__name__}")
    from lopper._analysis import sensitivity

    defaults = inspect.signature(sensitivity).parameters
    given = [k for k, v in others.items() if not _same(v, defaults[k].default)]
    options = dict(method=method, amounts=amounts, eval_batches=eval_batches, seed=seed, loss=loss,
                   calib_batches=calib_batches, data=data is not None, other_options=given)
    _lopper._check_expert_sweep(**options)
    if _pruned(module):
        raise ValueError("[sensitivity] the module carries torch.nn.utils.prune masks: make them "
                         "permanent first (torch.nn.utils.prune.remove)")
    _split_inputs(example_inputs, "sensitivity", module)  # checked; the sweep runs on `data`
    here = _device_where(module, device, "sensitivity", "swept")
    layers = _moe_layers(module)
    sweep = _lopper._ExpertSweep([l.as_dict() for l in layers], **options)
    # One read of `data` (an iterator is read once): the calibration batches and the evaluated
    # ones are its first.
    want = (None if sweep.needs_data and calib_batches is None else
            max(calib_batches or 0, eval_batches))
    items = _lopper._expert_batches(data, want)
    calib = [_samples(it) for it in items[:calib_batches]] if sweep.needs_data else []
    evaluated = list(items[:eval_batches])
    sweep.set_eval(evaluated)
    inputs = _blocks.batches(module, [_samples(it) for it in evaluated], here)

    points = len(layers) * len(sweep.amounts)
    bar = _Progress("sensitivity") if progress else None
    modes = [(m, m.training) for m in module.modules()]
    undo = _Undo()
    module.eval()
    try:
        with torch.no_grad():
            if bar is not None:
                bar(0, points, f"{len(layers)} MoE layers x {len(sweep.amounts)} amounts = "
                               f"{points} points, {len(inputs)} batches each")
            # Every layer ranked on the unpruned model (nothing removed): one layer is pruned at a
            # time, so no layer's routing changes.
            _run(module, layers, sweep, calib, here, None, lambda l: None)
            base = _params(module)
            _measure(module, sweep, inputs)
            sweep.end_base(base)
            done = 0
            for l in layers:
                for j, amount in enumerate(sweep.amounts):
                    params = None
                    if sweep.needs_run(l.name, j):
                        _remove(l, sweep.choice(l.name, j)[0], undo)
                        try:
                            params = _params(module)
                            _measure(module, sweep, inputs)
                        finally:
                            undo.back()
                    sweep.end_point(l.name, j, params)
                    done += 1
                    if bar is not None:
                        bar(done, points, f"{l.name} @ {amount:g}")
    except BaseException:
        undo.back()
        raise
    finally:
        for m, mode in modes:
            m.training = mode
        if bar is not None:
            bar.close()
    command = "lopper.sensitivity({})".format(", ".join(
        [type(module).__name__, "structured='expert'", f"method={sweep.method!r}"] +
        ([f"amounts={list(amounts)!r}"] if amounts is not None else []) +
        [f"eval_batches={eval_batches!r}"] + ([f"seed={seed!r}"] if seed is not None else [])))
    return sweep.report(type(module).__name__, command)


def _measure(module, sweep, inputs):
    """The model's logits on each evaluation batch, handed to `sweep` (which measures the loss)."""
    for k, (args, kwargs) in enumerate(inputs):
        try:
            out = module(*args, **kwargs)
        except Exception as e:
            raise RuntimeError(f"[sensitivity] the model failed on evaluation batch {k}: "
                               f"{type(e).__name__}: {_first_line(e)}") from e
        logits = getattr(out, "logits", None)
        if logits is None:
            logits = out[0] if isinstance(out, (tuple, list)) and out else out
        if not isinstance(logits, torch.Tensor):
            raise RuntimeError(f"[sensitivity] the model returns {type(out).__name__}, not a "
                               f"language model's logits [B, T, V] (nor an output with .logits)")
        sweep.evaluate(k, logits)


def _same(a, b):
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:  # noqa: BLE001 (a value that does not compare: given)
        return False


def _device_of(module):
    first = next(module.parameters(), None)
    return str(first.device) if first is not None else "cpu"


def _params(module):
    return sum(p.numel() for p in module.parameters())


def _samples(item):
    """A (mapping of named inputs, labels) pair as its mapping (the model takes those)."""
    if isinstance(item, (tuple, list)) and item and isinstance(item[0], collections.abc.Mapping):
        return item[0]
    return item


# ------------------------------------------------------------------------------------------------
# Finding the MoE layers.

def _moe_layers(module):
    layers, separate = [], []
    for name, block in module.named_modules():
        experts = block._modules.get("experts")
        router = next((block._modules[r] for r in _ROUTERS
                       if isinstance(block._modules.get(r), torch.nn.Module)), None)
        if experts is None or router is None:
            continue
        down = experts._parameters.get("down_proj")
        if not isinstance(down, torch.Tensor) or down.dim() != 3:
            separate.append(name)
            continue
        count = int(down.shape[0])
        tensors = []
        for owner, oname, allowed in ((experts, f"{name}.experts", None),
                                      (router, f"{name}.{_name_in(block, router)}",
                                       _ROUTER_TENSORS),
                                      (block, name, ("e_score_correction_bias",))):
            for kind, table in (("param", owner._parameters), ("buffer", owner._buffers)):
                for attr, t in table.items():
                    if t is None or t.dim() < 1 or t.shape[0] != count:
                        continue
                    if allowed is not None and attr not in allowed:
                        continue
                    tensors.append((owner, attr, f"{oname}.{attr}" if oname else attr, kind))
        weight = getattr(router, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[0] != count:
            separate.append(name)
            continue
        top_k = _top_k(module, block, router)
        if top_k is None:
            raise RuntimeError(f"[prune] MoE layer '{name}': no top-k (router.top_k or the "
                               f"config's num_experts_per_tok) says how many experts a token "
                               f"goes to")
        layers.append(_Layer(name, block, router, experts, count, top_k, tensors))
    if not layers and separate:
        raise ValueError(
            f"[prune] unit='expert': the MoE layer '{separate[0]}' keeps its experts as separate "
            f"modules; lopper prunes fused experts (an `experts` module holding gate_up_proj/"
            f"down_proj [E, ...] and called with the router's top-k indices and weights, as "
            f"transformers 5's Mixtral, Qwen2-MoE and Qwen3-MoE)")
    if not layers:
        raise ValueError("[prune] unit='expert': the model has no mixture-of-experts layer (a "
                         "block with a router `gate` or `router` and an `experts` module)")
    cfg = _config(module)
    if cfg is not None and any(getattr(cfg, k, None) not in (None, 1) for k in ("n_group",)):
        raise ValueError("[prune] unit='expert': the model's router picks experts within groups "
                         "(n_group); lopper prunes experts of routers that choose among all")
    return layers


def _name_in(parent, child):
    return next(n for n, c in parent._modules.items() if c is child)


def _top_k(module, block, router):
    for holder in (router, block):
        for attr in _TOP_K:
            v = getattr(holder, attr, None)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
    cfg = _config(module)
    for attr in _TOP_K:
        v = getattr(cfg, attr, None) if cfg is not None else None
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def _config(module):
    """The config that holds the expert count (a multimodal model's text_config)."""
    cfg = getattr(module, "config", None)
    if cfg is None or not hasattr(cfg, "to_dict"):
        return None
    text = getattr(cfg, "text_config", None)
    if text is not None and any(hasattr(text, k) for k in _COUNTS):
        return text
    return cfg


def _config_check(module, layers, new_counts):
    """[(config, key, value)]: the expert counts to set in the model's config (each key that holds
    the layers' count), checked first by building the model's class from the new config (on the
    meta device) and comparing every tensor's shape with what pruning leaves: a RuntimeError
    when save_pretrained + from_pretrained would not give the pruned model back."""
    if not _hf.is_transformers_model(module):
        return []
    cfg = _config(module)
    counts = {l.count for l in layers}
    after = set(new_counts.values())
    keys = [k for k in _COUNTS if isinstance(getattr(cfg, k, None), int)
            and getattr(cfg, k) in counts]
    if len(after) > 1:
        raise RuntimeError(f"[prune] the MoE layers would keep different expert counts "
                           f"({sorted(after)}), which the model's config cannot describe")
    (new,) = after
    updates = [(cfg, k, new) for k in keys]
    top = module.config
    fresh_cfg = copy.deepcopy(top)
    target = fresh_cfg.text_config if cfg is not top else fresh_cfg
    for _, k, v in updates:
        setattr(target, k, v)
    want = {n: tuple(t.shape) for n, t in module.state_dict().items()}
    for l in layers:
        for _, _, name, _ in l.tensors:
            if name in want:
                want[name] = (new_counts[l.name],) + want[name][1:]
    try:
        with torch.device("meta"):
            fresh = type(module)._from_config(fresh_cfg)
    except Exception as e:  # noqa: BLE001 (a config the class refuses: say so)
        raise RuntimeError(f"[prune] {type(module).__name__} does not build from its config with "
                           f"{new} experts per layer ({_first_line(e)})") from e
    got = {n: tuple(t.shape) for n, t in fresh.state_dict().items()}
    wrong = [n for n in want if n in got and got[n] != want[n]]
    if wrong:
        raise RuntimeError(
            f"[prune] {type(module).__name__} built from its config with {new} experts per layer "
            f"has {wrong[0]} {list(got[wrong[0]])}, not {list(want[wrong[0]])}: its config cannot "
            f"describe the pruned model (save_pretrained + from_pretrained would not give it back)")
    # Modules that keep a config of their own (a copy) follow it too.
    for l in layers:
        for sub in (l.block, l.router, l.experts):
            own = getattr(sub, "config", None)
            if own is not None and own is not cfg and own is not top:
                updates += [(own, k, new) for k in _COUNTS
                            if isinstance(getattr(own, k, None), int)
                            and getattr(own, k) == l.count]
    return updates


# ------------------------------------------------------------------------------------------------
# Calibration and removal.

def _segment(name):
    """The numbered block a module is in ("model.layers.3" for "model.layers.3.mlp"), or None."""
    parts = name.split(".")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i].isdigit():
            return ".".join(parts[:i + 1])
    return None


def _walk(module, layers):
    """The numbered blocks from the first MoE layer's to the last's, in order, when the MoE layers
    all sit in one list of blocks; else None (then one pass of the whole model)."""
    segments = [_segment(l.name) for l in layers]
    if any(s is None for s in segments):
        return None
    order = [segments[0]]
    last = max(segments, key=lambda s: int(s.rsplit(".", 1)[1]))
    if any(s.rsplit(".", 1)[0] != last.rsplit(".", 1)[0] for s in segments):
        return None
    while order[-1] != last:
        nxt = _blocks._next(order[-1])
        try:
            module.get_submodule(nxt)
        except AttributeError:
            return None
        order.append(nxt)
    return order if set(segments) <= set(order) else None


def _run(module, layers, pruning, items, device, bar, done_with):
    """Hands `pruning` each layer's routing on the calibration batches, layer by layer, and calls
    done_with(layer) once a layer has seen them all (expert pruning: removes its experts, before
    the layers after it see any data)."""
    if not pruning.needs_data:
        for l in layers:
            done_with(l)
        return
    runner = _blocks.Runner(module, device, apply=None)
    runner.start(items)
    walk = _walk(module, layers)
    done = 0
    if bar is not None:
        how = "block by block" if walk else "in one pass of the model"
        bar(0, len(layers), f"{len(layers)} MoE layers on {len(items)} batches, {how}")
    if walk is None:
        with _hooks(layers, pruning):
            runner.collect("", False, [], [], None)
        for l in layers:
            done_with(l)
            done += 1
            if bar is not None:
                bar(done, len(layers), l.name)
        return
    for i, segment in enumerate(walk):
        mine = [l for l in layers if _segment(l.name) == segment]
        if mine:
            with _hooks(mine, pruning):
                runner.collect(segment, True, [], [], None)
            for l in mine:
                done_with(l)
                done += 1
                if bar is not None:
                    bar(done, len(layers), l.name)
        if i + 1 < len(walk):
            runner.advance(segment, True)


class _hooks:
    """Forward hooks on the layers' experts modules that hand each call's routing to `pruning`."""

    def __init__(self, layers, pruning):
        self.layers, self.pruning, self.handles = layers, pruning, []

    def __enter__(self):
        for l in self.layers:
            def see(mod, args, kwargs, output, l=l):
                hidden, index, weights = _routing(l, mod, args, kwargs)
                norms = (_routed_norms(l, mod, hidden, index, weights, output)
                         if self.pruning.needs_norms else None)
                self.pruning.observe(l.name, index, weights, norms)
            self.handles.append(l.experts.register_forward_hook(see, with_kwargs=True))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()


def _routing(layer, mod, args, kwargs):
    """(hidden_states [T, H], top-k indices [T, k], top-k weights [T, k]) an experts module was
    called with."""
    try:
        bound = list(inspect.signature(mod.forward).bind(*args, **kwargs).arguments.values())
    except (TypeError, ValueError):
        bound = list(args) + list(kwargs.values())
    ok = (len(bound) >= 3 and all(isinstance(t, torch.Tensor) for t in bound[:3])
          and bound[0].dim() == 2 and bound[1].dim() == 2 and bound[2].shape == bound[1].shape
          and bound[1].shape[0] == bound[0].shape[0] and not bound[1].is_floating_point())
    if not ok:
        raise RuntimeError(f"[prune] MoE layer '{layer.name}': its experts module is not called as "
                           f"experts(hidden_states [T, H], top_k_index [T, k], top_k_weights "
                           f"[T, k]), which lopper reads the routing from")
    return bound[0], bound[1], bound[2]


def _routed_norms(layer, experts, hidden, index, weights, output):
    """[T, k]: the L2 norm of expert index[t, j]'s output for token t, each expert run on the
    tokens routed to it alone. Their sum weighted by the routing weights must be the module's
    output (else lopper does not compute these experts as the module does: a RuntimeError)."""
    tokens, k = index.shape
    flat = index.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=layer.count).tolist()
    w = weights.reshape(-1)
    norms = torch.zeros(tokens * k, dtype=torch.float32, device=hidden.device)
    combined = torch.zeros_like(hidden)
    start = 0
    for e, c in enumerate(counts):
        if c == 0 or e >= layer.count:
            start += c
            continue
        sel = order[start:start + c]
        start += c
        rows = sel // k
        y = _expert(experts, hidden[rows], e)
        norms[sel] = torch.linalg.norm(y.float(), dim=-1)
        combined.index_add_(0, rows, (y * w[sel, None]).to(combined.dtype))
    out = output[0] if isinstance(output, (tuple, list)) else output
    if not isinstance(out, torch.Tensor) or out.shape != hidden.shape:
        raise RuntimeError(f"[prune] MoE layer '{layer.name}': its experts module returns "
                           f"{type(out).__name__} {list(getattr(out, 'shape', []))}, not the "
                           f"tokens' combined outputs [T, H] lopper checks its norms against")
    scale = float(out.float().abs().max()) if out.numel() else 0.0
    err = float((combined.float() - out.float()).abs().max()) if out.numel() else 0.0
    tol = (1e-3 if out.dtype in (torch.float32, torch.float64) else 3e-2) * max(scale, 1e-6)
    if not err <= tol:
        raise RuntimeError(f"[prune] MoE layer '{layer.name}': lopper's run of each expert differs "
                           f"from the experts module's output by {err:.3g} (of {scale:.3g}): its "
                           f"experts are not laid out as transformers' fused experts "
                           f"(gate_up_proj, down_proj)")
    return norms.view(tokens, k)


def _expert(ex, x, e):
    """Expert `e` of fused experts `ex` on tokens x [n, H], as transformers' experts compute it
    (use_experts_implementation's flags: has_gate, has_bias, is_transposed,
    has_post_expert_norm; the module's own _apply_gate and act_fn)."""
    transposed = bool(getattr(ex, "is_transposed", False))
    bias = bool(getattr(ex, "has_bias", False))

    def linear(x, name):
        wt = getattr(ex, name)[e]
        y = x @ wt if transposed else F.linear(x, wt)
        return y + getattr(ex, name + "_bias")[e] if bias else y

    if bool(getattr(ex, "has_gate", hasattr(ex, "gate_up_proj"))):
        p = linear(x, "gate_up_proj")
        gate = getattr(ex, "_apply_gate", None)
        if gate is not None:
            p = gate(p)
        else:
            g, u = p.chunk(2, dim=-1)
            p = ex.act_fn(g) * u
    else:
        p = ex.act_fn(linear(x, "up_proj"))
    y = linear(p, "down_proj")
    if getattr(ex, "has_post_expert_norm", False):
        y = ex.post_expert_norm(y)
    return y


def _remove(layer, kept, undo):
    """Keeps experts `kept` (ascending) of `layer`: every per-expert tensor sliced along its
    first axis (a parameter keeps its object: its .data is set), and the modules' expert counts."""
    count = layer.count
    keep = torch.tensor(kept, dtype=torch.long)
    gone = torch.tensor([i for i in range(count) if i not in set(kept)], dtype=torch.long)
    for owner, attr, _, kind in layer.tensors:
        t = getattr(owner, attr)
        k, g = keep.to(t.device), gone.to(t.device)
        new = t.detach().index_select(0, k)
        saved = t.detach().index_select(0, g)
        if kind == "param" and t.grad is not None:
            undo.set(t, "grad", None)  # before the tensor: put back after it
        undo.tensor(owner, attr, kind, k, g, saved)
        if kind == "param":
            t.data = new
        else:
            owner._buffers[attr] = new
    for holder in (layer.block, layer.router, layer.experts):
        for attr in _COUNTS:
            v = holder.__dict__.get(attr)
            if isinstance(v, int) and not isinstance(v, bool) and v == count:
                undo.set(holder, attr, len(kept))
    if isinstance(layer.router, torch.nn.Linear):
        undo.set(layer.router, "out_features", len(kept))


class _Undo:
    """What the pruning changed, to put back on any failure: each sliced tensor (its kept and
    removed slices: the whole is rebuilt, the memory of the removed experts only is held) and
    each attribute set."""

    def __init__(self):
        self.steps = []

    def tensor(self, owner, attr, kind, keep, gone, saved):
        self.steps.append(("tensor", owner, attr, kind, keep, gone, saved))

    def set(self, obj, attr, value):
        old = getattr(obj, attr, _Undo)
        self.steps.append(("attr", obj, attr, old))
        setattr(obj, attr, value)

    def back(self):
        with torch.no_grad():
            for step in reversed(self.steps):
                if step[0] == "attr":
                    _, obj, attr, old = step
                    if old is _Undo:
                        delattr(obj, attr)
                    else:
                        setattr(obj, attr, old)
                    continue
                _, owner, attr, kind, keep, gone, saved = step
                now = getattr(owner, attr).detach()
                whole = now.new_empty((keep.numel() + gone.numel(),) + tuple(now.shape[1:]))
                whole[keep] = now
                whole[gone] = saved
                if kind == "param":
                    getattr(owner, attr).data = whole
                else:
                    owner._buffers[attr] = whole
        self.steps = []

    def forget(self):
        self.steps = []


def _check_runs(module, args, kwargs):
    """The pruned model runs on the example inputs (a RuntimeError naming why, else)."""
    try:
        module(*args, **kwargs)
    except Exception as e:
        raise RuntimeError(f"[prune] the model with its experts pruned fails on the example "
                           f"inputs ({_first_line(e)}); it is back as it was") from e
