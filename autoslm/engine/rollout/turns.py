"""What a multi-turn generation batch trains on, after TRL has scored it.

TRL builds each generation batch in ``GRPOTrainer._generate_and_score_completions``: the rollout
(``multiturn.MultiTurnRollout``) plays the episodes, the reward functions score them, advantages are
taken within each group, and the batch carries ``tool_mask`` (the rollout's ``env_mask``: 1 on the
model's tokens, 0 on the environment's), which TRL multiplies into the loss mask. ``TurnShaping`` is a
step of that method (``engine.train.trainer``) and, with the episodes the rollout kept (same rows, same
order):

- **drops episodes over the length limit** (``Episode.over_length``: cut at the end of the episode's
  token budget, or out of room for the next turn), with ``train.mask_truncated_completions``: their tokens leave the loss, and the
  advantages of their group are taken again over the members that remain, so a dropped episode's
  reward no longer moves its siblings' baseline. A group that loses every member trains on nothing
  and is counted. (A turn cut at its own share, ``train.max_turn_tokens``, is not over the limit:
  the episode goes on and keeps its place in its group, and TRL masks it from the loss when its last
  turn was cut so. Measured: dropping those too took away the one signal against rambling, that a
  finished answer beats a cut one in the same group, and the critique quickstart collapsed into
  turns that never end, every episode dropped, at step ~175 of 300.) Advantages are recomputed from TRL's: with ``scale_rewards = "none"`` (the default)
  ``a_i - mean_kept(a)`` is exactly ``r_i - mean_kept(r)``; with ``"group"`` the kept advantages are
  re-standardised (exact up to TRL's 1e-4 epsilon); with ``"batch"`` they are re-centred and keep the
  batch's scale.
- **weighs each turn's tokens** by ``train.turn_loss_weights`` (the model's tokens of turn t get the
  t-th weight; later turns the last one): the weights multiply ``tool_mask``, so every loss type sums
  ``per_token_loss * weight``. ``dr_grpo`` (the default), ``dapo`` and ``cispo`` keep their unweighted
  normalisers (batch x ``max_completion_length``; ``num_items_in_batch``, counted before), so a weight
  of 0.5 halves exactly that turn's contribution; ``grpo`` and ``bnpo`` divide by the mask's sum, so
  there the weights set each turn's share of a weighted mean.
- **logs the environment's batch metrics** (``env.episode_metrics(episodes)``, e.g. the critique
  task's outcome fractions) and the drop counts into TRL's step metrics, so they reach the "step"
  events: ``multiturn/dropped`` (episodes dropped), ``multiturn/groups_emptied`` (groups left with no
  member). On several processes the counts are summed and the fractions pooled over all of them.

Torch is imported inside the functions (the module is imported by the worker only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autoslm.recipes.grpo import turn_weight


def weighted_mask(mask, episodes: Sequence, weights: list[float] | None):
    """``mask`` (rows x completion tokens, right-padded) with each episode's tokens times the weight of
    the turn they belong to."""
    import torch

    if not weights:
        return mask
    w = torch.ones(mask.shape, dtype=torch.float32, device=mask.device)
    for row, e in enumerate(episodes):
        ids = e.turn_ids[: mask.shape[1]]
        if ids:
            w[row, : len(ids)] = torch.tensor([turn_weight(weights, t) for t in ids], dtype=torch.float32)
    return mask.to(torch.float32) * w


def recompute_advantages(advantages, keep: Sequence[bool], group_size: int, scale: str = "none") -> tuple[object, int]:
    """(advantages taken again over the kept members of each group, 0 for the dropped; how many groups
    kept no member). ``advantages`` are TRL's, whole groups in order."""
    import torch

    adv = advantages.clone()
    kept = torch.tensor(list(keep), dtype=torch.bool, device=adv.device)
    emptied = 0
    for g in range(adv.shape[0] // group_size):
        sl = slice(g * group_size, (g + 1) * group_size)
        k = kept[sl]
        n = int(k.sum())
        if n == 0:
            emptied += 1
        if n == group_size:
            continue
        a = adv[sl]
        if n <= 1:
            adv[sl] = 0.0  # a lone survivor has no baseline to be compared with
            continue
        centred = a - a[k].mean()
        if scale == "group":
            std = a[k].std()
            centred = centred / std if float(std) > 1e-8 else centred * 0.0
        adv[sl] = torch.where(k, centred, torch.zeros_like(centred))
    return adv, emptied


@dataclass(frozen=True)
class TurnShaping:
    """The multi-turn shaping step of a generation batch (the module docstring), for
    ``engine.train.trainer.GenerationSteps.shaping``: ``rollout``'s last episodes are the batch's rows."""

    rollout: object
    group_size: int
    turn_loss_weights: list[float] | None
    drop_over_length: bool
    scale_rewards: str = "none"

    def __call__(self, trainer, out: dict) -> dict[str, float]:
        """Shape ``out`` (TRL's scored batch) in place; the step's metrics (empty when ``out`` is not the
        rollout's batch). ``trainer``: its ``accelerator`` pools the metrics over processes."""
        episodes = list(self.rollout.last_episodes)
        adv = out.get("advantages")
        if adv is None or len(episodes) != adv.shape[0]:
            return {}  # not the rollout's batch (nothing to match the rows with)
        mask_key = "tool_mask" if out.get("tool_mask") is not None else "completion_mask"
        dropped = emptied = 0
        if self.drop_over_length:
            keep = [not e.over_length for e in episodes]
            dropped = keep.count(False)
            if dropped:
                out["advantages"], emptied = recompute_advantages(adv, keep, self.group_size, self.scale_rewards)
                import torch

                rows = torch.tensor(keep, dtype=out[mask_key].dtype, device=out[mask_key].device).unsqueeze(1)
                out[mask_key] = out[mask_key] * rows
        out[mask_key] = weighted_mask(out[mask_key], episodes, self.turn_loss_weights)
        counts = {"multiturn/dropped": float(dropped), "multiturn/groups_emptied": float(emptied)}
        env_metrics = getattr(self.rollout.env, "episode_metrics", None)
        fractions = env_metrics(episodes) if env_metrics is not None else {}
        return pooled(getattr(trainer, "accelerator", None), counts, fractions, len(episodes))


def pooled(acc, counts: dict[str, float], fractions: dict[str, float], n: int) -> dict[str, float]:
    """Counts summed over processes, fractions pooled (weighted by each process's ``n`` rows)."""
    keys_c, keys_f = sorted(counts), sorted(fractions)
    values = [counts[k] for k in keys_c] + [fractions[k] * n for k in keys_f] + [float(n)]
    if acc is not None and getattr(acc, "num_processes", 1) > 1:
        import torch

        t = acc.reduce(torch.tensor(values, dtype=torch.float64, device=acc.device), reduction="sum")
        values = [float(v) for v in t.tolist()]
    total = max(values[-1], 1.0)
    out = dict(zip(keys_c, values[: len(keys_c)], strict=True))
    out.update((k, v / total) for k, v in zip(keys_f, values[len(keys_c) : -1], strict=True))
    return out
