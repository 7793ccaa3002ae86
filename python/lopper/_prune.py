"""lopper.prune: unstructured, N:M, row, column and block pruning of an nn.Module in place, and
one-shot LLM pruning (Wanda, SparseGPT, OWL) on calibration batches.

The module is exported to ONNX in memory; lopper's C++ library (lopper._lopper._prune_onnx) prunes
the export exactly as `lopper prune` would and hands back a keep-mask per pruned weight, which is
applied with torch.nn.utils.prune.custom_from_mask, and the new values of the weights whose kept
entries it changed (SparseGPT), copied into the parameters first. This file only moves the module
across. A transformers model is not exported: its layers go to lopper as they are, and its own
blocks run in _blocks.py for the methods that read the layers' inputs.
"""
import copy
import inspect
import reprlib
import sys
import warnings
import weakref

import torch
from torch.nn.utils import prune as _torch_prune

from lopper import _blocks, _fx, _hf, _lopper
from lopper._lopper import PruneLayerReport, PruneReport  # noqa: F401 (re-exported)

__all__ = ["PruneLayerReport", "PruneReport", "make_permanent", "prune"]


def prune(module, example_inputs, *, method=None, amount=None, threshold=None, scope="local",
          pattern=None, norm=None, seed=None, exclude=None, skip_first_last=False,
          allow_tied=False, recipe=None, data=None, loss="auto", mask_token=None,
          calib_batches=None, device=None, block_size=128, dampening=0.01, owl_lambda=None,
          owl_m=5, sequential=True, prune_head=False, masks=True, progress=True):
    """Prunes the weights of ``module`` in place, the way ``lopper prune`` prunes its ONNX export.

    Every Conv, ConvTranspose and Linear weight (any parameter a convolution or a matrix product
    reads, GPT-2's Conv1D included; biases and normalization parameters are never touched) is
    ranked and masked with ``torch.nn.utils.prune.custom_from_mask``: the submodule gains
    ``<name>_orig`` (the parameter) and ``<name>_mask`` (a buffer of ones and zeros), and a
    forward pre-hook sets ``<name> = <name>_orig * <name>_mask``, so a training loop of your own
    keeps pruned weights at zero, and ``torch.nn.utils.prune.remove(submodule, "weight")`` makes
    them permanent. The masks are the zeros ``lopper prune`` writes for the same weights (and,
    for ``l1``, the weights ``torch.nn.utils.prune.l1_unstructured`` / ``global_unstructured``
    remove). Pruning is cumulative, like torch's PruningContainer: a weight already masked stays
    masked and ``amount`` counts from the weights left. A parameter that several submodules hold
    (tied weights) is masked in each of them alike.

    One-shot LLM pruning: ``method="wanda"`` (Sun et al. 2023) and ``method="sparsegpt"`` (Frantar
    & Alistarh 2023) rank each layer's weights by the inputs the layer sees on ``data``, and
    ``owl_lambda`` (OWL, Yin et al. 2023) gives transformer blocks with more outliers more weights
    to keep. They calibrate block by block, as ``lopper prune --method wanda|sparsegpt``: each
    transformer block (the layers whose names share a prefix ending in a number,
    ``model.layers.3``) is calibrated on the outputs of the blocks before it, already pruned, then
    pruned (``sequential=False``: every layer on the unpruned module's inputs, in one pass). Wanda
    only masks. SparseGPT also updates the weights it keeps, so that the layer's outputs on the
    calibration inputs change least: those new values are copied into the parameters (``<name>``
    of an unpruned submodule, ``<name>_orig`` of one pruned before) before the masks are applied,
    so ``module`` computes what lopper's pruned export computes.

    Args:
        module (torch.nn.Module): the model; it must export with ``torch.onnx.export(...,
            dynamo=True)`` on ``example_inputs``. It is exported in eval mode (its modes are put
            back) and left untouched when anything fails.
        example_inputs: what ``module`` is called with: a tensor, a tuple of positional
            arguments, or a dict of keyword arguments.
        method (str): what ranks the weights (default ``"l1"``): ``"abs"`` (|w| < threshold),
            ``"l1"`` (|w|), ``"lamp"``, ``"random"`` (seeded), ``"grad"`` (mean |dL/dw| over the
            calibration batches), ``"taylor"`` (sum of |w * dL/dw|), ``"wanda"`` (the smallest
            |w| x ||input||_2 within each output row) or ``"sparsegpt"`` (the weights whose removal
            the kept ones, updated, make up for best: SparseGPT's solver on the inputs' Hessian);
            the last four need ``data``. ``wanda`` and ``sparsegpt`` take an amount as a fraction
            (or an N:M pattern) and local scope.
        amount (float or int): a float is the fraction in [0, 1] of the remaining weights to
            remove (rounded half to even, as torch does), an int that many weights (or rows,
            columns, blocks). Required for every method but ``abs`` and N:M patterns.
        threshold (float): ``abs`` removes every weight with |w| < threshold.
        scope (str): ``"local"`` (default: ``amount`` of each weight) or ``"global"`` (one
            ranking over all weights, as ``global_unstructured``; unstructured and block only).
        pattern (str): ``"unstructured"`` (default), ``"N:M"`` (e.g. ``"2:4"``: keep N of every
            M consecutive weights along the reduction dim, the layout of sparse tensor cores),
            ``"row"``, ``"column"``, or ``"block:RxC"`` (R outputs x C inputs, each 1..256).
        norm (int): rows and columns with ``l1``: rank by the L1 (1, default) or L2 (2) norm;
            blocks: by mean |w| (1) or root mean square (2).
        seed (int): ``random``: the seed (default 0).
        exclude (str): leave alone the layers whose node, weight or parameter name (e.g.
            ``"fc1.weight"``) matches this regular expression (ECMAScript, searched).
        skip_first_last (bool): leave the first and last layers alone.
        allow_tied (bool): prune tied weights too (one that a non-layer also reads: GPT-2's
            lm_head is its token embedding). Off, they are left alone with a warning.
        recipe (dict or str or os.PathLike): per-layer rules instead of the arguments above: a
            dict, or the path of a YAML file, as ``lopper prune --recipe`` reads (``defaults``
            and ``rules``, each rule with ``match`` and ``method``/``amount``/``pattern``/...
            or ``skip``; first match wins).
        data (iterable): calibration batches for ``grad``, ``taylor``, ``wanda``, ``sparsegpt``
            and OWL (at most ``calib_batches`` are read, each as given): tensors of samples,
            ``(samples, labels)`` tuples, or dicts of named inputs (the forward's argument names)
            with ``"labels"``, as torch DataLoaders and transformers collators give them (token
            IDs ``{"input_ids": ...}`` for a language model). For ``wanda``, ``sparsegpt`` and
            OWL, a last batch smaller than the first (a DataLoader's remainder) is left out, as
            ``lopper prune`` drops it.
        loss (str): the calibration loss on the first output: ``"auto"`` (default: cross-entropy
            for labels [B], token classification for [B, T], next-token prediction for a
            language model without labels), ``"cross-entropy"``, ``"mse"``, ``"causal-lm"``,
            ``"masked-lm"`` (needs ``mask_token``) or ``"token-classification"``.
        mask_token (int): ``"masked-lm"``: the [MASK] token's ID.
        calib_batches (int): how many batches of ``data`` to read, at most. Default: 32 for
            ``grad`` and ``taylor``; for ``wanda``, ``sparsegpt`` and OWL the papers' 128
            samples (``ceil(128 / B)`` batches of the first batch's size B, as ``lopper prune``).
        device (str): where calibration runs: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` (default: the
            module's device).
        block_size (int): ``sparsegpt``: columns pruned and updated together (the solver's lazy
            batch update; default 128, the paper's). Also the mask's granularity for unstructured
            amounts: each block of columns picks its own weights.
        dampening (float): ``sparsegpt``: added to the Hessian's diagonal as a fraction of its
            mean (default 0.01, the paper's), so that it can be inverted; > 0.
        owl_lambda (float): OWL's outlier-weighted layer-wise sparsity (Yin et al. 2023): each
            transformer block's amount is spread over ``amount - owl_lambda .. amount +
            owl_lambda`` by its share of outlier Wanda scores (blocks with more outliers keep
            more weights), and they average ``amount``; layers outside the blocks (an LM head)
            keep ``amount``. E.g. 0.08; default None: off. Needs
            ``data``, an amount as a fraction, unstructured pattern and local scope, with any
            ranking ``method`` but ``abs``.
        owl_m (float): OWL: a score is an outlier above ``owl_m`` times its block's mean (default
            5, the paper's M).
        sequential (bool): ``wanda``, ``sparsegpt`` and OWL: calibrate block by block, each on the
            pruned blocks before it (default True, as the papers); False: every layer on the
            unpruned module, in one pass (faster, a little less accurate).
        prune_head (bool): a transformers model: prune its output head too
            (``get_output_embeddings()``, ``lm_head``); default False leaves it alone, as
            llm-compressor and ModelOpt do (without a recipe: with one, its rules decide).
        masks (bool): True (default): ``torch.nn.utils.prune`` masks, as above. False: the zeros
            are written into the parameters themselves, with no mask buffer (what
            ``save_pretrained`` and ``torch.save`` store as they are; nothing keeps later training
            from filling them in).
        progress (bool): show calibration progress on stderr (tqdm when installed, else a few
            plain lines): batches for ``grad`` and ``taylor``, the block being calibrated for
            ``wanda``, ``sparsegpt`` and OWL.

    Returns:
        PruneReport: per layer (``report.layers``: name, param, params, nonzero, sparsity,
        method, skipped, ...) and in total; ``str(report)`` is the CLI's table and
        ``report.to_dict()`` its JSON. Its warnings are also issued with ``warnings.warn``.

    Note:
        A transformers model (a PreTrainedModel) is pruned in place, never exported: its Linear
        and Conv1D layers are handed to lopper as they are and, for ``wanda``, ``sparsegpt`` and
        OWL, its own decoder layers run one at a time on the batches (the first block's inputs
        captured from a forward that stops there), so a model of any size the machine holds
        once is pruned on its device and in its dtype, with the masks the export would give.
        An error in the model's own forward part-way leaves the blocks before it pruned.
        ``grad`` and ``taylor``, and any other module, go through the module's ONNX export, held
        in memory as one ONNX model (the weights must fit protobuf's 2 GB). A module pruned
        before is exported from a copy with its masks made permanent, which shares every other
        parameter and buffer with it.

    Raises:
        ValueError: a bad argument, with lopper's one-line message (an unknown method, an
            amount outside [0, 1], a pattern that no layer's shape divides, a bad recipe,
            ``block_size`` < 1, ``dampening`` <= 0, ``owl_lambda`` without ``data``, ``wanda``
            or ``sparsegpt`` with global scope).
        TypeError: an argument of the wrong type.
        RuntimeError: the module cannot be exported, or lopper cannot prune or run its export
            (calibration batches the module cannot take, a Hessian that stays singular); a
            transformers model's forward failing on a calibration batch.
    """
    _check_module(module, "prune")
    if not isinstance(masks, bool):
        raise TypeError(f"[prune] masks must be a bool, got {type(masks).__name__}")
    args, kwargs = _split_inputs(example_inputs, module=module)
    if device is None:
        device = _module_device(module)
    if recipe is None and not prune_head:
        exclude = _hf.head_excluded(module, exclude)
    one_shot = dict(block_size=block_size, dampening=dampening, owl_lambda=owl_lambda,
                    owl_m=owl_m, sequential=sequential)
    command = _command(module, method=method, amount=amount, threshold=threshold, scope=scope,
                       pattern=pattern, recipe=recipe,
                       **{k: v for k, v in one_shot.items() if v != _ONE_SHOT[k]})
    given = dict(method=method, amount=amount, threshold=threshold, scope=scope, pattern=pattern,
                 norm=norm, seed=seed, exclude=exclude, skip_first_last=skip_first_last,
                 allow_tied=allow_tied, recipe=recipe, data=data, calib_batches=calib_batches,
                 device=device, **one_shot)
    report = None
    if _hf.is_transformers_model(module):
        report = _prune_in_place(module, given, masks, progress, command)
    if report is None:
        report = _prune_export(module, args, kwargs, given, loss, mask_token, masks, progress,
                               command)
    if _hf.is_transformers_model(module) and _pruned(module):
        report._add_warning(
            "the pruned weights are torch.nn.utils.prune masks (weight_orig, weight_mask): "
            "save_pretrained stores those and from_pretrained starts every such weight anew; "
            "call lopper.make_permanent(model) before saving, or prune with masks=False")
    for w in report.warnings:
        warnings.warn(f"[prune] {w}", stacklevel=2)
    return report


def _prune_in_place(module, given, masks, progress, command):
    """lopper.prune on the module's own layers, without an export (_blocks.py); None when a
    criterion ranks by gradients, which need the export."""
    holders = _holders(module)
    here = _module_device(module)
    if torch.device(given["device"]) != torch.device(here):
        raise ValueError(f"[prune] device {given['device']}: a transformers model is pruned where "
                         f"it is ({here}); move it there first")
    runner = _blocks.Runner(module, here, lambda m, v: _apply(m, v, holders, masks))
    bar = _Progress("calibrate") if progress and given["data"] is not None else None
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            return _lopper._prune_layers(
                _blocks.layers(module, holders), runner, progress=bar,
                module_params=sum(p.numel() for p in module.parameters()),
                name=type(module).__name__, command=command, **given)
    finally:
        for m, mode in modes:
            m.training = mode
        if bar is not None:
            bar.close()


def _prune_export(module, args, kwargs, given, loss, mask_token, masks, progress, command):
    """lopper.prune on the module's ONNX export, held in memory."""
    data = given["data"]
    exported, holders = _export(module, args, kwargs, dynamic=data is not None)
    bar = _Progress("calibrate") if progress and data is not None else None
    try:
        keep, values, report = _lopper._prune_onnx(
            exported, loss=loss, mask_token=mask_token, parameters=list(holders), progress=bar,
            example=_example_shapes(module, args, kwargs), name=type(module).__name__,
            command=command, **given)
    finally:
        if bar is not None:
            bar.close()
    del exported
    _apply(keep, values, holders, masks)
    return report


def make_permanent(module):
    """Makes every ``torch.nn.utils.prune`` mask on ``module`` permanent
    (``torch.nn.utils.prune.remove`` on each masked parameter): the zeros stay, ``weight_orig``
    and ``weight_mask`` go, and ``state_dict()`` and ``save_pretrained`` store each pruned weight
    under its own name, as ``load_state_dict`` and ``from_pretrained`` read it. Call it before
    saving a model ``lopper.prune`` pruned (the masks no longer keep later training from
    filling the zeros in).

    Returns:
        list of str: the parameters made permanent ("fc1.weight", ...), none when nothing was
        masked.

    Raises:
        TypeError: ``module`` is not a torch.nn.Module.
    """
    _check_module(module, "make_permanent")
    done, seen = [], set()
    for prefix, sub, name in _pruned(module):
        if (id(sub), name) in seen:  # a submodule held twice (tied): once
            continue
        seen.add((id(sub), name))
        _torch_prune.remove(sub, name)
        done.append(f"{prefix}.{name}" if prefix else name)
    return done


# lopper.prune's one-shot defaults (the papers'): the report's command shows the others.
_ONE_SHOT = dict(block_size=128, dampening=0.01, owl_lambda=None, owl_m=5, sequential=True)


def _example_tensors(module, args, kwargs):
    """The example's tensors in the export's input order: the forward's parameters in order
    (torch.export orders keyword arguments so), each flattened."""
    try:
        bound = inspect.signature(module.forward).bind(*args, **kwargs).arguments.values()
    except (TypeError, ValueError):
        bound = list(args) + list(kwargs.values())
    leaves = torch.utils._pytree.tree_leaves(list(bound))
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def _example_shapes(module, args, kwargs):
    """The shapes of _example_tensors."""
    return [list(t.shape) for t in _example_tensors(module, args, kwargs)]


def _command(module, **given):
    """The call as a report's header shows it: lopper.prune(ModuleClass, the arguments given),
    each argument's repr bounded (a recipe that nests deep or holds itself stays one short line)."""
    short = reprlib.Repr()
    short.maxlevel, short.maxdict, short.maxlist, short.maxstring, short.maxother = 4, 8, 8, 80, 80
    parts = [type(module).__name__] + [f"{k}={short.repr(v)}" for k, v in given.items()
                                       if v is not None and not (k == "scope" and v == "local")]
    return "lopper.prune({})".format(", ".join(parts))


def _check_module(module, op):
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"[{op}] module must be a torch.nn.Module, got {type(module).__name__}")


def _module_device(module):
    """The device of the module's first parameter ("cpu" without parameters)."""
    first = next(module.parameters(), None)
    return str(first.device) if first is not None else "cpu"


def _parameter(sub, attr):
    """The parameter that holds ``sub.<attr>``: ``<attr>_orig`` when torch.nn.utils.prune masks
    it (``<attr>`` is then computed from it), else ``<attr>`` itself."""
    for hook in sub._forward_pre_hooks.values():
        if isinstance(hook, _torch_prune.BasePruningMethod) and hook._tensor_name == attr:
            return sub._parameters[attr + "_orig"]
    return sub._parameters[attr]


def _apply(masks, values, holders, keep_masks=True):
    """Copies {parameter name: new value} into the parameters (in their dtype and on their
    device), then applies {parameter name: keep-mask} with torch.nn.utils.prune.custom_from_mask
    to every submodule that holds the parameter (``holders`` as _holders gives it).

    The export keeps each parameter as an initializer of its own name and layout (a Linear's
    weight [out, in] as it is, read through a Transpose or Gemm's transB; GPT-2's Conv1D [in, out]
    as it is), so a value or mask has the parameter's shape; one that has not is a RuntimeError,
    raised before anything changes."""
    # Every value and mask is matched to its parameters before the first is applied: all or
    # nothing.
    copies, todo = {}, []
    for name, value in values.items():
        for sub, attr in holders[name]:
            p = _parameter(sub, attr)
            copies[id(p)] = (p, value)  # a tied parameter once
    for name, mask in masks.items():
        for sub, attr in holders[name]:
            todo.append((sub, attr, mask))
    for p, value in copies.values():
        if tuple(p.shape) != tuple(value.shape):
            raise RuntimeError(f"[prune] the export's weight has shape {list(value.shape)}, its "
                               f"parameter {list(p.shape)}")
    for sub, attr, mask in todo:
        if tuple(getattr(sub, attr).shape) != tuple(mask.shape):
            raise RuntimeError(f"[prune] the export's weight has shape {list(mask.shape)}, its "
                               f"parameter {list(getattr(sub, attr).shape)}")
    with torch.no_grad():
        for p, value in copies.values():
            p.copy_(value.to(device=p.device, dtype=p.dtype))
        if not keep_masks:  # the zeros written into the parameters, no mask kept
            done = set()
            for sub, attr, mask in todo:
                p = _parameter(sub, attr)
                if id(p) not in done:
                    done.add(id(p))
                    p.mul_(mask.to(device=p.device, dtype=p.dtype))
            return
    for sub, attr, mask in todo:
        _torch_prune.custom_from_mask(sub, attr, mask.to(getattr(sub, attr).device))


def _split_inputs(example_inputs, op="prune", module=None):
    """(positional, keyword) arguments of `module`'s forward; a transformers model is run without
    its key/value cache (see _without_cache)."""
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), _hf.without_cache(module, {})
    if isinstance(example_inputs, dict):
        return (), _hf.without_cache(module, dict(example_inputs))
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), _hf.without_cache(module, {})
    raise TypeError(f"[{op}] example_inputs must be a tensor, a tuple of positional arguments or a "
                    f"dict of keyword arguments, got {type(example_inputs).__name__}")


def _pruned(module):
    """(submodule name, submodule, tensor name) of every tensor torch.nn.utils.prune masks."""
    out = []
    for prefix, sub in module.named_modules(remove_duplicate=False):
        for hook in sub._forward_pre_hooks.values():
            if isinstance(hook, _torch_prune.BasePruningMethod):
                out.append((prefix, sub, hook._tensor_name))
    return out


def _holders(module):
    """{parameter name as the export names it: [(submodule, attribute), ...]}: every submodule
    that holds the parameter (a tied one has several), a masked ``weight`` under its own name."""
    masked = {(id(sub), name) for _, sub, name in _pruned(module)}
    by_name, by_param = {}, {}
    for prefix, sub in module.named_modules(remove_duplicate=False):
        for attr, p in sub._parameters.items():
            if p is None:
                continue
            if attr.endswith("_orig") and (id(sub), attr[:-5]) in masked:
                attr = attr[:-5]
            name = f"{prefix}.{attr}" if prefix else attr
            by_name[name] = p
            by_param.setdefault(id(p), [])
            if (sub, attr) not in by_param[id(p)]:
                by_param[id(p)].append((sub, attr))
    return {name: by_param[id(p)] for name, p in by_name.items()}


def _export(module, args, kwargs, dynamic, op="prune", fx=True, fx_outputs=None, external=None):
    """The module's ONNX bytes, with every parameter an initializer under its own name, and
    _holders(module). Written from its torch.fx trace where _fx can (``fx``) and lopper's executor
    then computes the module's outputs from it, else exported by torch.onnx.export. With
    ``fx_outputs`` (a list), only a torch.fx graph is made: it is returned unchecked and the
    module's outputs are put in the list for the caller to check against the graph's; where _fx
    cannot write the module, the bytes are None; with ``external`` (a list) too, the torch.fx
    graph's initializers are put there as (name, tensor), not in the bytes."""
    # NOTE: an unchecked torch.fx graph (fx_outputs) is neither reused nor kept.
    cached = fx_outputs is None
    if cached:
        key, tensors = _export_key(module, args, kwargs, dynamic, fx)
        last = _LAST_EXPORT.get(module)
        if (last is not None and last[0] == key and len(last[1]) == len(tensors)
                and all(a is b for a, b in zip(last[1], tensors))):
            return last[2], _holders(module)
    model, holders = _export_model(module, args, kwargs, dynamic, op, fx, fx_outputs, external)
    if model is None:
        return None, holders
    if not isinstance(model, bytes):
        import onnx_ir

        model = onnx_ir.to_proto(model).SerializeToString()
    _LAST_EXPORT.clear()
    if cached and len(model) <= _CACHED_BYTES:
        _LAST_EXPORT[module] = (key, tensors, model)
    return model, holders


# The last export, reused by the next call on the same module in the same state (lopper.sensitivity,
# then lopper.prune_to_target with its report): one entry, released with its module, and none over
# _CACHED_BYTES (it holds a copy of the weights).
_LAST_EXPORT = weakref.WeakKeyDictionary()
_CACHED_BYTES = 512 << 20


def _export_key(module, args, kwargs, dynamic, fx):
    """What an export depends on, and the module's tensors: the same tensors (compared by
    identity: the entry holds them, so a freed one's id cannot come back as another's) at the same
    versions (an in-place change, a new mask shows), the layers and their settings (extra_repr:
    strides, slopes, ...), a transformers model's config, the example's shapes and other values,
    and how it is exported."""
    named = (list(module.named_parameters(remove_duplicate=False)) +
             list(module.named_buffers(remove_duplicate=False)))
    versions = tuple((name, t._version, tuple(t.shape), t.dtype, str(t.device))
                     for name, t in named)
    layers = tuple((name, type(m), m.extra_repr()) for name, m in module.named_modules())
    config = getattr(module, "config", None)
    config = config.to_json_string() if hasattr(config, "to_json_string") else None
    example = tuple(
        (tuple(x.shape), x.dtype, str(x.device)) if isinstance(x, torch.Tensor) else repr(x)
        for x in torch.utils._pytree.tree_leaves((args, kwargs)))
    # NOTE: a forward set on the instance is not compared (it may hold the module): never reused.
    forward = type(module).forward if "forward" not in vars(module) else object()
    key = (versions, layers, config, example, tuple(kwargs), dynamic, fx, forward)
    return key, [t for _, t in named]


def _export_model(module, args, kwargs, dynamic, op="prune", fx=True, fx_outputs=None,
                  external=None):
    """_export's graph as it comes: the torch.fx graph's ONNX bytes, or torch.onnx.export's
    onnx_ir model (which a file with external data holds at any size; its protobuf stops at
    2 GB)."""
    holders = _holders(module)
    target = module
    pruned = _pruned(module)
    if pruned:
        # NOTE: a masked weight is computed in forward (orig * mask), so the export would not see
        # it as a weight: export a copy with the masks made permanent. The copy shares every other
        # parameter and buffer with the module (memo), and a computed weight is a plain tensor to
        # deepcopy (which refuses non-leaf tensors).
        memo = {id(t): t for t in list(module.parameters()) + list(module.buffers())}
        for _, sub, name in pruned:
            memo.pop(id(getattr(sub, name + "_orig")), None)
            memo[id(getattr(sub, name))] = getattr(sub, name).detach()
        target = copy.deepcopy(module, memo)
        for _, sub, name in _pruned(target):
            _torch_prune.remove(sub, name)
    params = {name for name, _ in target.named_parameters(remove_duplicate=False)}
    modes = [(m, m.training) for m in target.modules()]
    target.eval()

    def specs(x):
        # The batch dim is dynamic, and every dim of an integer input (token ids, masks: the
        # sequence length varies). Float inputs (images, features) keep their other dims: a
        # convolution's output size computed from a dynamic height is shape arithmetic a
        # Flatten's target would carry, and channels could not be followed through it.
        if isinstance(x, torch.Tensor):
            dims = range(x.dim()) if not x.is_floating_point() else range(min(x.dim(), 1))
            return {i: torch.export.Dim.AUTO for i in dims}
        return None

    def export(shapes):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # NOTE: torch.onnx.export reads a trailing dict of args as the keyword arguments when
            # none are given: a module whose last positional argument is a dict gets an empty dict
            # after it, which the exporter takes as the (empty) keywords instead.
            positional = args + ({},) if not kwargs and args and isinstance(args[-1], dict) else args
            program = torch.onnx.export(target, positional, kwargs=kwargs, dynamo=True,
                                        optimize=False, verbose=False, dynamic_shapes=shapes)
        # NOTE: not the exporter's optimizer: it folds a Transpose of a weight into a new,
        # renamed constant, fuses BatchNorm into convolutions and merges equal initializers. Only
        # constant folding that reads no parameter (it turns SplitToSequence into Split, shape
        # arithmetic into constants).
        import onnxscript.optimizer

        def should_fold(node):
            for v in node.inputs:
                if v is not None and v.is_initializer() and v.name in params:
                    return False
            return None

        onnxscript.optimizer.fold_constants(program.model, should_fold=should_fold)
        onnxscript.optimizer.remove_unused_nodes(program.model)
        return program.model

    try:
        fast = _fx.onnx_of(target, args, kwargs, external) if fx else None
        if fx_outputs is not None:
            if fast is None:
                return None, holders
            fx_outputs.extend(fast[1])
            return fast[0], holders
        if fast is not None and _runs_as(fast[0], args, fast[1]):
            return fast[0], holders
        if dynamic:
            # Calibration batches may differ from the example in batch size and sequence length:
            # those dims are dynamic where the module lets them be (else the example's shapes).
            shapes = tuple(torch.utils._pytree.tree_map(specs, a) for a in args) + tuple(
                torch.utils._pytree.tree_map(specs, v) for v in kwargs.values())
            try:
                return export(shapes), holders
            except Exception:
                pass
        try:
            return export(None), holders
        except Exception as e:
            raise RuntimeError(
                f"[{op}] the module does not export to ONNX: {_first_line(e)}") from e
    finally:
        for m, mode in modes:
            m.training = mode


def _runs_as(exported, args, expected):
    """Whether lopper's executor computes the module's outputs `expected` from the export."""
    try:
        got = _lopper._run_export(exported, [a.detach().contiguous() for a in args],
                                  str(args[0].device))
    except RuntimeError:
        return False
    return _same_outputs(got, expected)


def _same_outputs(got, expected):
    """Whether the graph's outputs `got` are the module's `expected`, to float rounding (1e-4 of
    each output's largest magnitude): a torch.fx graph is used only then."""
    if len(got) != len(expected):
        return False
    for a, b in zip(got, expected):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        a = a.to(b.device)
        if not b.is_floating_point():
            if not torch.equal(a, b):
                return False
            continue
        if not bool(torch.isfinite(b).all()):
            return False
        scale = float(b.abs().max()) if b.numel() else 0.0
        if b.numel() and float((a - b).abs().max()) > 1e-4 * max(scale, 1e-6):
            return False
    return True


def _first_line(e):
    cause = e
    while cause.__cause__ is not None:
        cause = cause.__cause__
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0] if text else ''}"


class _Progress:
    """Progress of long work: a tqdm bar when tqdm is installed, else a few plain lines on stderr.

    Called as progress(done, total, info) after each step: ``info`` is the loss (a float, shown as
    "loss 0.1234") or what the step did (a str); ``total`` 0 or None when it is not known. Step
    0 with a str is the plan of the work, printed as a line of its own.
    """

    def __init__(self, label):
        self.label = label
        self.bar = None
        self.printed = 0
        self.kind = None  # the info of the series shown: True a str, False a loss
        try:
            from tqdm.auto import tqdm
        except ImportError:
            tqdm = None
        self.tqdm = tqdm

    def __call__(self, done, total, info):
        text = info if isinstance(info, str) else f"loss {info:.4f}"
        total = total or None
        kind = isinstance(info, str)
        if self.kind is not None and self.kind != kind:
            # Another series (a recipe's gradient batches, then the calibration passes): a new bar.
            self.close()
            self.bar, self.printed = None, 0
        self.kind = kind
        if done == 0 and kind:
            # Step 0: the plan of the work, said before it starts (a sweep's points and batches).
            if self.tqdm is not None:
                self.tqdm.write(f"{self.label}: {text}", file=sys.stderr)
            else:
                print(f"{self.label}: {text}", file=sys.stderr, flush=True)
            return
        if self.tqdm is not None:
            if self.bar is None:
                unit = "step" if isinstance(info, str) else "batch"
                self.bar = self.tqdm(total=total, desc=self.label, unit=unit)
            elif total is not None and self.bar.total != total:
                self.bar.total = total
            self.bar.set_postfix_str(text, refresh=False)
            self.bar.update(done - self.bar.n)
            return
        # Plain lines: about four over the run, and always the last; without a total, at steps
        # 1, 2, 4, 8, ...
        if total is None:
            due = (done & (done - 1)) == 0
        else:
            due = done == total or done * 4 >= (self.printed + 1) * total
        if due:
            self.printed += 1
            of = f"/{total}" if total is not None else ""
            print(f"{self.label} {done}{of}  {text}", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()
