"""lopper: prunes PyTorch models exported to ONNX, and runs them with its C++ executor.

    import lopper
    sess = lopper.InferenceSession("model.onnx")      # the call shape of onnxruntime's
    (logits,) = sess.run(None, {"input": x})          # x: a numpy array or a torch tensor

The work is done by lopper's C++ library (the extension module lopper._lopper), built against one
torch; this package imports only beside that torch.
"""
import torch as _torch

try:
    from lopper._build_info import TORCH_VERSION as _BUILT_AGAINST
except ImportError:  # python/lopper in the source tree: the build writes the package elsewhere
    raise ImportError(
        "lopper's extension is not built here: pip install . in lopper's source folder, or "
        "make build and PYTHONPATH=build/python") from None

# NOTE: before the extension loads: built against another torch, it would fail (or worse, not) on
# a C++ symbol instead of saying why.
if _torch.__version__ != _BUILT_AGAINST:
    raise ImportError(
        f"lopper was built against torch {_BUILT_AGAINST}, this interpreter has torch "
        f"{_torch.__version__}: rebuild lopper with this torch (pip install . in lopper's source "
        f"folder), or install torch=={_BUILT_AGAINST}")

from lopper._lopper import InferenceSession, NodeArg, __version__, distillation_loss  # noqa: E402
from lopper._prune import PruneLayerReport, PruneReport, make_permanent, prune  # noqa: E402
from lopper import _analysis, _structured  # noqa: E402
from lopper._onnx import export_onnx  # noqa: E402
from lopper._experts import ExpertReport  # noqa: E402
from lopper._analysis import *  # noqa: E402,F401,F403 (its __all__)
from lopper._structured import *  # noqa: E402,F401,F403 (its __all__)

__all__ = ["InferenceSession", "NodeArg", "PruneLayerReport", "PruneReport", "__version__",
           "export_onnx", "make_permanent", "prune"] + _analysis.__all__ + _structured.__all__
__all__ += ["ExpertReport", "distillation_loss"]
