"""Held-out evaluation before and after training: completion loss and the environment's own score.

Both run on the eval split the environment gives (never seen in training), with greedy decoding, so
"before" and "after" are comparable and show whether the model learned. GRPO runs also score samples
at the training temperature ("score_sampled"): the policy GRPO optimizes is the sampled one, and a
greedy score alone hides both its gains and its losses.

An evaluation of a large split can take longer than the controller waits for a heartbeat; each batch
it finishes is reported (``evaluate``'s ``progress``), so that the worker's heartbeats go on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autoslm.engine.train.data import render_completion, render_prompt
from autoslm.envs.base import Environment, Example
from autoslm.recipes.evaluation import EVAL_BATCH, GENERATOR_CHUNK

OnBatch = Callable[[int], None]  # after each batch: how many rows (completions, episodes) it did


class Tally:
    """One evaluation's progress: ``add(n)`` after each batch calls ``report(done, total)``."""

    def __init__(self, total: int, report: Callable[[int, int], None] | None):
        self.done, self.total, self.report = 0, total, report

    def add(self, n: int) -> None:
        self.done += n
        if self.report is not None:
            self.report(min(self.done, self.total), self.total)


def _strip(text: str, thinking: bool) -> str | None:
    from autoslm.engine.rollout.thinking import strip_thinking

    return strip_thinking(text, thinking)


def eval_loss(
    model, tokenizer, examples: list[Example], thinking: bool, batch_size: int = 16, tools=None, on_batch: OnBatch | None = None
) -> float | None:
    """Mean cross-entropy over completion tokens (prompt tokens masked out)."""
    rows = loss_rows(model, tokenizer, examples, thinking, batch_size, tools, on_batch)
    return _mean_loss(rows) if rows else None


def _mean_loss(rows: list[tuple[float, int]]) -> float:
    return sum(t for t, _ in rows) / max(sum(n for _, n in rows), 1)


def loss_rows(
    model, tokenizer, examples: list[Example], thinking: bool, batch_size: int = 16, tools=None, on_batch: OnBatch | None = None
) -> list[tuple[float, int]]:
    """Per example with a target: the summed cross-entropy of its completion tokens and their count."""
    import torch

    examples = [e for e in examples if e.target is not None]
    device = next(model.parameters()).device
    out: list[tuple[float, int]] = []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for i in range(0, len(examples), batch_size):
                ids, labels = [], []
                for ex in examples[i : i + batch_size]:
                    p = tokenizer(render_prompt(tokenizer, ex.prompt, thinking, tools), add_special_tokens=False)["input_ids"]
                    c = tokenizer(render_completion(ex, thinking) + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
                    ids.append(p + c)
                    labels.append([-100] * len(p) + c)
                width = max(map(len, ids))
                pad = tokenizer.pad_token_id
                input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids], device=device)
                attn = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids], device=device)
                lab = torch.tensor([x + [-100] * (width - len(x)) for x in labels], device=device)
                logits = model(input_ids=input_ids, attention_mask=attn).logits[:, :-1]
                target = lab[:, 1:]
                loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.size(-1)).float(), target.reshape(-1), ignore_index=-100, reduction="none"
                ).view(target.shape)
                out += [(float(row.sum()), int(n)) for row, n in zip(loss, (target != -100).sum(dim=1))]
                if on_batch is not None:
                    on_batch(len(ids))
    finally:
        model.train(was_training)
    return out


def generate(
    model,
    tokenizer,
    prompts: list[str],
    max_new_tokens: int,
    batch_size: int = EVAL_BATCH,
    sampling: dict | None = None,
    synced: bool = False,
    on_batch: OnBatch | None = None,
) -> list[str]:
    """Greedy completions, or sampled ones with ``sampling`` (generate()'s temperature/top_p/top_k).
    ``synced``: every process of a distributed run generates, and each goes on stepping until all are
    done (generate()'s ``synced_gpus``): a sharded model's forward pass needs every rank in it."""
    import torch

    device = next(model.parameters()).device
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    outs: list[str] = []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for i in range(0, len(prompts), batch_size):
                enc = tokenizer(prompts[i : i + batch_size], return_tensors="pt", padding=True, add_special_tokens=False).to(
                    device
                )
                gen = model.generate(
                    **enc,
                    max_new_tokens=max_new_tokens,
                    **({"do_sample": True, **sampling} if sampling else {"do_sample": False}),
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id,
                    **({"synced_gpus": True} if synced else {}),
                )
                new = gen[:, enc["input_ids"].shape[1] :]
                outs += tokenizer.batch_decode(new, skip_special_tokens=True)
                if on_batch is not None:
                    on_batch(len(new))
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return outs


def generate_with(
    generator, tokenizer, prompts: list[str], max_new_tokens: int, on_batch: OnBatch | None = None, chunk: int = GENERATOR_CHUNK
) -> list[str]:
    """Completions through a ``GenerateFn`` (token ids in, (ids, logprobs) out), e.g. colocated vLLM,
    ``chunk`` prompts per call."""
    contexts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    outs: list[str] = []
    for i in range(0, len(contexts), chunk):
        done = generator(contexts[i : i + chunk], max_new_tokens)
        outs += [tokenizer.decode(ids, skip_special_tokens=True) for ids, _ in done]
        if on_batch is not None:
            on_batch(len(done))
    return outs


def eval_score(
    model,
    tokenizer,
    env: Environment,
    examples: list[Example],
    thinking: bool,
    max_new_tokens: int = 16,
    generator=None,
    synced: bool = False,
    on_batch: OnBatch | None = None,
) -> float | None:
    """Mean environment reward of greedy completions; None when the environment cannot score."""
    scores = score_rows(model, tokenizer, env, examples, thinking, max_new_tokens, generator, synced, on_batch)
    return sum(scores) / len(scores) if scores else None


def score_rows(
    model,
    tokenizer,
    env: Environment,
    examples: list[Example],
    thinking: bool,
    max_new_tokens: int = 16,
    generator=None,
    synced: bool = False,
    on_batch: OnBatch | None = None,
) -> list[float] | None:
    """The environment's reward of each example's greedy completion; None when it cannot score."""
    if not examples or env.multi_turn:
        return None
    tools = env.tools()
    prompts = [render_prompt(tokenizer, ex.prompt, thinking, tools) for ex in examples]
    if generator is not None:
        texts = generate_with(generator, tokenizer, prompts, max_new_tokens, on_batch=on_batch)
    else:
        texts = generate(model, tokenizer, prompts, max_new_tokens, synced=synced, on_batch=on_batch)
    scores = []
    for ex, text in zip(examples, texts):
        answer = _strip(text, thinking)
        try:
            scores.append(0.0 if answer is None else float(env.reward(ex, answer)))
        except NotImplementedError:
            return None
    return scores


def sampled_scores(
    model,
    tokenizer,
    env: Environment,
    examples: list[Example],
    thinking: bool,
    max_new_tokens: int,
    *,
    temperature: float,
    samples: int,
    top_p: float = 1.0,
    seed: int = 0,
    generator=None,
    synced: bool = False,
    on_batch: OnBatch | None = None,
) -> list[list[float]] | None:
    """Rewards of ``samples`` answers per prompt drawn at ``temperature``, one list per prompt; None when
    the environment cannot score. The draws come from their own RNG stream seeded with ``seed``: the
    training's random state is left as it was, so a run still repeats step for step."""
    import torch

    if not examples or env.multi_turn or samples < 1:
        return None
    prompts = [render_prompt(tokenizer, ex.prompt, thinking, env.tools()) for ex in examples for _ in range(samples)]
    cuda = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        if generator is not None:
            texts = generate_with(generator, tokenizer, prompts, max_new_tokens, on_batch=on_batch)
        else:
            texts = generate(
                model,
                tokenizer,
                prompts,
                max_new_tokens,
                sampling={"temperature": temperature, "top_p": top_p, "top_k": 0},
                synced=synced,
                on_batch=on_batch,
            )
    rewards: list[list[float]] = [[] for _ in examples]
    for i, text in enumerate(texts):
        answer = _strip(text, thinking)
        try:
            rewards[i // samples].append(0.0 if answer is None else float(env.reward(examples[i // samples], answer)))
        except NotImplementedError:
            return None
    return rewards


def sampled_metrics(rewards: list[list[float]], ks=(1,), threshold: float = 1.0) -> dict:
    """From each prompt's sampled rewards: their mean ("score_sampled") and pass@k for each k, the mean
    over prompts of the unbiased estimator (recipes/evaluation.py: pass_at_k), an answer passing when
    its reward is at least ``threshold``."""
    from autoslm.recipes.evaluation import pass_at_k

    flat = [r for per in rewards for r in per]
    out = {"score_sampled": round(sum(flat) / len(flat), 4) if flat else None}
    for k in sorted(set(ks)):
        values = [pass_at_k(len(per), sum(r >= threshold for r in per), k) for per in rewards if len(per) >= k]
        out[f"pass@{k}"] = round(sum(values) / len(values), 4) if values else None
    return out


@dataclass(frozen=True)
class Shard:
    """This process's part of an evaluation that several training processes share: rows ``rank``,
    ``rank + world``, ... of the split, padded with a repeat to one length on every rank (so each makes
    the same number of forward and generate calls: under FSDP, or generate()'s ``synced_gpus``, those are
    collective), and ``gather(obj)``, which hands every rank the list of every rank's object
    (``torch.distributed.all_gather_object``). One process: the whole split."""

    rank: int = 0
    world: int = 1
    gather: Callable[[object], list] | None = None

    def part(self, items: Sequence) -> tuple[list, int]:
        """This rank's rows, padded, and how many of them are its own (the rest are repeats)."""
        if self.world <= 1:
            return list(items), len(items)
        mine = list(items[self.rank :: self.world])
        size = -(-len(items) // self.world)
        filler = mine[-1:] or list(items[:1])
        return mine + filler * (size - len(mine)), len(mine)

    def join(self, mine: list) -> list:
        """Every rank's own rows, in the split's order (row i of rank r is the split's row r + i x world)."""
        if self.world <= 1:
            return mine
        parts = self.gather(mine)
        return [p[i] for i in range(max(map(len, parts), default=0)) for p in parts if i < len(p)]


def evaluate(
    model,
    tokenizer,
    env: Environment,
    examples: list[Example],
    thinking: bool,
    max_new_tokens: int = 16,
    generator=None,
    sampling: dict | None = None,
    synced: bool = False,
    episode: dict | None = None,
    progress: Callable[[int, int], None] | None = None,
    shard: Shard | None = None,
) -> dict:
    """Loss and score on held-out examples. ``generator`` (a ``GenerateFn``: colocated vLLM on a GPU
    pod) generates the scored completions; the loss is always the model's own forward pass. ``sampling``
    (``{"temperature", "top_p", "seed", "generator", "samples", "ks", "threshold"}``: GRPO, or [eval]
    samples) adds the sampled score and pass@k for each k in ``ks``. ``synced``: called on every rank of
    a distributed run with the model the trainer prepared (see ``generate``). ``episode``: a multi-turn
    task's limits (``episode_limits``; by default an episode of ``max_new_tokens``). ``progress(done,
    total)``: at the start and after each batch, the rows done (loss rows, completions, episodes) of
    all that this process does. ``shard``: several processes split the rows (``Shard``) and every one
    returns the whole split's result."""
    shard = shard or Shard()
    rows, own = shard.part(examples)
    if env.multi_turn:
        from autoslm.engine.rollout.multiturn import episode_scores, eval_episodes

        tally = Tally(len(rows), progress)
        tally.add(0)
        limits = {"max_completion_tokens": max_new_tokens, **(episode or {})}
        episodes = eval_episodes(
            env, rows, model, tokenizer, thinking=thinking, generator=generator, synced=synced, on_batch=tally.add, **limits
        )
        scores = shard.join(episode_scores(env, episodes[:own]))
        return {"n": len(examples), "loss": None, "score": sum(scores) / len(scores) if scores else None}
    draws = int(sampling.get("samples", 0)) if sampling else 0
    tally = Tally(sum(ex.target is not None for ex in rows) + len(rows) * (1 + draws), progress)
    tally.add(0)
    # Small batches on a GPU: this forward pass materialises full (batch, seq, vocab) logits.
    on_gpu = next(model.parameters()).device.type == "cuda"
    own_targets = sum(ex.target is not None for ex in rows[:own])
    losses = shard.join(
        loss_rows(model, tokenizer, rows, thinking, batch_size=4 if on_gpu else 16, tools=env.tools(), on_batch=tally.add)[
            :own_targets
        ]
    )
    loss = _mean_loss(losses) if losses else None
    scores = score_rows(
        model, tokenizer, env, rows, thinking, max_new_tokens, generator=generator, synced=synced, on_batch=tally.add
    )
    # Every rank joins (a gather is collective), an environment that cannot score as [None] on each.
    scores = shard.join(scores[:own] if scores is not None else [None])
    out = {
        "n": len(examples),
        "loss": None if loss is None or math.isnan(loss) else round(loss, 4),
        "score": None if None in scores or not scores else sum(scores) / len(scores),
    }
    if sampling:
        draw = {k: v for k, v in sampling.items() if k not in ("ks", "threshold")}
        rewards = sampled_scores(model, tokenizer, env, rows, thinking, max_new_tokens, **draw, synced=synced, on_batch=tally.add)
        rewards = shard.join(rewards[:own] if rewards is not None else [None])
        if None not in rewards and rewards:
            out.update(sampled_metrics(rewards, sampling.get("ks", (1,)), sampling.get("threshold", 1.0)))
    return out


def episode_limits(spec, env: Environment) -> dict:
    """``evaluate``'s ``episode`` for a multi-turn task: the limits its training rollouts play under
    (GRPO: ``train.max_completion_tokens`` an episode, ``recipes.grpo.turn_tokens`` a turn), and the
    context (``recipes.grpo.context_tokens``: vLLM's ``max_model_len``), so a long greedy turn cannot
    push the next one past what the engine holds. An SFT run keeps four short answers an episode,
    within ``train.max_length``. Empty for a single-turn task."""
    if not env.multi_turn:
        return {}
    from autoslm.recipes.evaluation import answer_tokens

    train = spec.train
    if train.method != "grpo":
        return {"max_completion_tokens": 4 * answer_tokens(train), "max_context": train.max_length}
    from autoslm.recipes.grpo import context_tokens, turn_tokens

    per_turn = turn_tokens(train, env.max_turns or 1, getattr(env, "env_turn_tokens", 0) or 0)
    return {
        "max_completion_tokens": train.max_completion_tokens,
        "max_turn_tokens": per_turn,
        "max_context": context_tokens(train),
    }


def eval_generator(trainer, temperature: float = 0.0):
    """Generation on the trainer's colocated vLLM when it has one, else None: greedy by default."""
    if not getattr(trainer, "use_vllm", False):
        return None
    from autoslm.engine.rollout.generators import vllm_generate

    return vllm_generate(trainer, temperature=temperature)


def eval_sampling(trainer, spec, seed: int) -> dict | None:
    """``evaluate``'s ``sampling``: ``[eval] samples`` answers per prompt (4 by default for GRPO, none for
    SFT) at the training temperature and top_p, on the trainer's colocated vLLM when it generates the
    rollouts; pass@1, pass@samples and the metric's pass@k are computed from them."""
    from autoslm.recipes.evaluation import pass_k, sample_count

    ev, train = spec.eval, spec.train
    samples = sample_count(ev, train.method)
    if samples < 1:
        return None
    grpo = train.method == "grpo"
    temperature = ev.temperature or (train.temperature if grpo else 1.0)
    top_p = train.top_p if grpo else 1.0
    ks = {1, samples} | ({pass_k(ev.metric)} if pass_k(ev.metric) else set())
    return {
        "temperature": temperature,
        "top_p": top_p,
        "seed": seed,
        "samples": samples,
        "ks": tuple(sorted(ks)),
        "threshold": ev.pass_threshold,
        "generator": eval_generator(trainer, temperature=temperature),
    }
