"""What a GRPO run reports while and after it trains: each reward function's mean and a few rollouts
per logged step (``make_grpo_callback``), the advantage numbers TRL does not log (``advantage_metrics``,
a step of the generation batch), and the reward curve of the finished run (``reward_summary``).
"""

from __future__ import annotations

import json
import math

# Reward-curve summary: the mean reward of the first and of the last tenth of the logged steps.
CURVE_FRACTION = 10
# Completions dumped per step as "rollout" events (the whole batch would swamp the event log).
ROLLOUTS_PER_STEP = 2


def reward_summary(log_history: list[dict]) -> dict:
    """The reward curve from the trainer's log (which a resumed run restores from its checkpoint).
    A step where no completion could be scored (every reward None, ``on_reward_error = "none"``) logs
    its reward as None (TRL) or NaN: it has no point on the curve, and when no step has one, the first
    and last rewards are None."""
    logged = [h for h in log_history if "reward" in h and "step" in h]
    if not logged:
        return {}
    curve = [
        (h["step"], float(h["reward"])) for h in logged if isinstance(h["reward"], (int, float)) and math.isfinite(h["reward"])
    ]
    if not curve:
        return {"reward_first": None, "reward_last": None, "reward_curve": []}
    rewards = [r for _, r in curve]
    k = max(1, len(rewards) // CURVE_FRACTION)
    return {
        "reward_first": round(sum(rewards[:k]) / k, 4),
        "reward_last": round(sum(rewards[-k:]) / k, 4),
        "reward_curve": [[s, round(r, 4)] for s, r in curve],
    }


def make_grpo_callback(reporter, rewards, *, rollout=None):
    """Streams GRPO's per-step numbers (TRL already logs reward, reward_std, frac_reward_zero_std,
    KL, entropy, clip ratio, completion length, learning rate), each reward function's mean and a few
    rollouts per step. (Held-out evaluation during training is [eval]'s: engine/pod/validation.py.)"""
    from transformers import TrainerCallback

    class GRPOProgress(TrainerCallback):
        def __init__(self):
            self.trainer = None

        def on_log(self, args, state, control, logs=None, **kw):
            per_fn = rewards.log.drain()
            errors = rewards.log.drain_errors()
            if per_fn or errors:
                reporter.event(
                    "rewards",
                    step=state.global_step,
                    **{f"reward/{k}": round(v, 4) for k, v in per_fn.items()},
                    **{f"reward_errors/{k}": n for k, n in errors.items()},
                )
            if rollout is not None:  # multi-turn: whole episodes, the environment's turns included
                episodes = sorted(rollout.last_episodes, key=lambda e: e.turns, reverse=True)[:ROLLOUTS_PER_STEP]
                dump = [_jsonable(e.to_json()) for e in episodes]
            else:
                dump = _recent_rollouts(self.trainer, ROLLOUTS_PER_STEP)
            if dump:
                reporter.event("rollout", step=state.global_step, samples=dump)

    return GRPOProgress()


def _recent_rollouts(trainer, n: int) -> list[dict]:
    """The last ``n`` completions TRL kept for its completion log (with transcripts for multi-turn)."""
    logs = trainer.recent_completions(64) if trainer is not None else {}  # the latest steps only
    if not logs:
        return []
    rewards = logs["rewards"]
    extra = {k: v for k, v in logs["extra"].items() if k in ("transcript", "turns")}
    items = []
    for i, c in enumerate(logs["completion"]):
        item = {"completion": _jsonable(c), "rewards": {k: v[i] for k, v in rewards.items() if i < len(v)}}
        for k, v in extra.items():
            if i < len(v):
                item[k] = _jsonable(v[i])
        items.append(item)
    # Prefer rollouts where a tool ran or the episode had several turns: they show the most.
    return sorted(items, key=_richness, reverse=True)[:n]


def _richness(item: dict) -> int:
    messages = item["completion"] if isinstance(item["completion"], list) else []
    messages = messages + (item.get("transcript") or [])
    return sum(1 for m in messages if isinstance(m, dict) and m.get("role") in ("tool", "user", "assistant"))


def _jsonable(x):
    try:
        json.dumps(x)
        return x
    except TypeError:
        return str(x)


def advantage_metrics(out: dict) -> dict[str, float]:
    """What TRL does not log about a generation batch: the mean |advantage| of the completions trained on,
    and the share of their tokens that carry a non-zero advantage (a flat reward with these near zero means
    no signal reached the loss; with them healthy, the signal is there and the recipe is too weak)."""
    adv, mask = out.get("advantages"), out.get("completion_mask")
    if adv is None or not adv.numel():
        return {}
    metrics = {"advantage/abs_mean": adv.abs().mean().item()}
    if mask is not None and adv.dim() == 1:
        tokens = mask.sum().clamp(min=1)
        metrics["advantage/token_share"] = ((adv != 0).unsqueeze(1) * mask).sum().item() / tokens.item()
    return metrics


__all__ = ["advantage_metrics", "make_grpo_callback", "reward_summary"]
