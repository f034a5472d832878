"""Multi-turn episodes for GRPO: the policy talks with an environment's ``step`` for several turns.

``play_episodes`` runs a batch of episodes turn by turn: it generates the model's turn for every
episode still going (one batched ``generate`` call per turn), removes thinking from the reply, asks
the environment for its answer, and appends the environment's message rendered with the model's own
chat template. The result per episode is one token stream after the prompt, ``completion_ids``, with
``env_mask`` 1 on the tokens the model sampled and 0 on the tokens the environment wrote, so only the
model's own tokens are trained, plus the full message transcript for the rewards and for dumps.

``MultiTurnRollout`` adapts this to TRL 1.16's ``GRPOTrainer(rollout_func=...)``: TRL calls
``rollout_func(prompts, trainer)`` with the process's slice of the generation batch, each prompt
already repeated ``num_generations`` times, and expects ``prompt_ids``, ``completion_ids`` and
``logprobs`` (one entry per prompt). TRL pops ``env_mask`` and multiplies it into the loss mask; every
other key returned (``transcript``, ``episode_reward``, ``turns``) becomes a column the reward
functions receive. The rollout needs each prompt's ``Example`` (the guess game's prompts are all the
same; the hidden number is in the row): ``engine.train.trainer.AutoslmGRPOTrainer`` keeps the dataset
rows of the batch being generated (``autoslm_rows``) for it. The weight push and generation on the
trainer's colocated vLLM go through that module too: nothing here writes into a TRL object. What
generates each turn (the policy, its colocated vLLM, a plain model) is ``engine.rollout.generators``'s.

No torch at import time: torch and trl are imported inside the functions that generate.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from autoslm.engine.rollout.generators import GenerateFn, model_generate, rollout_generate
from autoslm.engine.rollout.rewards import example_from_row
from autoslm.engine.rollout.thinking import strip_thinking
from autoslm.envs.base import Environment, Example, Messages
from autoslm.recipes.evaluation import EVAL_BATCH

_MARK_USER = "\u2063autoslm-user\u2063"
_MARK_ASSISTANT = "\u2063autoslm-assistant\u2063"


@dataclass
class Episode:
    example: Example
    transcript: Messages  # prompt + every turn; assistant content as generated (thinking kept)
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)  # 1: sampled by the model, 0: written by the environment
    turn_ids: list[int] = field(default_factory=list)  # per completion token: the model's turn it belongs to (0-based)
    logprobs: list[float] = field(default_factory=list)
    turns: int = 0
    done: bool = False  # the environment ended the episode (else: out of turns or tokens)
    out_of_tokens: bool = False  # stopped because the next turn would not fit max_completion_tokens
    truncated: bool = False  # the model's last turn was cut by its token budget (it did not end its turn)
    over_budget: bool = False  # ... and that cut came at the end of the episode's whole budget
    reward: float | None = None  # the environment's own final reward, when it gave one
    state: dict = field(default_factory=dict)
    scored: Messages = field(default_factory=list)  # what the environment sees: thinking removed

    @property
    def over_length(self) -> bool:
        """The sequence ran over its limit: cut at the end of the episode's token budget, or out of room
        for its next turn. (A turn cut at its own share, ``max_turn_tokens``, is not: the episode goes
        on, and is scored and trained as it is; TRL masks an episode whose last turn was cut so.)"""
        return self.out_of_tokens or self.over_budget

    def to_json(self) -> dict:
        return {
            "transcript": self.transcript,
            "turns": self.turns,
            "done": self.done,
            "out_of_tokens": self.out_of_tokens,
            "truncated": self.truncated,
            "over_budget": self.over_budget,
            "reward": self.reward,
            "completion_tokens": len(self.completion_ids),
            "model_tokens": sum(self.env_mask),
        }


class ChatTokens:
    """Token ids for prompts and for the environment's turns, rendered with the model's chat template."""

    def __init__(self, tokenizer, chat_template_kwargs: dict | None = None, tools: list | None = None):
        self.tok = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        if tools:
            self.kwargs["tools"] = tools
        self.eos_text = tokenizer.eos_token or ""
        self._suffix_cache: dict[tuple[str, bool], list[int]] = {}
        self._probe = self._render_probe()

    def _render(self, messages: Messages, add_generation_prompt: bool) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt, **self.kwargs)

    def _ids(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, prompt: Messages) -> list[int]:
        return self._ids(self._render(prompt, True))

    def _render_probe(self) -> tuple[str, int]:
        # Render a dummy exchange ending in a user turn + generation prompt, and locate the end of the
        # assistant's turn in it: everything after is what the environment's message looks like.
        text = self._render(
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": _MARK_ASSISTANT},
                {"role": "user", "content": _MARK_USER},
            ],
            True,
        )
        start = text.index(_MARK_ASSISTANT) + len(_MARK_ASSISTANT)
        return text, start

    def user_turn_ids(self, reply: str, model_stopped: bool) -> list[int]:
        """Tokens that follow the model's turn: the end of its turn (when it did not emit it itself),
        the environment's user message, and the next assistant header."""
        key = (reply, model_stopped)
        if key not in self._suffix_cache:
            text, start = self._probe
            after = text[start:]
            if model_stopped and self.eos_text and after.startswith(self.eos_text):
                after = after[len(self.eos_text) :]  # the model already sampled the end-of-turn token
            if len(self._suffix_cache) >= 4096:  # replies repeat ("higher", "lower"): a small cache suffices
                self._suffix_cache.clear()  # before adding: the entry just made must survive the clear
            self._suffix_cache[key] = self._ids(after.replace(_MARK_USER, reply))
        return list(self._suffix_cache[key])


def play_episodes(
    env: Environment,
    examples: Sequence[Example],
    *,
    chat: ChatTokens,
    generate: GenerateFn,
    eos_token_ids: Sequence[int],
    max_completion_tokens: int,
    max_turn_tokens: int | None = None,
    thinking: bool = False,
    max_turns: int | None = None,
    max_context: int | None = None,
) -> list[Episode]:
    """Play one episode per example (examples may repeat: one episode per group member).
    ``max_context``: the most tokens a whole sequence may hold (colocated vLLM's ``max_model_len``): a
    turn asks for no more than the room left, and an episode with no room left ends there."""
    max_turns = max_turns or env.max_turns or 1
    per_turn = max_turn_tokens or max_completion_tokens
    env_turn_cap = getattr(env, "env_turn_tokens", None)  # the most tokens an environment turn may take
    eos = set(eos_token_ids)
    episodes = []
    for ex in examples:
        prompt = [dict(m) for m in ex.prompt]
        episodes.append(Episode(example=ex, transcript=list(prompt), prompt_ids=chat.prompt_ids(prompt), scored=list(prompt)))

    for _ in range(max_turns):
        active = [e for e in episodes if not (e.done or e.out_of_tokens) and e.turns < max_turns]
        budget = [turn_budget(per_turn, max_completion_tokens, e, max_context) for e in active]
        for e, limit in zip(active, budget):
            e.out_of_tokens = limit < 1  # no room for one more token: the episode ends before this turn
        active, budget = [e for e in active if not e.out_of_tokens], [b for b in budget if b >= 1]
        if not active:
            break
        outs = generate([e.prompt_ids + e.completion_ids for e in active], max(budget))
        for e, limit, (new_ids, new_logps) in zip(active, budget, outs, strict=True):
            new_ids, new_logps = list(new_ids)[:limit], list(new_logps)[:limit]
            stopped = bool(new_ids) and new_ids[-1] in eos
            e.truncated = not stopped
            e.completion_ids += new_ids
            e.over_budget = not stopped and len(e.completion_ids) >= max_completion_tokens
            e.env_mask += [1] * len(new_ids)
            e.turn_ids += [e.turns] * len(new_ids)
            e.logprobs += [float(x) for x in new_logps] + [0.0] * (len(new_ids) - len(new_logps))
            e.turns += 1
            text = chat.tok.decode(new_ids, skip_special_tokens=False)
            text = _drop_end_tokens(text, chat)
            e.transcript.append({"role": "assistant", "content": text})
            answer = strip_thinking(text, thinking)
            e.scored.append({"role": "assistant", "content": answer or ""})
            result = env.step(e.example, e.scored, e.state)
            if result.done:
                e.done = True
                e.reward = result.reward
                if result.reply is not None:
                    e.transcript.append({"role": "user", "content": result.reply})
                    e.scored.append({"role": "user", "content": result.reply})
                continue
            if e.turns >= max_turns:
                continue
            reply, suffix = _fit_reply(chat, result.reply if result.reply is not None else "", stopped, env_turn_cap)
            e.transcript.append({"role": "user", "content": reply})
            e.scored.append({"role": "user", "content": reply})
            if len(e.completion_ids) + len(suffix) >= max_completion_tokens or (
                max_context is not None and len(e.prompt_ids) + len(e.completion_ids) + len(suffix) >= max_context
            ):
                e.out_of_tokens = True  # no room left for another turn: the episode ends here
                continue
            e.completion_ids += suffix
            e.env_mask += [0] * len(suffix)
            e.turn_ids += [e.turns] * len(suffix)
            e.logprobs += [0.0] * len(suffix)
    return episodes


def turn_budget(per_turn: int, max_completion_tokens: int, episode: Episode, max_context: int | None = None) -> int:
    """New tokens the episode's next turn may ask for: its share of the episode, what the episode's
    budget has left, and, with ``max_context``, what the context has room for after the prompt and
    the turns so far (vLLM refuses a prompt that leaves no room for one token). Under 1: none."""
    room = min(per_turn, max_completion_tokens - len(episode.completion_ids))
    if max_context is not None:
        room = min(room, max_context - len(episode.prompt_ids) - len(episode.completion_ids))
    return max(0, room)


def _fit_reply(chat: ChatTokens, reply: str, model_stopped: bool, cap: int | None) -> tuple[str, list[int]]:
    """The environment's reply and its rendered tokens, the reply cut so that they number at most
    ``cap`` (the chat markup around it included)."""
    suffix = chat.user_turn_ids(reply, model_stopped)
    while cap and len(suffix) > cap and reply:
        reply = reply[: max(0, len(reply) - max(1, len(suffix) - cap))].rstrip()
        suffix = chat.user_turn_ids(reply, model_stopped)
    return reply, suffix


def _drop_end_tokens(text: str, chat: ChatTokens) -> str:
    for t in (chat.eos_text, getattr(chat.tok, "pad_token", None)):
        if t:
            text = text.replace(t, "")
    return text


# ---------------------------------------------------------------------------------------------------
# Held-out episodes


def evaluate_episodes(
    env: Environment,
    examples: Sequence[Example],
    model,
    tokenizer,
    *,
    thinking: bool,
    max_completion_tokens: int,
    max_turn_tokens: int | None = None,
    batch_size: int = EVAL_BATCH,
    generator: GenerateFn | None = None,
    synced: bool = False,
    max_context: int | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> tuple[float | None, list[Episode]]:
    """Mean ``env.reward_messages`` over greedy episodes (the multi-turn counterpart of a held-out
    score), and the episodes for dumping. ``generator`` (e.g. greedy vLLM) replaces the model's generate;
    ``max_context`` bounds each sequence as ``play_episodes`` says. ``on_batch(n)`` after each batch of
    ``n`` episodes played."""
    episodes = eval_episodes(
        env,
        examples,
        model,
        tokenizer,
        thinking=thinking,
        max_completion_tokens=max_completion_tokens,
        max_turn_tokens=max_turn_tokens,
        batch_size=batch_size,
        generator=generator,
        synced=synced,
        max_context=max_context,
        on_batch=on_batch,
    )
    scores = episode_scores(env, episodes)
    return (sum(scores) / len(scores) if scores else None), episodes


def eval_episodes(
    env: Environment,
    examples: Sequence[Example],
    model,
    tokenizer,
    *,
    thinking: bool,
    max_completion_tokens: int,
    max_turn_tokens: int | None = None,
    batch_size: int = EVAL_BATCH,
    generator: GenerateFn | None = None,
    synced: bool = False,
    max_context: int | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> list[Episode]:
    """The greedy episodes of ``evaluate_episodes``, played in batches, not yet scored."""
    if not examples:
        return []
    chat = ChatTokens(tokenizer, {"enable_thinking": thinking})
    generate = generator or model_generate(model, tokenizer, synced=synced)
    episodes: list[Episode] = []
    for i in range(0, len(examples), batch_size):
        batch = examples[i : i + batch_size]
        episodes += play_episodes(
            env,
            batch,
            chat=chat,
            generate=generate,
            eos_token_ids=[tokenizer.eos_token_id],
            max_completion_tokens=max_completion_tokens,
            max_turn_tokens=max_turn_tokens,
            thinking=thinking,
            max_context=max_context,
        )
        if on_batch is not None:
            on_batch(len(batch))
    return episodes


def episode_scores(env: Environment, episodes: Sequence[Episode]) -> list[float]:
    """The environment's score of each finished episode (its transcript with thinking removed)."""
    return [float(env.reward_messages(e.example, e.scored)) for e in episodes]


# ---------------------------------------------------------------------------------------------------
# TRL's rollout_func


def _prompt_key(prompt: Any) -> str:
    return json.dumps(prompt, sort_keys=True, default=str)


class MultiTurnRollout:
    """``rollout_func`` for ``GRPOTrainer``: plays ``env`` with the policy for each prompt."""

    def __init__(
        self,
        env: Environment,
        *,
        thinking: bool = False,
        max_turn_tokens: int | None = None,
        examples: Sequence[Example] = (),
        tools: list | None = None,
        generate_factory: Callable[[Any], GenerateFn] = rollout_generate,
        keep_last: bool = True,
    ):
        self.env = env
        self.thinking = thinking
        self.max_turn_tokens = max_turn_tokens
        self.tools = tools
        self.generate_factory = generate_factory
        self.keep_last = keep_last
        self.last_episodes: list[Episode] = []
        self._chat: ChatTokens | None = None
        # Fallback lookup when the trainer does not expose its rows: only usable for unique prompts.
        self._by_prompt: dict[str, Example | None] = {}
        for ex in examples:
            k = _prompt_key(ex.prompt)
            self._by_prompt[k] = None if k in self._by_prompt else ex

    def _examples(self, prompts: list, trainer) -> list[Example]:
        rows = getattr(trainer, "autoslm_rows", None)
        if rows is not None and len(rows) == len(prompts):
            return [
                example_from_row(r.get("prompt", p), r.get("answer"), r.get("info")) for r, p in zip(rows, prompts, strict=True)
            ]
        out = []
        for p in prompts:
            ex = self._by_prompt.get(_prompt_key(p))
            if ex is None:
                raise RuntimeError(
                    f"{self.env.name}: cannot tell which example a prompt belongs to (prompts repeat across examples); "
                    "build the trainer as autoslm.engine.train.trainer.AutoslmGRPOTrainer, which keeps its rows"
                )
            out.append(ex)
        return out

    def __call__(self, prompts: list, trainer) -> dict[str, list]:
        from autoslm.engine.train.trainer import trainer_tokenizer

        tok = trainer_tokenizer(trainer)
        if self._chat is None or self._chat.tok is not tok:
            kwargs = dict(getattr(trainer, "chat_template_kwargs", None) or {})
            self._chat = ChatTokens(tok, kwargs, self.tools)
        eos = list(getattr(trainer, "eos_token_ids", None) or [tok.eos_token_id])
        episodes = play_episodes(
            self.env,
            self._examples(prompts, trainer),
            chat=self._chat,
            generate=self.generate_factory(trainer),
            eos_token_ids=eos,
            max_completion_tokens=int(trainer.max_completion_length),
            max_turn_tokens=self.max_turn_tokens,
            thinking=self.thinking,
        )
        if self.keep_last:
            self.last_episodes = episodes
        return episodes_to_rollout(episodes)


def episodes_to_rollout(episodes: Sequence[Episode]) -> dict[str, list]:
    return {
        "prompt_ids": [e.prompt_ids for e in episodes],
        "completion_ids": [e.completion_ids for e in episodes],
        "logprobs": [e.logprobs for e in episodes],
        "env_mask": [e.env_mask for e in episodes],
        "transcript": [e.transcript for e in episodes],
        "episode_reward": [e.reward if e.reward is not None else float("nan") for e in episodes],
        "turns": [e.turns for e in episodes],
    }
