"""What generates a turn of an episode: ``GenerateFn``s over token ids, made from the policy a trainer
is training (``trainer_generate``: transformers' generate with TRL's sampling settings), the trainer's
colocated vLLM (``vllm_generate``, through ``engine.train.trainer``), either as the trainer has it
(``rollout_generate``), or a plain model outside a trainer (``model_generate``: held-out evaluation).

Each returns, per context, the new token ids and their log-probabilities (those of the
temperature-scaled logits, the quantity TRL computes in its loss). No torch at import time.
"""

from __future__ import annotations

from collections.abc import Callable

# contexts (token ids) and a token budget -> per context: (new token ids, their log-probabilities)
GenerateFn = Callable[[list[list[int]], int], list[tuple[list[int], list[float]]]]


def _generate_batch(
    model,
    contexts: list[list[int]],
    max_new_tokens: int,
    *,
    pad: int,
    eos_ids: list[int],
    device,
    temperature: float,
    sampling: dict,
    synced: bool = False,
):
    """Left-pad ``contexts``, generate, and cut each row after its first EOS. Log-probabilities are
    those of the temperature-scaled logits, the quantity TRL computes in its loss."""
    import torch
    from transformers import GenerationConfig

    width = max(map(len, contexts))
    input_ids = torch.tensor([[pad] * (width - len(c)) + list(c) for c in contexts], device=device)
    attention = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts], device=device)
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        pad_token_id=pad,
        eos_token_id=eos_ids,
        disable_compile=True,
        return_dict_in_generate=True,
        output_logits=True,
        **sampling,
    )
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids, attention_mask=attention, generation_config=config, **({"synced_gpus": True} if synced else {})
        )
    new = out.sequences[:, width:]
    logits = torch.stack(out.logits, dim=1).float() / temperature
    logps = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
    results = []
    for ids, lp in zip(new.tolist(), logps.tolist(), strict=True):
        end = next((i + 1 for i, t in enumerate(ids) if t in eos_ids), len(ids))
        results.append((ids[:end], lp[:end]))
    return results


def trainer_generate(trainer) -> GenerateFn:
    """Sample with the policy being trained, as TRL's own transformers path does (temperature, top-p,
    top-k, min-p and repetition penalty from the trainer)."""

    def generate(contexts: list[list[int]], max_new_tokens: int):
        from trl.models.utils import unwrap_model_for_generation

        from autoslm.engine.train.trainer import trainer_tokenizer

        tok = trainer_tokenizer(trainer)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        eos_ids = list(getattr(trainer, "eos_token_ids", None) or [tok.eos_token_id])
        temperature = float(getattr(trainer, "temperature", 1.0) or 1.0)
        sampling = dict(
            do_sample=True,
            temperature=temperature,
            top_p=getattr(trainer, "top_p", 1.0),
            top_k=getattr(trainer, "top_k", None) or None,
            min_p=getattr(trainer, "min_p", None),
            repetition_penalty=getattr(trainer, "repetition_penalty", 1.0),
        )
        with unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gather_deepspeed3_params=getattr(trainer.args, "ds3_gather_for_generation", True),
        ) as model:
            return _generate_batch(
                model,
                contexts,
                max_new_tokens,
                pad=pad,
                eos_ids=eos_ids,
                device=trainer.accelerator.device,
                temperature=temperature,
                sampling=sampling,
            )

    return generate


def vllm_generate(trainer, *, temperature: float | None = None) -> GenerateFn:
    """Drive the trainer's colocated vLLM engine (GPU runs): the policy's current weights are pushed
    first when a step has passed since the last push, as TRL does before its own generation; sleep
    mode, waking and the per-rank split are TRL's. ``temperature=0`` decodes greedily (evaluation)."""

    def generate(contexts: list[list[int]], max_new_tokens: int):
        from autoslm.engine.train.trainer import vllm_generate as generate_ids

        ids, logps = generate_ids(trainer, contexts, max_new_tokens, temperature)
        return [(list(i), [_logprob(lp) for lp in lps]) for i, lps in zip(ids, logps, strict=True)]

    return generate


def _logprob(lp) -> float:
    """The sampled token's log-prob from TRL's per-token list; TRL writes None for a NaN log-prob (and a
    token may have none), which counts as 0 like a missing one."""
    if not lp or lp[0] is None:
        return 0.0
    return float(lp[0])


def rollout_generate(trainer) -> GenerateFn:
    """The trainer's colocated vLLM when it has one, else transformers' generate."""
    return vllm_generate(trainer) if getattr(trainer, "use_vllm", False) else trainer_generate(trainer)


def model_generate(model, tokenizer, *, do_sample: bool = False, temperature: float = 1.0, synced: bool = False) -> GenerateFn:
    """Generate with a plain model outside a trainer (held-out evaluation): greedy by default.
    ``synced``: on every rank of a distributed run (``evaluate.generate``)."""

    def generate(contexts: list[list[int]], max_new_tokens: int):
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        eos_ids = [tokenizer.eos_token_id]
        sampling = {"do_sample": True, "temperature": temperature} if do_sample else {"do_sample": False}
        was_training = model.training
        model.eval()
        try:
            return _generate_batch(
                model,
                contexts,
                max_new_tokens,
                pad=pad,
                eos_ids=eos_ids,
                device=next(model.parameters()).device,
                temperature=temperature if do_sample else 1.0,
                sampling=sampling,
                synced=synced,
            )
        finally:
            model.train(was_training)

    return generate
