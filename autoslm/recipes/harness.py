"""``[eval] lm_eval``: lm-evaluation-harness scores of the base model and of the adapter, beside the run's own.

The training prompt's score (engine/rollout/evaluate.py) measures the format the run trained; the field
compares models with lm-evaluation-harness (``gsm8k``: 5-shot, strict-match and flexible-extract). A run
with ``lm_eval`` set reports both, each named by its protocol. Pure rules here, shared by ``validate``,
``plan``, the worker (engine/harness.py) and the views: which entries are task files, the arguments of
lm-eval's ``vllm`` and ``hf`` models, the time ``plan`` counts, the block metrics.json keeps (built one
model at a time after the hand-back: ``with_scores``, ``with_failure``, ``cut_words``) and the lines and
rows the views show.

Three defaults of lm-eval would spoil an adapter's score, so the model arguments always set them:
``max_lora_rank`` (16 in lm-eval, so a rank-32 adapter fails to load; here the adapter's rank rounded up to
one vLLM accepts, ``recipes.generation.vllm_lora_rank``), ``max_gen_toks`` (256; a GRPO answer
trained to ``max_completion_tokens`` is cut) and ``enable_thinking`` (a Qwen3 thinks unless told).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from autoslm.recipes.generation import vllm_lora_rank

# The lm-evaluation-harness release the worker runs (pyproject.toml's worker extra, the pod's pins).
LM_EVAL_VERSION = "0.4.13"
TASK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
# Rows of the test split of tasks whose size is known, for ``plan`` (others: ``DEFAULT_ROWS``).
TASK_ROWS = {
    "gsm8k": 1319,
    "gsm8k_cot": 1319,
    "gsm8k_cot_zeroshot": 1319,
    "arc_easy": 2376,
    "arc_challenge": 1172,
    "hellaswag": 10042,
    "mmlu": 14042,
    "ifeval": 541,
    "math_500": 500,
    "minerva_math": 5000,
}
DEFAULT_ROWS = 1000
# Tokens of a few-shot prompt per shot (a GSM8K solution with its question is ~150 tokens).
TOKENS_PER_SHOT = 160
# What a harness answer usually takes when the task stops it early (lm-eval's "until" strings).
TYPICAL_ANSWER_TOKENS = 256
# Loading a model into vLLM (weights, profiling, CUDA graphs) before the first request, per model.
ENGINE_START_S = 90.0
THINK_END = "</think>"


def is_task_file(ref: str) -> bool:
    """A task YAML (a path) rather than a task name of lm-eval's own list."""
    return ref.endswith((".yaml", ".yml"))


def task_label(ref: str) -> str:
    """What a task is called in metrics and views: its name, or the YAML file's stem."""
    if is_task_file(ref):
        name = ref.replace("\\", "/").rsplit("/", 1)[-1]
        return name.rsplit(".", 1)[0]
    return ref


def gen_tokens(train) -> int:
    """``max_gen_toks``: at least the run's own completion length (GRPO), never below lm-eval's 256."""
    return max(256, int(getattr(train, "max_completion_tokens", 0) or 0))


def vllm_model_args(
    model: str,
    adapter: str | None,
    *,
    lora_rank: int,
    max_gen_toks: int,
    max_model_len: int,
    thinking: bool,
    gpu_memory_utilization: float = 0.85,
    seed: int = 0,
    dtype: str = "auto",
) -> dict:
    """lm-eval's ``vllm`` model: the base, with the adapter as a LoRA request when given."""
    args = {
        "pretrained": model,
        "dtype": dtype,
        "max_gen_toks": max_gen_toks,
        "max_model_len": max_model_len,
        "gpu_memory_utilization": gpu_memory_utilization,
        "enable_thinking": thinking,
        "seed": seed,
    }
    if thinking:
        args["think_end_token"] = THINK_END
    if adapter is not None:
        args.update(lora_local_path=adapter, max_lora_rank=vllm_lora_rank(lora_rank))
    return args


def hf_model_args(model: str, adapter: str | None, *, thinking: bool, device: str = "cpu", dtype: str = "auto") -> dict:
    """lm-eval's ``hf`` model (transformers), with the adapter through ``peft=`` when given. Its answer
    length is not a model argument: ``gen_kwargs`` (``max_gen_toks``) carries it."""
    args = {"pretrained": model, "dtype": dtype, "device": device, "enable_thinking": thinking}
    if thinking:
        args["think_end_token"] = THINK_END
    if adapter is not None:
        args["peft"] = adapter
    return args


def args_string(args: dict) -> str:
    """``key=value,...`` as lm-eval's command line takes model arguments (and its parser reads back)."""
    return ",".join(f"{k}={v}" for k, v in args.items())


def task_rows(ref: str, limit: int | None) -> int:
    rows = TASK_ROWS.get(task_label(ref), DEFAULT_ROWS)
    return min(rows, limit) if limit else rows


def harness_plan(ev, train) -> tuple[list[tuple[str, int, int]], int]:
    """([(task, rows, prompt tokens)], answer tokens) of the harness runs ``plan`` prices: every task,
    on the base and on the adapter."""
    shots = ev.lm_eval_shots if ev.lm_eval_shots is not None else 5
    tasks = [(task_label(t), task_rows(t, ev.lm_eval_limit), 200 + shots * TOKENS_PER_SHOT) for t in ev.lm_eval]
    return tasks, min(gen_tokens(train), TYPICAL_ANSWER_TOKENS)


# -- results, as metrics.json keeps them and the views show them ----------------------------------
PROTOCOL = "lm-eval"
# The block's ``state`` while the harness runs after the hand-back (the worker writes the block again,
# without it, when the harness ends); ``cut`` names what a limit (or the pod's stop) left unscored, and
# ``errors`` each model whose harness failed (``error`` joins them, as a block without models had it).
RUNNING = "running"


def with_scores(block: dict, name: str, part: dict) -> dict:
    """``block`` with model ``name``'s scores joined in from its harness process's block (``part``)."""
    out = {**block, **{k: part[k] for k in ("version", "backend", "model_args") if k in part}}
    out["models"] = {**(block.get("models") or {}), name: (part.get("models") or {}).get(name) or {}}
    seconds = (part.get("model_seconds") or {}).get(name)
    if seconds is not None:
        out["model_seconds"] = {**(block.get("model_seconds") or {}), name: seconds}
    return out


def with_failure(block: dict, name: str, message: str) -> dict:
    """``block`` with model ``name``'s harness failure recorded beside the other model's scores."""
    errors = {**(block.get("errors") or {}), name: message}
    return {**block, "errors": errors, "error": "; ".join(f"{k}: {v}" for k, v in errors.items())}


def cut_words(why: str, missing: list[str]) -> str:
    """What a cut harness says, e.g. "the time limit (limits.max_hours) cut lm-eval before it scored the
    adapter; the base's scores are kept"."""
    names = " and ".join(f"the {m}" for m in missing)
    kept = [m for m in ("base", "adapter") if m not in missing]
    return f"{why} cut lm-eval before it scored {names}" + (f"; the {kept[0]}'s scores are kept" if kept else "")


@dataclass(frozen=True)
class LmEvalBlock:
    """metrics.json's ``lm_eval`` block, typed where the views read it: ``{"version", "seconds",
    "models": {"base": {task: {...}}, "adapter": {...}}}``, each task ``{"version", "shots", "samples",
    "metrics": {"exact_match,strict-match": 0.31, ...}}``; ``running`` while the harness follows the
    hand-back (on ``tasks``), ``cut``'s words where a limit cut it, ``error`` where it failed.
    ``to_json()`` gives the block back as written."""

    raw: dict
    version: Any = "?"
    running: bool = False
    tasks: tuple = ()
    cut: str | None = None
    error: Any = None
    models: dict = field(default_factory=dict)  # "base" / "adapter" -> {task: {...}}, as written

    @classmethod
    def of(cls, block) -> LmEvalBlock | None:
        """The block, or None where there is none (or it is not a table)."""
        if isinstance(block, LmEvalBlock):
            return block
        if not block or not isinstance(block, dict):
            return None
        cut = block.get("cut")
        return cls(
            raw=block,
            version=block.get("version", "?"),
            running=block.get("state") == RUNNING,
            tasks=tuple(block.get("tasks") or ()),
            cut=(cut.get("words") or None) if isinstance(cut, dict) else None,
            error=block.get("error") or None,
            models=block.get("models") or {},
        )

    def to_json(self) -> dict:
        return self.raw


def block_words(block: LmEvalBlock | dict | None) -> list[str]:
    """What the block says beside its scores: the harness still running, cut, or failed."""
    block = LmEvalBlock.of(block)
    if not block:
        return []
    out = []
    if block.running:
        tasks = ", ".join(task_label(str(t)) for t in block.tasks)
        out.append(
            f"{PROTOCOL}: not finished: it runs after the hand-back on {tasks}; its scores join these metrics when it ends"
        )
    if block.cut:
        out.append(f"{PROTOCOL}: {block.cut}")
    if block.error:
        out.append(f"{PROTOCOL}: {block.error}")
    return out


def metric_rows(block: LmEvalBlock | dict | None) -> list[dict]:
    """The block's scores as rows: one per task and metric, base -> adapter, with the task's version,
    shots and samples."""
    block = LmEvalBlock.of(block)
    if not block:
        return []
    base, adapter = block.models.get("base") or {}, block.models.get("adapter") or {}
    rows = []
    for task in sorted(set(base) | set(adapter)):
        b, a = base.get(task) or {}, adapter.get(task) or {}
        info = a or b
        for metric in sorted(set(b.get("metrics") or {}) | set(a.get("metrics") or {})):
            rows.append(
                {
                    "task": task,
                    "metric": metric,
                    "base": (b.get("metrics") or {}).get(metric),
                    "adapter": (a.get("metrics") or {}).get(metric),
                    "task_version": info.get("version"),
                    "shots": info.get("shots"),
                    "samples": info.get("samples"),
                }
            )
    return rows


def protocol_words(block: LmEvalBlock | dict, row: dict) -> str:
    """How one score was measured, e.g. "lm-eval 0.4.13, gsm8k v3, 5-shot, 1319 samples"."""
    block = LmEvalBlock.of(block)
    shots = row.get("shots")
    parts = [
        f"{PROTOCOL} {block.version}",
        f"{row['task']} v{row.get('task_version', '?')}",
        f"{shots}-shot" if shots is not None else "shots: task default",
        f"{row.get('samples', '?')} samples",
    ]
    return ", ".join(parts)


def metric_lines(block: LmEvalBlock | dict | None) -> list[str]:
    """One line per task and metric: ``lm-eval gsm8k exact_match,strict-match: 0.310 -> 0.352 (protocol)``."""
    block = LmEvalBlock.of(block)
    out = []
    for row in metric_rows(block):

        def fmt(v):
            return "-" if v is None else f"{v:.3f}"

        out.append(
            f"{PROTOCOL} {row['task']} {row['metric']}: {fmt(row['base'])} -> {fmt(row['adapter'])} "
            f"({protocol_words(block, row)})"
        )
    return out + block_words(block)


def time_words(train_time_s: float | None, lm_eval_time_s: float | None) -> str:
    """Training seconds, and beside them the evaluations' (the lm-eval phase's): each only where it is
    known (a run the controller handed back at a limit has no training time); "" when neither is."""
    said = [f"{s}s {what}" for s, what in ((train_time_s, "training"), (lm_eval_time_s, "lm-eval")) if s is not None]
    return ", ".join(said)


def model_index(block: LmEvalBlock | dict | None, name: str) -> str:
    """The model card's ``model-index`` YAML: the adapter's lm-eval scores (the base's beside them in
    each metric's name), one result per task. Empty without scores."""
    block = LmEvalBlock.of(block)
    rows = [r for r in metric_rows(block) if r["adapter"] is not None]
    if not rows:
        return ""
    q = json.dumps
    out = ["model-index:", f"- name: {q(name)}", "  results:"]
    for task in sorted({r["task"] for r in rows}):
        out += [
            "  - task:",
            "      type: text-generation",
            "    dataset:",
            f"      name: {q(task)}",
            f"      type: {q(task)}",
            "    metrics:",
        ]
        for r in (r for r in rows if r["task"] == task):
            base = "" if r["base"] is None else f", base {r['base']:.4f}"
            out += [
                f"    - type: {q(r['metric'].split(',')[0])}",
                f"      value: {r['adapter']}",
                f"      name: {q(r['metric'] + ' (' + protocol_words(block, r) + base + ')')}",
            ]
        out += [
            "    source:",
            f"      name: {q(PROTOCOL + ' ' + str(block.version))}",
            '      url: "https://github.com/EleutherAI/lm-evaluation-harness"',
        ]
    return "\n".join(out) + "\n"
