"""Python's cyclic garbage collector paused while a worker starts.

Importing torch, transformers, TRL and peft, then loading the model and building the trainer, makes
about a million objects that live as long as the process. With the collector on, each of its full
collections during that start walks every object made so far: about a second of CPU per worker start
on the trainer's imports alone (median of six: 7.6 s with the collector, 6.7 s without). Paused for the
start only; then one collection of what the start left over, and the collector runs as before while
training, so a cycle made then (an exception's frames holding tensors, the colocated engine let go) is
collected as ever. Nothing is frozen: ``gc.freeze`` would keep forever a cycle that a later release
leaves behind among objects made before it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The collector off inside the block (left as found where it was already off), on after it."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()
