"""lopper.prune without an export: the module's layers handed to lopper's C++ library as they are
(lopper._lopper._prune_layers), and, for the methods that read the layers' inputs (Wanda,
SparseGPT, OWL), the module's own blocks run here, one at a time, on the calibration batches.

The library says what is pruned and how (the rules, the criteria, OWL, the solver, which layers
make a block); this file only runs the module: the inputs of the first block are captured from a
forward that stops there, each block runs on the outputs of the one before (its layers' inputs
handed to the library through forward pre-hooks), its pruned weights are applied, and it runs
again to hand the next block its inputs. Memory stays at the module's plus one block's
activations and statistics: the module is never copied or exported.
"""
import torch
from torch.nn.utils import prune as _torch_prune

from lopper import _hf

# Layers lopper reads: torch's Linear and Conv1d/Conv2d, transformers' Conv1D (weight [in, out]).
_CONV = (torch.nn.Conv1d, torch.nn.Conv2d)


class _Stop(Exception):
    """Raised by the hook that captures a block's inputs: the rest of the forward is not run."""


def layers(module, holders):
    """The module's prunable layers as _prune_layers takes them, in module order: each Linear,
    Conv1D and zero-padded Conv1d/Conv2d with its weight (the parameter itself, or the weight a
    torch.nn.utils.prune mask computes from it), under the parameter's name as ``named_parameters``
    gives it first (a tied weight: one name), and the embedding that shares it."""
    first_name = {}
    for name, p in module.named_parameters():
        first_name.setdefault(id(p), name)
    embedded = {}
    for prefix, sub in module.named_modules():
        if isinstance(sub, torch.nn.Embedding):
            w = _parameter(sub, "weight")
            embedded.setdefault(id(w), prefix)
    out = []
    for prefix, sub in module.named_modules():
        kind = _kind(sub)
        if kind is None:
            continue
        p = _parameter(sub, "weight")
        layer = {"name": prefix, "param": first_name.get(id(p), f"{prefix}.weight"), "op": kind,
                 "weight": getattr(sub, "weight").detach()}
        if layer["param"] not in holders:
            continue
        if kind == "Conv":
            spatial = sub.weight.dim() - 2
            layer.update(strides=list(sub.stride), dilations=list(sub.dilation),
                         pads=list(sub.padding) * 2, group=int(sub.groups))
            if len(layer["strides"]) != spatial:
                continue
        if id(p) in embedded:
            layer["embedding"] = embedded[id(p)]
        out.append(layer)
    return out


def _kind(sub):
    w = getattr(sub, "weight", None)
    if not isinstance(w, torch.Tensor):
        return None
    if isinstance(sub, torch.nn.Linear) and w.dim() == 2:
        return "Gemm"
    if type(sub).__name__ == "Conv1D" and w.dim() == 2:  # transformers' GPT-2 layers
        return "MatMul"
    if isinstance(sub, _CONV) and not isinstance(sub.padding, str) and \
            sub.padding_mode == "zeros":
        return "Conv"
    return None


def _parameter(sub, attr):
    """The parameter behind ``sub.<attr>`` (``<attr>_orig`` under a torch.nn.utils.prune mask)."""
    for hook in sub._forward_pre_hooks.values():
        if isinstance(hook, _torch_prune.BasePruningMethod) and hook._tensor_name == attr:
            return sub._parameters[attr + "_orig"]
    return sub._parameters[attr]


def batches(module, items, device):
    """The calibration items as (args, kwargs) the module's forward takes, on ``device``: a dict
    as keyword arguments (its "labels" left out), a tensor as the one positional argument, a
    (samples, labels) pair as its samples; a transformers model without its cache."""
    def to(x):
        return torch.utils._pytree.tree_map(
            lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, x)

    out = []
    for item in items:
        if isinstance(item, dict):
            args, kwargs = (), {k: v for k, v in item.items() if k != "labels"}
        elif isinstance(item, (tuple, list)):
            args, kwargs = (item[0],), {}
        else:
            args, kwargs = (item,), {}
        out.append((to(args), _hf.without_cache(module, to(kwargs))))
    return out


class Runner:
    """Runs the module for _prune_layers (lopper/prune.h's CalibrationRunner): collect(), apply()
    and advance() as the library calls them."""

    def __init__(self, module, device, apply):
        self.module = module
        self.device = device
        self.batches = []
        self.apply_weights = apply  # apply(masks, values): how the pruned weights reach the module
        self.carried = None  # (block name, [(args, kwargs) per batch]): that block's inputs

    def start(self, items):
        self.batches = batches(self.module, items, self.device)

    def collect(self, segment, block, layers, watched, observe):
        hooks = []
        for name in watched:
            def see(_, args, name=name):
                observe(name, args[0])
            hooks.append(self.module.get_submodule(name).register_forward_pre_hook(see))
        try:
            if block:
                run = self.module.get_submodule(segment)
                for i, (args, kwargs) in enumerate(self._inputs(segment)):
                    _call(run, segment, i, args, kwargs)
            else:
                for i, (args, kwargs) in enumerate(self.batches):
                    _call(self.module, "the module", i, args, kwargs)
        finally:
            for h in hooks:
                h.remove()

    def apply(self, masks, values):
        self.apply_weights(masks, values)

    def advance(self, segment, block):
        if not block:
            self.carried = None  # a layer outside the blocks: the next block's inputs anew
            return
        run = self.module.get_submodule(segment)
        outputs = []
        for i, (args, kwargs) in enumerate(self._inputs(segment)):
            out = _call(run, segment, i, args, kwargs)
            hidden = out[0] if isinstance(out, (tuple, list)) else out
            if args:
                outputs.append(((hidden,) + tuple(args[1:]), kwargs))
            else:
                outputs.append(((), dict(kwargs, hidden_states=hidden)))
        self.carried = (_next(segment), outputs)

    def _inputs(self, segment):
        """Block `segment`'s inputs per batch: those the block before handed on, else captured from
        a forward of the module (as pruned so far) stopped at the block."""
        if self.carried is not None and self.carried[0] == segment:
            return self.carried[1]
        captured = []

        def grab(_, args, kwargs):
            captured.append((args, kwargs))
            raise _Stop

        h = self.module.get_submodule(segment).register_forward_pre_hook(grab, with_kwargs=True)
        try:
            for i, (args, kwargs) in enumerate(self.batches):
                try:
                    _call(self.module, "the module", i, args, kwargs)
                except _Stop:
                    pass
                if len(captured) != i + 1:
                    raise RuntimeError(f"[prune] calibration batch {i} never reached block "
                                       f"'{segment}'")
        finally:
            h.remove()
        self.carried = (segment, captured)
        return captured


def _call(run, what, i, args, kwargs):
    """run(*args, **kwargs); what it raises (but the capture's stop) as a RuntimeError naming the
    calibration batch, as the export path names batches the model cannot take."""
    try:
        return run(*args, **kwargs)
    except _Stop:
        raise
    except Exception as e:
        text = str(e).strip().splitlines()
        raise RuntimeError(f"[prune] {what} failed on calibration batch {i}: {type(e).__name__}: "
                           f"{text[0] if text else ''}") from e


def _next(segment):
    """The name of the block after `segment` in its list: "model.layers.4" after "...3"."""
    head, _, index = segment.rpartition(".")
    return f"{head}.{int(index) + 1}" if index.isdigit() else None
