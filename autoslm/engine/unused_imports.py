"""Imports that a worker's libraries make wherever a package is installed, for a feature the run does not
use, kept out of a worker's start.

transformers' assisted generation (``transformers.generation.candidate_generator``, which every model
class imports) imports scikit-learn's ``roc_curve`` at import time whenever scikit-learn is installed,
for a confidence threshold of assisted decoding that autoslm never turns on. lm-eval requires
scikit-learn, so it is installed on every pod and worker stack, and that import is 0.7 to 0.9 s of CPU
at every worker start (a tenth of the worker's imports).

That one module is imported with scikit-learn hidden (a ``None`` in ``sys.modules``: ``find_spec``,
which transformers asks, answers None), then scikit-learn is put back: a reward function, lm-eval's
metrics or anything else that imports it later gets it as ever. Only assisted generation's threshold,
which transformers then reports as unavailable, goes without it.

bitsandbytes (the image's QLoRA) wraps its default kernels in ``torch.compile`` when it is imported, and
peft imports it wherever it is installed. Creating those compiled functions imports torch's compiler
(``torch._inductor``): 1.3 to 1.6 s of CPU at every start of a worker that never quantizes on its CPU.
Without CUDA it is imported with ``torch.compile`` refusing, so that each of those kernels stays the
plain function: bitsandbytes' own fallback where compiling fails. With CUDA it is imported as ever.
"""

from __future__ import annotations

import importlib.util
import sys

HIDDEN = "sklearn"
MODULE = "transformers.generation.candidate_generator"


def import_transformers_without_sklearn() -> None:
    """Import ``MODULE`` (and with it transformers' core) without scikit-learn; nothing when either is
    already imported or transformers is not installed."""
    if MODULE in sys.modules or HIDDEN in sys.modules:
        return
    sys.modules[HIDDEN] = None  # type: ignore[assignment]
    try:
        __import__(MODULE)
    except ImportError:
        pass  # no transformers here (or another layout of it): the worker's own imports say so
    finally:
        if sys.modules.get(HIDDEN, 0) is None:
            del sys.modules[HIDDEN]


def import_bitsandbytes_eager() -> None:
    """Import bitsandbytes, where it is installed and there is no CUDA, with its kernels left uncompiled
    (see the module docstring); nothing when it is already imported, not installed, or CUDA is there."""
    if "bitsandbytes" in sys.modules or importlib.util.find_spec("bitsandbytes") is None:
        return
    import torch

    if torch.cuda.is_available():
        return
    compile_ = torch.compile

    def refuse(*args, **kwargs):
        raise RuntimeError("not compiled: imported by a worker without CUDA")

    torch.compile = refuse
    try:
        import bitsandbytes  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken install is peft's to report, as it would without this
        pass
    finally:
        torch.compile = compile_
