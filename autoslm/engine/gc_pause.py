"""Python's cyclic garbage collector paused while a worker starts, and what the start made left out of
its collections while the worker trains.

Importing torch, transformers, TRL and peft, then loading the model and building the trainer, makes
about a million objects that live as long as the process. With the collector on, each of its full
collections during that start walks every object made so far: about a second of CPU per worker start
on the trainer's imports alone (median of six: 7.6 s with the collector, 6.7 s without). Paused for the
start only; then one collection of what the start left over (a model load's cycles can hold tensors),
and the collector runs as before while training, so a cycle made then is collected as ever.

What survived that collection is then frozen (``gc.freeze``: moved where collections do not look)
until training ends (``thaw``). transformers' training loop calls ``gc.collect()`` once more as it
starts (accelerate's ``free_memory``), which would walk that million again: 0.41 s of CPU, measured in
a quickstart worker's profile, against 0.46 s for the start's own collection. Thawed when training
ends, before the colocated engine is let go and lm-eval collects, so a cycle that a later release
leaves among the start's objects is collected as ever.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The collector off inside the block (left as found where it was already off), on after it, with what
    the block made and kept frozen until ``thaw()``."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()
        gc.freeze()


def thaw() -> None:
    """What ``collector_paused`` froze, back among what collections look at (nothing where nothing was)."""
    gc.unfreeze()
