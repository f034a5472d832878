"""Held-out evaluation before and after training: completion loss and the environment's own score.

Both run on the eval split the environment gives (never seen in training), with greedy decoding, so
"before" and "after" are comparable and show whether the model learned.
"""

from __future__ import annotations

import math

from autoslm.engine.train.data import render_completion, render_prompt
from autoslm.envs.base import Environment, Example


def _strip(text: str, thinking: bool) -> str | None:
    from autoslm.engine.rollout.rewards import strip_thinking

    return strip_thinking(text, thinking)


def eval_loss(model, tokenizer, examples: list[Example], thinking: bool, batch_size: int = 16, tools=None) -> float | None:
    """Mean cross-entropy over completion tokens (prompt tokens masked out)."""
    import torch

    examples = [e for e in examples if e.target is not None]
    if not examples:
        return None
    device = next(model.parameters()).device
    total, count = 0.0, 0
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
                    logits.reshape(-1, logits.size(-1)).float(), target.reshape(-1), ignore_index=-100, reduction="sum"
                )
                total += loss.item()
                count += int((target != -100).sum())
    finally:
        model.train(was_training)
    return total / max(count, 1)


def generate(model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int = 32) -> list[str]:
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
                enc = tokenizer(prompts[i : i + batch_size], return_tensors="pt", padding=True, add_special_tokens=False).to(device)
                gen = model.generate(
                    **enc,
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id,
                )
                new = gen[:, enc["input_ids"].shape[1]:]
                outs += tokenizer.batch_decode(new, skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return outs


def generate_with(generator, tokenizer, prompts: list[str], max_new_tokens: int) -> list[str]:
    """Greedy completions through a ``GenerateFn`` (token ids in, (ids, logprobs) out), e.g. colocated vLLM."""
    contexts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    return [tokenizer.decode(ids, skip_special_tokens=True) for ids, _ in generator(contexts, max_new_tokens)]


def eval_score(model, tokenizer, env: Environment, examples: list[Example], thinking: bool, max_new_tokens: int = 16,
               generator=None) -> float | None:
    """Mean environment reward of greedy completions; None when the environment cannot score."""
    if not examples or env.multi_turn:
        return None
    tools = env.tools()
    prompts = [render_prompt(tokenizer, ex.prompt, thinking, tools) for ex in examples]
    if generator is not None:
        texts = generate_with(generator, tokenizer, prompts, max_new_tokens)
    else:
        texts = generate(model, tokenizer, prompts, max_new_tokens)
    scores = []
    for ex, text in zip(examples, texts):
        answer = _strip(text, thinking)
        try:
            scores.append(0.0 if answer is None else float(env.reward(ex, answer)))
        except NotImplementedError:
            return None
    return sum(scores) / len(scores)


def evaluate(model, tokenizer, env: Environment, examples: list[Example], thinking: bool, max_new_tokens: int = 16,
             generator=None) -> dict:
    """Loss and score on held-out examples. ``generator`` (a ``GenerateFn``: colocated vLLM on a GPU
    pod) generates the scored completions; the loss is always the model's own forward pass."""
    if env.multi_turn:
        from autoslm.engine.rollout.multiturn import evaluate_episodes

        score, _ = evaluate_episodes(env, examples, model, tokenizer, thinking=thinking,
                                     max_completion_tokens=max_new_tokens * 4, generator=generator)
        return {"n": len(examples), "loss": None, "score": score}
    # Small batches on a GPU: this forward pass materialises full (batch, seq, vocab) logits.
    on_gpu = next(model.parameters()).device.type == "cuda"
    loss = eval_loss(model, tokenizer, examples, thinking, batch_size=4 if on_gpu else 16, tools=env.tools())
    return {
        "n": len(examples),
        "loss": None if loss is None or math.isnan(loss) else round(loss, 4),
        "score": eval_score(model, tokenizer, env, examples, thinking, max_new_tokens, generator=generator),
    }


def eval_generator(trainer):
    """Greedy generation on the trainer's colocated vLLM when it has one (GPU pods), else None."""
    if not getattr(trainer, "use_vllm", False):
        return None
    from autoslm.engine.rollout.multiturn import vllm_generate

    return vllm_generate(trainer, temperature=0.0)
