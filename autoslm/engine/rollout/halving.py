"""A generation batch that runs out of GPU memory is generated again in halves, whole groups each.

``HalvingGeneration`` wraps one process's call that generates and scores a batch of prompts (TRL's
``_generate_and_score_completions``): on an out-of-memory error it halves the part it generates at once
(never below one group: a group's completions are scored against each other) and goes on from the part
that failed, then merges the parts. The smaller size is kept for the rest of the run, and said once.
It must never split where ranks have to make the same calls (several processes: TRL gathers rewards
across ranks inside each call), and never catches anything but an out-of-memory error.
No torch import: the tests drive it with plain lists and an injected generate function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def is_out_of_memory(e: BaseException) -> bool:
    """torch.cuda.OutOfMemoryError (or its subclasses), recognised by class name without importing torch."""
    return any(c.__name__ == "OutOfMemoryError" for c in type(e).__mro__)


class HalvingGeneration:
    """``generate(inputs)`` in parts of at most ``size`` inputs, halved on each out-of-memory error.

    ``merge(parts)`` joins the outputs of the parts (in order); ``on_halve(old, new)`` is called once, the
    first time the size is halved; ``free()`` runs before each retry (torch.cuda.empty_cache on a GPU).
    An out-of-memory error at one group, or with ``can_split`` false, is raised as it was."""

    def __init__(
        self,
        generate: Callable[[Sequence[Any]], Any],
        merge: Callable[[list[Any]], Any],
        group_size: int,
        *,
        can_split: bool = True,
        on_halve: Callable[[int, int], None] = lambda old, new: None,
        free: Callable[[], None] = lambda: None,
    ):
        self.generate = generate
        self.merge = merge
        self.group_size = max(1, group_size)
        self.can_split = can_split
        self.on_halve = on_halve
        self.free = free
        self.size: int | None = None  # inputs generated at once; None: the whole batch
        self._said = False

    def __call__(self, inputs: Sequence[Any]) -> Any:
        n = len(inputs)
        parts: list[Any] = []
        start = 0
        while start < n:
            size = min(self.size or n, n - start)
            try:
                parts.append(self.generate(inputs[start : start + size]))
            except Exception as e:  # only an out-of-memory error is retried; anything else is raised as it was
                if not is_out_of_memory(e) or not self.can_split or size <= self.group_size:
                    raise
                self._halve(size)
                continue
            start += size
        return parts[0] if len(parts) == 1 else self.merge(parts)

    def _halve(self, size: int) -> None:
        new = max(self.group_size, size // 2 // self.group_size * self.group_size)
        self.free()
        if not self._said:
            self._said = True
            self.on_halve(size, new)
        self.size = new


def halving_generation(
    original: Callable[[Sequence[Any]], Any],
    plan: Any,
    engine: str,
    reporter: Any,
    merge_groups: Callable[[list[tuple[Any, list[int]]]], Any],
) -> HalvingGeneration:
    """A GRPO trainer's generate-and-score call (TRL's ``_generate_and_score_completions``) that halves
    its batch on an out-of-memory error and says so once (a line and a ``generation_batch_halved``
    event). ``plan``: the batch plan (``group_size``, ``num_processes``); with several processes it never
    splits. ``merge_groups(parts)`` joins (output, groups kept) pairs into one batch
    (engine/train/dynamic_sampling.py)."""
    group = plan.group_size

    def merge(outs: list[Any]) -> Any:
        return merge_groups([(o, list(range(len(o["advantages"]) // group))) for o in outs])

    def free() -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def said(old: int, new: int) -> None:
        line = (
            f"out of GPU memory generating {old} completions with {engine}: generating {new} at a time from now on "
            "(slower; lower train.prompts_per_step or group_size to avoid it)"
        )
        print(f"[autoslm] {line}", flush=True)
        if reporter is not None:
            reporter.event("generation_batch_halved", completions=old, now=new, message=line)

    return HalvingGeneration(original, merge, group, can_split=plan.num_processes == 1, on_halve=said, free=free)
