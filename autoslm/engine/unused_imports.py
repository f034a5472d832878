"""Imports that a worker's libraries make wherever a package is installed, for a feature the run does not
use, kept out of a worker's start.

transformers imports two of them at import time whenever they are installed, both for models and modes
autoslm never trains:

- scikit-learn's ``roc_curve``, in assisted generation (``transformers.generation.candidate_generator``,
  which every model class imports), for a confidence threshold of assisted decoding that autoslm never
  turns on;
- SciPy's ``linear_sum_assignment``, in the object-detection losses (``transformers.loss``, which
  ``transformers.modeling_utils`` imports), for the Hungarian matching of DETR-like vision models.

lm-eval requires both, so they are installed on every pod and worker stack. Measured where Python's
collector runs: 0.7 to 0.9 s of CPU for scikit-learn and 1.25 s for SciPy (its optimize package pulls in
its sparse and linear-algebra packages). Inside a worker's start, where the collector is paused
(engine/gc_pause.py), SciPy's share measured 0.24 s (6.21 -> 5.97 CPU-s, six runs each). Those two
transformers modules are imported with both
packages hidden (a ``None`` in ``sys.modules``: ``find_spec``, which transformers asks, answers None),
then the packages are put back: a reward function, lm-eval's metrics or anything else that imports
them later gets them as ever. Only the features above, which transformers then reports as unavailable,
go without them.

bitsandbytes (the image's QLoRA) wraps its default kernels in ``torch.compile`` when it is imported, and
peft imports it wherever it is installed. Creating those compiled functions imports torch's compiler
(``torch._inductor``): 1.3 to 1.6 s of CPU at every start of a worker that never quantizes on its CPU.
Without CUDA it is imported with ``torch.compile`` refusing, so that each of those kernels stays the
plain function: bitsandbytes' own fallback where compiling fails. With CUDA it is imported as ever.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager

HIDDEN = ("sklearn", "scipy")
MODULES = ("transformers.generation.candidate_generator", "transformers.modeling_utils")


@contextmanager
def hidden(names: tuple[str, ...]) -> Iterator[None]:
    """Inside the block, importing any of ``names`` fails as if it were not installed, and
    ``importlib.util.find_spec`` answers None; after it they import as ever. A name already imported
    stays as it is."""
    hid = [n for n in names if n not in sys.modules]
    for name in hid:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for name in hid:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def import_transformers_without_unused() -> None:
    """Import ``MODULES`` (and with them transformers' core) without ``HIDDEN``; nothing when they are
    already imported or transformers is not installed."""
    if all(m in sys.modules for m in MODULES):
        return
    with hidden(HIDDEN):
        for module in MODULES:
            try:
                __import__(module)
            except ImportError:
                return  # no transformers here (or another layout of it): the worker's own imports say so


def import_stack_without_unused() -> None:
    """What every process of the worker's stack (the trainer, lm-eval's harness, the export) imports first:
    transformers without ``HIDDEN``, and bitsandbytes without torch's compiler where there is no CUDA."""
    import_transformers_without_unused()
    import_bitsandbytes_eager()


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
