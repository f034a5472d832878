"""A reward call bounded in time: ``bounded_call`` runs one call of a reward function (a whole
generation batch) in a thread of its own, and one that does not return within ``REWARD_CALL_LIMIT_S``
ends the run with one line naming the reward and the line of its file it was at, as the local check
before launch says it; the watchdog's time and money limits are only the backstop.

Pure Python (no torch import): torch's grad mode is carried into the thread when torch is loaded.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

# A reward call scores one generation batch (hundreds of completions); one that has not returned in five
# minutes is taken to loop, not to be slow (a step's generation is of the order of a minute).
REWARD_CALL_LIMIT_S = 300.0


class _Abandoned(BaseException):
    """Raised inside a reward call that ran past its limit, to end a pure-Python loop in its thread
    (a BaseException, so a reward's own ``except Exception`` does not swallow it)."""


def bounded_call(
    fn: Callable[[], Any], *, shown: str, n: int, limit_s: float | None = REWARD_CALL_LIMIT_S, source: str | None = None
) -> Any:
    """``fn()``, in a thread of its own, within ``limit_s`` seconds: its value, or its exception as raised.
    Past the limit a FatalWorkerError (not retried: the same code loops again) names the reward
    (``shown``) and the line of ``source`` (its file) it was at. No signal is used, so it works on any
    thread of a training process; a thread stuck in C code is left behind as a daemon, since the run ends.
    ``limit_s`` None: called as is (the LLM judge bounds each request itself, with its retries)."""
    from autoslm.errors import FatalWorkerError

    if limit_s is None:
        return fn()
    torch = sys.modules.get("torch")
    grad = torch.is_grad_enabled() if torch is not None else None  # grad mode is per thread
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            if grad is None:
                box["value"] = fn()
            else:
                with torch.set_grad_enabled(grad):
                    box["value"] = fn()
        except _Abandoned:
            pass
        except BaseException as e:  # noqa: BLE001 - handed to the caller as raised
            box["error"] = e

    t = threading.Thread(target=run, name=f"reward {shown}", daemon=True)
    t.start()
    t.join(limit_s)
    if not t.is_alive():
        if "error" in box:
            raise box["error"]
        return box.get("value")
    line = _line_in(sys._current_frames().get(t.ident), source)
    _interrupt(t)
    at = f" (it was at line {line})" if line else ""
    raise FatalWorkerError(
        f"reward {shown} did not return within {limit_s:g} s when called on a batch of {n} "
        f"completions{at}: fix the loop, or make it faster (it scores a whole batch at every training step)"
    )


def _line_in(frame: Any, source: str | None) -> int | None:
    """The line of ``source`` the innermost of its frames in ``frame``'s stack was at."""
    while frame is not None and source:
        if frame.f_code.co_filename == source:
            return frame.f_lineno
        frame = frame.f_back
    return None


def _interrupt(t: threading.Thread) -> None:
    """Raise _Abandoned in ``t`` at its next bytecode (a pure-Python loop ends; a C call finishes first)."""
    import ctypes

    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(t.ident), ctypes.py_object(_Abandoned))


__all__ = ["REWARD_CALL_LIMIT_S", "bounded_call"]
