"""An import that transformers makes wherever a package is installed, for a feature no run uses, kept
out of a worker's start.

transformers' assisted generation (``transformers.generation.candidate_generator``, which every model
class imports) imports scikit-learn's ``roc_curve`` at import time whenever scikit-learn is installed,
for a confidence threshold of assisted decoding that autoslm never turns on. lm-eval requires
scikit-learn, so it is installed on every pod and worker stack, and that import is 0.7 to 0.9 s of CPU
at every worker start (a tenth of the worker's imports).

That one module is imported with scikit-learn hidden (a ``None`` in ``sys.modules``: ``find_spec``,
which transformers asks, answers None), then scikit-learn is put back: a reward function, lm-eval's
metrics or anything else that imports it later gets it as ever. Only assisted generation's threshold,
which transformers then reports as unavailable, goes without it.
"""

from __future__ import annotations

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
