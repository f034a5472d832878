"""Time and money: steps, seconds per step, set-up, and what a run costs on an offer. Estimates from
datasheet throughput and conservative efficiencies, shown by `autoslm plan` before anything is rented.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autoslm.catalog.gpus import GPUInfo, gpu_info
from autoslm.catalog.memory import (
    VLLM_SAMPLER_BYTES,
    WEIGHT_BYTES,
    kv_bytes_per_token,
    quant_tier,
    resolve_model,
    servable_by_vllm,
)
from autoslm.catalog.models import ModelInfo
from autoslm.catalog.setup import SetupEstimate, setup_estimate
from autoslm.recipes.evaluation import EVAL_BATCH, GENERATOR_CHUNK, answer_tokens, evaluation_count, sample_count

MFU = 0.30  # share of datasheet bf16 throughput a LoRA run of a small model reaches: a conservative guess
# A decode step of colocated vLLM, per process: one read of the weights, of every in-flight sequence's KV
# cache (sequences x mean context x kv_bytes_per_token) and of the sampler's per-row buffers (fp32 logits,
# log-softmax, softmax, noise over the whole vocabulary: VLLM_SAMPLER_BYTES a row and entry, as vLLM's
# profiling holds them), at DECODE_EFFICIENCY of the memory bandwidth; plus a floor no bandwidth buys back:
# the scheduler, the launches and the sampler's host work, DECODE_STEP_FLOOR_S a step and DECODE_SEQ_S per
# sequence in flight.
#
# The planner's choices, stated: a decode wave lasts max_completion_tokens steps (its longest completion
# sets it, and among hundreds sampled at temperature 1 one usually runs to the cap) with every sequence in
# flight throughout at a mean context of the prompt budget (max_length - max_completion_tokens) plus half
# the completion budget. Completions that end early are not counted as savings: they shorten the KV reads
# and the floor's per-sequence part, so the estimate errs long, which is the side a limit must err on.
#
# Calibration (the floor and the efficiency were fitted; the rest is the model's shape): verl's published
# GRPO-LoRA GSM8K logs (github.com/eric-haibin-lin/verl-data, branch experiments, gsm8k/Qwen2.5-{0.5B,1.5B}-
# bsz64_2-prompt512-resp1024-lorarank32-score*.log; docs/algo/baseline.md of volcengine/verl links them):
# 64 prompts x 5 completions, prompts up to 512 tokens, responses up to 1024, 2 GPUs, TP 2 vLLM.
#   0.5B (Qwen2.5-0.5B-Instruct): ~62 s a step = ~124 GPU-seconds.
#   1.5B (Qwen2.5-1.5B-Instruct): ~49 s a step = ~98 GPU-seconds: generation 38.8 s (77.6 GPU-s), actor
#   update 7.2 s (14.4), log-probs 2.9 s (5.8).
# The card: the logs do not name it (verl's table says only "NVIDIA GPU"; taken to be 80 GB cards). Assumed:
# H100 80GB SXM (3350 GB/s, 989 bf16 TFLOPS), the card on which verl's 1.5B update (7.2 s for ~130k real
# tokens) is an ordinary utilisation. On it this model gives (tests/unit/test_cost_model.py holds each
# within 1.5x): 0.5B ~97 GPU-s (124 published), 1.5B ~125 GPU-s (98 published; generation ~93 for 77.6).
# On an A100 80GB SXM it gives 0.5B ~122 and 1.5B ~199: the training part is priced on padded sequences
# (TRL pads every micro-batch to the batch's longest; verl removes padding), so there it runs ~2x long.
# What no model that grows with the model can fit: verl's 0.5B step is slower than its 1.5B one (its 0.5B
# completions run longer), so the two land ~1.27x on opposite sides. verl's vLLM ran eager (enforce_eager,
# no CUDA graphs, its 0.6-era scheduler): the floor fitted here is likely long for a CUDA-graph vLLM 0.31
# pod, which errs on the side limits need; re-fit it from `benchmarks/grpo_bench.py` on a rented GPU.
DECODE_EFFICIENCY = 0.35
DECODE_STEP_FLOOR_S = 0.015
DECODE_SEQ_S = 2.0e-4
# A GRPO step's work outside decoding and the trainer's passes: the weight push to vLLM, reward scoring,
# the optimizer step (verl's 1.5B step less its three phases: ~0.1 s; the push of merged weights is more).
GRPO_STEP_FLOOR_S = 1.0
# The link between two pods of one replica where the vendor declares none (``Capabilities.pod_link_gbps``):
# a plain 10 Gbit/s data-center network. And the latency of one hop of a ring all-reduce across pods.
DEFAULT_POD_LINK_GBPS = 10.0
POD_HOP_LATENCY_S = 0.001
# Set-up (image pull, installs, model download, warm-up): catalog/setup.py, per image and model.


@dataclass(frozen=True)
class RunEstimate:
    """What a run should take. ``hours``/``usd`` are None when the number of steps is unknown."""

    steps: int | None
    hours: float | None
    usd: float | None
    ceiling_usd: float  # price x limits.max_hours (and limits.max_usd when lower): what it can cost at most
    basis: str  # how the numbers were found, for ``autoslm plan``
    step_s: float | None = None  # seconds per optimizer step (GRPO: generation counted once per decode wave)
    eval_s: float | None = None  # seconds per held-out evaluation
    evaluations: int = 0  # held-out evaluations over the run (at the start, every eval.every steps, at the end)
    setup_s: float = 0.0  # set-up before the first step (catalog/setup.py), counted in ``hours``
    lm_eval_s: float = 0.0  # [eval] lm_eval: lm-evaluation-harness on the base and the adapter, counted in ``hours``


def train_steps(train: Any, n_examples: int | None = None) -> int | None:
    """Optimizer steps: ``max_steps``, else epochs x examples / examples-per-step (None without a dataset size)."""
    if getattr(train, "max_steps", None):
        return int(train.max_steps)
    if not n_examples:
        return None
    per_step = train.prompts_per_step if getattr(train, "method", "sft") == "grpo" else train.batch_size
    return max(1, math.ceil((train.epochs or 1.0) * n_examples / per_step))


# transformers generation against vLLM's, per decoded token of a batch: its weight reads run at about a
# third of vLLM's effective bandwidth, plus ~25 ms of per-token launch and Python overhead (no CUDA graphs)
# and HF_DECODE_SEQ_S per sequence in flight (its sampler: logits processors and a multinomial draw over
# the whole vocabulary, per row). Measured (benchmarks/gsm8k_steps.py on one H200, torch 2.11, transformers
# 5.17, trl 1.16; benchmarks/results/gsm8k_steps_h200.json): the GSM8K jobspec's step, 320 sequences x 1024
# tokens on Qwen2.5-0.5B's shape, took 66.3 s (median of the steps after the first), generation 57.3 s,
# 55.7 ms a decode step. HF_DECODE_SEQ_S is fitted to that decode step; with it this model gives 57 s of
# generation and ~67 s a step there (before the fit, with vLLM's per-sequence cost: 112 s, 1.7x long).
HF_DECODE_SLOWDOWN = 3.0
HF_DECODE_STEP_S = 0.025
HF_DECODE_SEQ_S = 7.0e-5


def uses_vllm(info: ModelInfo, train: Any, has_vllm: bool = True) -> bool:
    """Whether GRPO generates with colocated vLLM on a pod: the pod has it (``has_vllm``), and not for the
    4-bit tier, a model vLLM cannot serve, or ``train.vllm.enabled = false``."""
    return has_vllm and servable_by_vllm(info, train)


def gradient_sync_seconds(info: ModelInfo, train: Any, nodes: int, link_gbps: float | None) -> float:
    """The gradients' all-reduce across ``nodes`` pods, once a step: a ring all-reduce sends each pod
    2 (nodes - 1) / nodes of the LoRA gradients (fp32) over the link between pods (``link_gbps``, Gbit/s;
    ``DEFAULT_POD_LINK_GBPS`` where the vendor says none), plus a latency per ring hop. Within a pod the
    GPUs' own link is far faster and not counted. 0 for one pod."""
    from autoslm.catalog.memory import lora_params

    if nodes <= 1:
        return 0.0
    grad_bytes = lora_params(info, train) * 4
    gbps = link_gbps or DEFAULT_POD_LINK_GBPS
    return 2 * (nodes - 1) / nodes * grad_bytes * 8 / (gbps * 1e9) + 2 * (nodes - 1) * POD_HOP_LATENCY_S


def step_seconds(
    model: str | ModelInfo,
    gpu: str | GPUInfo,
    train: Any,
    gpu_count: int = 1,
    *,
    waves: int = 1,
    has_vllm: bool = True,
    nodes: int = 1,
    link_gbps: float | None = None,
) -> float | None:
    """Seconds per optimizer step: compute-bound training plus (GRPO) generation in ``waves`` decode waves
    (``catalog.fit_report``'s, from vLLM's KV room or transformers' generation rounds), over
    ``nodes x gpu_count`` processes, with the gradients' all-reduce across pods (``gradient_sync_seconds``)."""
    info = resolve_model(model)
    g = gpu if isinstance(gpu, GPUInfo) else gpu_info(gpu)
    if info is None or g is None:
        return None
    sync = gradient_sync_seconds(info, train, nodes, link_gbps)
    gpu_count = max(1, gpu_count) * max(1, nodes)
    params = info.params_b * 1e9
    flops_per_s = g.bf16_tflops * 1e12 * MFU * max(1, gpu_count)
    if getattr(train, "method", "sft") == "grpo":
        seqs = train.prompts_per_step * train.group_size
        tokens = seqs * train.max_length
        vllm = uses_vllm(info, train, has_vllm)
        # Forward+backward with recompute ~ 8 x params per token. Each extra forward pass adds 2 x params
        # per token: TRL 1.16 recomputes the old policy's log-probs whenever rollouts come from vLLM
        # (vllm_importance_sampling_correction, on by default and kept on: it corrects the sampler/trainer
        # mismatch), and a KL term (beta > 0) scores the reference model.
        quant = quant_tier(info, train)
        extra = (1 if vllm else 0) + (1 if getattr(train, "beta", 0.0) > 0 else 0)
        train_s = (8 + 2 * extra) * params * tokens / flops_per_s
        return (
            train_s
            + sync
            + GRPO_STEP_FLOOR_S
            + generation_seconds(info, g, train, gpu_count, vllm=vllm, quant=quant, waves=waves)
        )
    tokens = train.batch_size * train.max_length
    return 8 * params * tokens / flops_per_s + sync


def prompt_budget(train: Any) -> int:
    """Tokens a prompt may take: what ``max_length`` leaves beside the completion budget."""
    return max(0, int(train.max_length) - int(getattr(train, "max_completion_tokens", 0) or 0))


def generation_seconds(
    info: ModelInfo, g: GPUInfo, train: Any, gpu_count: int = 1, *, vllm: bool, quant: str, waves: int = 1
) -> float:
    """A GRPO step's rollouts: each process decodes its share of them in ``waves`` waves of
    max_completion_tokens decode steps (``decode_step_seconds`` at the wave's sequences and mean context),
    plus a little per sequence (prefill, detokenizing, scoring hand-off)."""
    per_process = math.ceil(train.prompts_per_step * train.group_size / max(1, gpu_count))
    waves = max(1, waves)
    per_wave = math.ceil(per_process / waves)
    context = prompt_budget(train) + train.max_completion_tokens / 2
    step = decode_step_seconds(info, g, vllm=vllm, quant=quant, seqs=per_wave, context=context)
    return waves * train.max_completion_tokens * step + 0.002 * per_process


def decode_step_seconds(info: ModelInfo, g: GPUInfo, *, vllm: bool, quant: str, seqs: int = 1, context: float = 0.0) -> float:
    """One decode step of ``seqs`` sequences at a mean ``context`` tokens: the bytes it reads (weights, KV
    cache, the sampler's rows over the vocabulary) at a share of the memory bandwidth, plus vLLM's floor."""
    read = (
        info.params_b * 1e9 * WEIGHT_BYTES[quant]
        + seqs * context * kv_bytes_per_token(info)
        + seqs * info.vocab * VLLM_SAMPLER_BYTES
    )
    seconds = read / (g.mem_bw_gbs * 1e9 * DECODE_EFFICIENCY)
    if not vllm:
        # transformers' generate(): no CUDA graphs or paged KV, a Python loop per token, and (4-bit)
        # bitsandbytes dequantizing every layer at each step; its sampling per sequence as vLLM's.
        return seconds * HF_DECODE_SLOWDOWN + HF_DECODE_STEP_S + seqs * HF_DECODE_SEQ_S
    return seconds + DECODE_STEP_FLOOR_S + seqs * DECODE_SEQ_S


def evaluation_seconds(
    info: ModelInfo,
    g: GPUInfo,
    train: Any,
    rows: int,
    *,
    samples: int = 0,
    vllm: bool,
    quant: str,
    multi_turn: bool = False,
    concurrent: float | None = None,
) -> float:
    """One held-out evaluation of ``rows`` prompts (engine/rollout/evaluate.py), decoded as rollouts are:
    a greedy answer and ``samples`` sampled ones per prompt, each of up to ``answer_tokens`` tokens, in
    calls of ``EVAL_BATCH`` prompts (transformers; a multi-turn task's episodes too, its turns within the
    episode's budget) or ``GENERATOR_CHUNK`` (colocated vLLM, at most ``concurrent`` at once: its KV
    room), each call one decode wave of that many sequences; plus the loss's forward pass over the rows
    (2 x params a token). Every training process evaluates every row, so more GPUs do not shorten it."""
    if rows <= 0:
        return 0.0
    if multi_turn:  # greedy episodes only, no loss
        samples, per_call = 0, EVAL_BATCH
    elif vllm:
        per_call = max(1, min(GENERATOR_CHUNK, int(concurrent or GENERATOR_CHUNK)))
    else:
        per_call = EVAL_BATCH
    tokens = answer_tokens(train)
    context = prompt_budget(train) + tokens / 2
    decode = 0.0
    for n in (rows, rows * samples):  # the greedy calls, then the sampled ones: full calls and the rest
        full, rest = divmod(n, per_call)
        for count, seqs in ((full, per_call), (1 if rest else 0, rest)):
            if count:
                step = decode_step_seconds(info, g, vllm=vllm, quant=quant, seqs=seqs, context=context)
                decode += count * tokens * step
    decode += 0.002 * rows * (1 + samples)
    loss = 0.0 if multi_turn else 2 * info.params_b * 1e9 * rows * train.max_length / (g.bf16_tflops * 1e12 * MFU)
    return decode + loss


def estimate_run(
    model: str | ModelInfo,
    gpu: str | GPUInfo,
    train: Any,
    price_per_hour: float,
    *,
    max_hours: float,
    max_usd: float | None = None,
    gpu_count: int = 1,
    n_examples: int | None = None,
    waves: int = 1,
    has_vllm: bool = True,
    ev: Any = None,
    multi_turn: bool = False,
    concurrent: float | None = None,
    setup: SetupEstimate | None = None,
    nodes: int = 1,
    link_gbps: float | None = None,
) -> RunEstimate:
    """Rough duration and cost of one replica (as estimated, not cut at the limits), and the most it can
    cost under the spec's limits. ``ev``
    (the spec's ``[eval]``): its held-out evaluations of ``train.eval_samples`` rows are counted too
    (``evaluation_seconds``; ``multi_turn``: the task plays episodes; ``concurrent``: completions vLLM's
    KV room holds at once). ``setup``: the pod's set-up (``catalog.setup_estimate``); without it, a
    bootstrap pod on PyTorch's image that installs autoslm, and vLLM for GRPO: the longest set-up."""
    if setup is None:
        grpo = getattr(train, "method", "sft") == "grpo" and has_vllm
        setup = setup_estimate(model, image="pytorch", installs=("autoslm", "vllm") if grpo else ("autoslm",), vllm=grpo)
    ceiling = price_per_hour * max_hours
    if max_usd is not None:
        ceiling = min(ceiling, max_usd)
    steps = train_steps(train, n_examples)
    step = dict(waves=waves, has_vllm=has_vllm, nodes=nodes, link_gbps=link_gbps)
    per_step = step_seconds(model, gpu, train, gpu_count, **step)
    if steps is None:
        return RunEstimate(
            None, None, None, ceiling, "steps unknown (epochs over a dataset of unknown size): cost capped by limits", per_step
        )
    if per_step is None:
        return RunEstimate(steps, None, None, ceiling, "unknown model or GPU speed: cost capped by limits")
    evals, eval_s = _evaluations(model, gpu, train, steps, ev, has_vllm=has_vllm, multi_turn=multi_turn, concurrent=concurrent)
    # Not capped by the limits: a run that cannot finish within them shows what it would take (placement
    # judges such an offer unusable and says which limit it passes).
    harness_s = lm_eval_seconds(model, gpu, train, ev, has_vllm=has_vllm)
    hours = setup.hours + (steps * per_step + evals * eval_s + harness_s) / 3600
    usd = hours * price_per_hour
    basis = f"{steps} steps x ~{per_step:.1f} s"
    if evals:
        basis += f" + {evals} evaluation{'s' if evals != 1 else ''} x ~{eval_s:.0f} s"
    if harness_s:
        basis += f" + lm-eval ~{harness_s / 60:.0f} min"
    basis += f" + {setup.seconds / 60:.0f} min setup (MFU {MFU:.0%})"
    return RunEstimate(steps, hours, usd, ceiling, basis, per_step, eval_s if evals else None, evals, setup.seconds, harness_s)


def lm_eval_seconds(model, gpu, train: Any, ev: Any, *, has_vllm: bool = True) -> float:
    """``[eval] lm_eval`` after training: every task on the base and on the adapter (recipes/harness.py
    ``harness_plan``), each model loaded once into an engine, its answers decoded greedily in waves of
    ``GENERATOR_CHUNK`` (vLLM) or ``EVAL_BATCH`` (transformers) sequences; 0 without tasks."""
    from autoslm.recipes.harness import ENGINE_START_S, harness_plan

    info = resolve_model(model)
    g = gpu if isinstance(gpu, GPUInfo) else gpu_info(gpu)
    if ev is None or not getattr(ev, "lm_eval", None) or info is None or g is None:
        return 0.0
    vllm = has_vllm and servable_by_vllm(info, train)
    quant = quant_tier(info, train)
    per_call = GENERATOR_CHUNK if vllm else EVAL_BATCH
    tasks, tokens = harness_plan(ev, train)
    one_model = ENGINE_START_S
    for _task, rows, prompt in tasks:
        full, rest = divmod(rows, per_call)
        for count, seqs in ((full, per_call), (1 if rest else 0, rest)):
            if count:
                step = decode_step_seconds(info, g, vllm=vllm, quant=quant, seqs=seqs, context=prompt + tokens / 2)
                one_model += count * tokens * step
        one_model += 2 * info.params_b * 1e9 * rows * prompt / (g.bf16_tflops * 1e12 * MFU)  # the prompts' prefill
    return 2 * one_model  # the base, then the adapter


def _evaluations(
    model, gpu, train: Any, steps: int, ev: Any, *, has_vllm: bool, multi_turn: bool, concurrent: float | None
) -> tuple[int, float]:
    """(how many held-out evaluations, seconds each) for ``estimate_run``; (0, 0.0) without ``ev``."""
    count = evaluation_count(ev, train, steps) if ev is not None else 0
    info = resolve_model(model)
    g = gpu if isinstance(gpu, GPUInfo) else gpu_info(gpu)
    if not count or info is None or g is None:
        return 0, 0.0
    method = getattr(train, "method", "sft")
    # SFT's trainer has no vLLM: its evaluation generates with transformers.
    vllm = method == "grpo" and uses_vllm(info, train, has_vllm)
    seconds = evaluation_seconds(
        info,
        g,
        train,
        train.eval_samples,
        samples=sample_count(ev, method),
        vllm=vllm,
        quant=quant_tier(info, train),
        multi_turn=multi_turn,
        concurrent=concurrent,
    )
    return count, seconds
