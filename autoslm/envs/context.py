"""Whether a multi-turn task's episodes fit the engine's context, checked at validate and plan time.

An episode of T turns is one sequence: the prompt, T of the model's turns of up to ``per_turn``
tokens each (``recipes.grpo.turn_tokens``), and T - 1 environment turns (a critic's challenge) of up to
``env_turn_tokens`` each. It must fit the engine's context, ``train.max_length`` (what the trainer
holds a sequence to, and vLLM's ``max_model_len`` by default), and its completion part must fit
``train.max_completion_tokens`` (the episode's budget in the rollout). Over 100% is an error; over 80%
a warning (a turn that runs long gets its episode dropped). A task states its shape with a
``turn_shape(params)`` classmethod (the critique task does); the prompt's length is estimated from
the built-in data without a tokenizer, or given in the task's params.
"""

from __future__ import annotations

WARN_SHARE = 0.8
# Estimating a built-in task's prompts without a tokenizer: characters per token, low on purpose (a
# byte-level tokenizer with a small vocabulary spends ~2 on plain English), plus the chat markup.
CHARS_PER_TOKEN = 2
MARKUP_TOKENS = 16


def context_issues(spec) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(errors, warnings) as (field, message) for a multi-turn GRPO spec; ([], []) otherwise."""
    shape = _turn_shape(spec)
    if shape is None:
        return [], []
    from autoslm.recipes.grpo import turn_tokens

    train = spec.train
    turns, critic, prompt = shape["turns"], shape["env_turn_tokens"], shape.get("prompt_tokens") or 0
    per_turn = turn_tokens(train, turns, critic)
    completion = turns * per_turn + (turns - 1) * critic
    need = prompt + completion
    context = min(train.max_length, train.vllm.max_model_len or train.max_length)
    prompt_part = f"prompt {prompt}" if prompt else "prompt (measured by the worker)"
    sum_text = (
        f"{prompt_part} + {turns} turns x {per_turn} tokens + {turns - 1} critic turn{'s' if turns > 2 else ''} "
        f"x {critic} = {need} tokens"
    )
    errors, warnings = [], []
    share = need / context
    if share > 1:
        errors.append(
            (
                "train.max_length",
                f"an episode does not fit the context: {sum_text}, {share:.0%} of "
                f"train.max_length = {context}; raise train.max_length to at least {need}, or lower "
                "train.max_turn_tokens, environment.params.turns or environment.params.critic_tokens",
            )
        )
    elif share > WARN_SHARE:
        warnings.append(
            (
                "train.max_length",
                f"an episode fills {share:.0%} of the context: {sum_text} of "
                f"train.max_length = {context}; episodes that run long are dropped",
            )
        )
    if completion > train.max_completion_tokens:
        errors.append(
            (
                "train.max_completion_tokens",
                f"{train.max_completion_tokens} cannot hold an episode's turns: "
                f"{turns} turns x {per_turn} tokens + {turns - 1} x {critic} critic tokens = {completion}; "
                f"raise it to at least {completion}, or lower train.max_turn_tokens",
            )
        )
    return errors, warnings


def turn_weight_issues(spec) -> list[tuple[str, str]]:
    """``train.turn_loss_weights`` on a task known to be single-turn, or longer than its turns."""
    weights = spec.train.turn_loss_weights if spec.train.method == "grpo" else None
    if not weights:
        return []
    from autoslm.envs.task_table import BUILTIN, _builtin_class

    if spec.environment.id not in BUILTIN:
        return []
    try:
        cls = _builtin_class(spec.environment.id)
    except (ImportError, AttributeError):
        return []
    if not cls.multi_turn:
        return [
            (
                "train.turn_loss_weights",
                f"{spec.environment.id} is single-turn: per-turn loss weights apply to "
                "multi-turn tasks (autoslm/critique, autoslm/guess); remove them",
            )
        ]
    shape = _turn_shape(spec)
    if shape and len(weights) > shape["turns"]:
        return [("train.turn_loss_weights", f"{len(weights)} weights for {shape['turns']} turns: give at most one per turn")]
    return []


def _turn_shape(spec) -> dict | None:
    if spec.train.method != "grpo":
        return None
    from autoslm.envs.task_table import BUILTIN, _builtin_class

    env_id = spec.environment.id
    if env_id not in BUILTIN:
        return None
    try:
        cls = _builtin_class(env_id)
        shape = getattr(cls, "turn_shape", None)
        shape = shape(dict(spec.environment.params)) if shape is not None else None
        if shape is not None and not shape.get("prompt_tokens") and shape.get("data") in BUILTIN:
            shape["prompt_tokens"] = prompt_estimate(_builtin_class(shape["data"])(dict(shape.get("data_params") or {}), seed=0))
        return shape
    except Exception:  # noqa: BLE001 - bad params are reported by check_environment, once
        return None


def prompt_estimate(env) -> int:
    """The longest prompt of a built-in task's examples, in tokens, estimated from its characters."""
    texts = [
        " ".join(str(m.get("content") or "") for m in ex.prompt) for ex in env.train_examples()[:256] + env.eval_examples()[:64]
    ]
    return -(-max((len(t) for t in texts), default=0) // CHARS_PER_TOKEN) + MARKUP_TOKENS
