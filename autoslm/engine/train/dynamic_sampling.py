"""Dynamic sampling for GRPO: a generation batch's all-equal groups (zero advantage: they teach
nothing) replaced by informative groups from fresh prompts, and the merge of chosen groups of several
batches into one (also used by the out-of-memory halving, ``engine.rollout.halving``).

A step of the trainer's generation batch (``engine.train.trainer.GenerationSteps``), built by
``engine.train.grpo.generation_steps``.
"""

from __future__ import annotations


class DynamicSampling:
    """Drop groups whose rewards are all equal (zero advantage: they teach nothing) and fill the step
    with informative groups drawn from fresh prompts, as in DAPO / NeMo RL dynamic sampling.

    A step of the trainer's generation batch (``engine.train.trainer``): after the batch is scored, its
    all-equal groups are replaced by informative groups of up to ``max_draws`` extra batches of fresh
    prompts (the step keeps exactly the same number of groups; if draws run out, the leftover all-equal
    groups stay, contributing no gradient).

    On several processes each rank holds whole groups of its own prompts (recipes/batching.py) and
    replaces its own all-equal groups. TRL gathers rewards across ranks inside every generation call,
    so all ranks must draw equally often: they draw while any rank still lacks groups (a sum over
    torch.distributed), each taking its own share of one shared stream of fresh prompts.
    """

    def __init__(self, group_size: int, reporter, max_draws: int = 4):
        self.group_size, self.reporter, self.max_draws = group_size, reporter, max_draws
        self._rows = None  # the stream of fresh prompts, from the trainer's dataset at the first call

    def __call__(self, trainer, inputs, generate):
        """The generation batch for ``inputs``, made by ``generate`` (TRL's, scored), its all-equal groups
        replaced. ``trainer``: its dataset, seed, tokenizer and accelerator (public attributes)."""
        import random

        if self._rows is None:
            self._rows = _cycle_rows(trainer.train_dataset, random.Random(trainer.args.seed))
        group_size = self.group_size
        tok = trainer.processing_class
        pad_id = tok.pad_token_id if hasattr(tok, "pad_token_id") else 0
        acc = trainer.accelerator
        world, rank = acc.num_processes, acc.process_index

        def total(n: int) -> int:  # summed over every rank
            if world == 1:
                return n
            import torch

            return int(acc.reduce(torch.tensor([n], device=acc.device), reduction="sum").item())

        out = generate(inputs)
        n_groups = len(inputs) // group_size
        keep = informative_groups(out["advantages"], group_size)
        draws = 0
        parts = [(out, keep)]
        have = len(keep)
        while draws < self.max_draws and total(n_groups - have) > 0:
            draws += 1
            shared = [next(self._rows) for _ in range(n_groups * world)]
            mine = shared[rank * n_groups : (rank + 1) * n_groups]
            fresh = generate([r for r in mine for _ in range(group_size)])
            good = informative_groups(fresh["advantages"], group_size)[: n_groups - have]
            parts.append((fresh, good))
            have += len(good)
        if draws == 0:
            return out
        leftover = [g for g in range(n_groups) if g not in keep][: n_groups - have]
        parts[0] = (out, keep + leftover)
        dropped, filled = total(n_groups - len(keep)), total(have - len(keep))
        self.reporter.event("dynamic_sampling", dropped_groups=dropped, draws=draws, filled=filled, processes=world)
        return merge_groups(parts, group_size, pad_id)


def informative_groups(advantages, group_size: int, tol: float = 1e-8) -> list[int]:
    """Indices of the groups whose advantages are not all zero."""
    values = advantages.tolist()
    return [
        g for g in range(len(values) // group_size) if any(abs(v) > tol for v in values[g * group_size : (g + 1) * group_size])
    ]


def merge_groups(parts, group_size: int, pad_id: int) -> dict:
    """One generation batch from the chosen groups of several: prompts stay left-padded, completions
    right-padded, everything per completion is selected row by row."""
    import torch

    base = parts[0][0]
    n = base["advantages"].shape[0]
    merged = {}
    for key, value in base.items():
        if not (torch.is_tensor(value) and value.dim() >= 1 and value.shape[0] == n):
            merged[key] = value
            continue
        pieces = []
        for out, groups in parts:
            idx = torch.tensor([g * group_size + j for g in groups for j in range(group_size)], dtype=torch.long)
            if len(idx):
                pieces.append(out[key].index_select(0, idx.to(out[key].device)))
        if value.dim() == 1:
            merged[key] = torch.cat(pieces)
            continue
        width = max(p.shape[1] for p in pieces)
        fill = pad_id if key.endswith("_ids") else 0
        left = key.startswith("prompt")
        padded = []
        for p in pieces:
            extra = width - p.shape[1]
            if extra:
                pad = torch.full((p.shape[0], extra, *p.shape[2:]), fill, dtype=p.dtype, device=p.device)
                p = torch.cat([pad, p] if left else [p, pad], dim=1)
            padded.append(p)
        merged[key] = torch.cat(padded)
    if "num_items_in_batch" in base and torch.is_tensor(merged.get("completion_mask")):
        total = merged["completion_mask"]
        if torch.is_tensor(merged.get("tool_mask")):
            total = total * merged["tool_mask"]
        merged["num_items_in_batch"] = (
            total.sum().to(base["num_items_in_batch"].dtype) if torch.is_tensor(base["num_items_in_batch"]) else int(total.sum())
        )
    return merged


def _cycle_rows(dataset, rng):
    order = list(range(len(dataset)))
    while True:
        rng.shuffle(order)
        for i in order:
            yield dataset[i]


__all__ = ["DynamicSampling", "informative_groups", "merge_groups"]
