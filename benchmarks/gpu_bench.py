"""python benchmarks/gpu_bench.py   # on one H100/H200-class GPU: under 8 minutes, downloads nothing

How fast and how big is autoslm's GPU recipe? SFT throughput against plain TRL, peak memory against the
planner, GRPO step time, model FLOP utilisation. Flags: --steps, --grpo-steps, --peak-tflops, --no-8b,
--budget-s. The same code paths on a CPU, with tiny shapes, as a smoke test (about a minute):

    python benchmarks/gpu_bench.py --device cpu --quick

With --grpo it measures a GRPO step instead (benchmarks/grpo_bench.py: generation, weight sync, scoring and
training time, decode waves, peak memory, tokens/s; autoslm's recipe beside plain TRL defaults and beside
`autoslm plan`'s estimate), writes --out (JSON) and prints a table; on a CPU it runs the built-in model:

    python benchmarks/gpu_bench.py --grpo --out grpo.json

Needs torch (CUDA for real numbers), transformers, trl, peft, accelerate, datasets, tokenizers: the worker
image's stack. Optional, skipped with a note when missing: liger_kernel, vllm, flash_attn or kernels (a Hub
attention kernel only if already cached: HF_HUB_OFFLINE=1 is set first). Models are random-init Qwen3-0.6B
and Qwen3-8B shapes with Qwen3's vocabulary of 151936 (logits cost what they do); the tokenizer is the BPE
autoslm builds for its offline tiny model, so token ids use the vocabulary's low range only.

Prints a table, then the same numbers as one JSON line:
  * SFT non-padding tokens/s over the timed steps, on the same rows (64-512 tokens), for autoslm's recipe
    (the worker's load_kwargs, attach_adapter, sft_config_kwargs) and for plain TRL (transformers' default
    load, SFTConfig defaults, micro-batch 8 accumulated to the same batch, the same LoRA); their ratio;
  * peak GPU memory (max_memory_allocated) of one full-length micro-batch against the planner's estimate
    (catalog.vram_breakdown), for the 0.6B and the 8B shape (the 8B for memory only);
  * GRPO seconds per step with transformers generation, and with colocated vLLM when installed (a random
    model never samples EOS: every completion runs to max_completion_tokens, the worst case);
  * MFU = 6 N tokens/s / the GPU's dense bf16 peak (catalog.gpu_info from the device name, or --peak-tflops).
Exits 1 if a phase failed (traceback on stderr; the other phases still ran).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

# Before anything imports huggingface_hub: never download, print no progress bars.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: autoslm

from autoslm.catalog import MFU, MODELS, gpu_info, vram_breakdown  # noqa: E402 - after the path fix above
from autoslm.spec import validate_dict  # noqa: E402

SMALL, LARGE = "Qwen/Qwen3-0.6B", "Qwen/Qwen3-8B"
# The Hub checkpoints' config.json shapes, and the --quick stand-ins.
SHAPES = {
    SMALL: dict(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
        vocab_size=151936,
    ),
    LARGE: dict(
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=False,
        vocab_size=151936,
    ),
}
QUICK_SHAPES = {
    m: dict(
        SHAPES[m],
        hidden_size=h,
        intermediate_size=3 * h,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=h // 4,
        vocab_size=2048,
    )
    for m, h in ((SMALL, 64), (LARGE, 128))
}
# [train] of jobspecs/qwen3-0.6b-{sft,grpo}-gpu.toml. save_every past the run: the benchmark writes no checkpoints.
SFT_TRAIN = dict(
    method="sft", max_steps=1000, batch_size=64, learning_rate=2e-4, max_length=512, lora_rank=32, lora_alpha=64, save_every=10**6
)
GRPO_TRAIN = dict(
    method="grpo",
    max_steps=1000,
    prompts_per_step=32,
    group_size=8,
    learning_rate=1e-5,
    max_completion_tokens=256,
    max_length=512,
    beta=0.0,
    loss_type="dr_grpo",
    scale_rewards="none",
    lora_rank=32,
    lora_alpha=64,
    save_every=10**6,
    vllm={"gpu_memory_utilization": 0.4, "max_model_len": 768},
    # Every completion is truncated (no EOS from a random model): masking them would leave an
    # all-zero loss. Unmasked, every step does its full backward pass, as a real run does.
    mask_truncated_completions=False,
)
QUICK_SFT = dict(SFT_TRAIN, batch_size=8, max_length=128, lora_rank=8, lora_alpha=16)
QUICK_GRPO = dict(
    GRPO_TRAIN,
    prompts_per_step=2,
    group_size=2,
    max_completion_tokens=8,
    max_length=64,
    lora_rank=8,
    lora_alpha=16,
    vllm={"gpu_memory_utilization": 0.4},
)
BASELINE_MICRO = 8  # TrainingArguments' default per_device_train_batch_size (--quick: 2)
WORDS = (
    "the a is are what how many which answer question number sum plus minus times add result equals "
    "correct guess game turn you your please compute calculate tool call function value total give "
    "reply think step first then so final of to in and or with for on at by from it this that"
).split()


class Bench:
    """What every phase shares: the device, the time budget, notes, results."""

    def __init__(self, args):
        import torch

        from autoslm.engine.train.recipe import Device

        self.args, self.torch, self.t0 = args, torch, time.monotonic()
        self.cuda = args.device != "cpu" and torch.cuda.is_available()
        if args.device == "cuda" and not self.cuda:
            sys.exit("gpu_bench: --device cuda but torch sees no CUDA device (try --device cpu --quick)")
        detected = Device.detect()
        self.installed = detected.packages  # the optional packages, on a CPU too
        self.device = detected if self.cuda else Device.assumed("cpu")
        self.shapes = QUICK_SHAPES if args.quick else SHAPES
        self.notes: list[str] = []
        self.results: dict = {"device": self.device.to_dict(), "quick": args.quick, "notes": self.notes}
        self.errors = 0
        self.work = Path(tempfile.mkdtemp(prefix="gpu_bench-"))
        self.peak_tflops = args.peak_tflops
        if self.peak_tflops is None and self.cuda:
            g = gpu_info(torch.cuda.get_device_name(0))
            self.peak_tflops = g.bf16_tflops if g else None
            if g is None:
                self.notes.append(f"{torch.cuda.get_device_name(0)} is not in the catalog: pass --peak-tflops for MFU")

    def left(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.t0)

    def spec(self, model: str, method: str):
        quick = self.args.quick
        train = (QUICK_SFT if quick else SFT_TRAIN) if method == "sft" else (QUICK_GRPO if quick else GRPO_TRAIN)
        return validate_dict({"name": "gpu-bench", "model": model, "environment": {"id": "autoslm/arith"}, "train": train})

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def reset_memory(self):
        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats()

    def peak_gib(self) -> dict:
        c = self.torch.cuda
        return {
            "peak_alloc_gib": round(c.max_memory_allocated() / 2**30, 2) if self.cuda else None,
            "peak_reserved_gib": round(c.max_memory_reserved() / 2**30, 2) if self.cuda else None,
        }


def flop_params(model) -> int:
    """Parameters a token's forward pass multiplies by (2 FLOPs each): all but the input embedding, a
    lookup. A tied LM head is the embedding tensor, which ``parameters()`` lists once: it stays counted."""
    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    return total if emb is model.get_output_embeddings().weight else total - emb.numel()


def random_model(bench: Bench, model_id: str, tokenizer, dtype: str, attn: str):
    """A random-init model of ``model_id``'s shape, built straight on the device (an 8B initialised on
    the CPU first would take minutes). An attention kernel that cannot load falls back to SDPA."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(
        **bench.shapes[model_id],
        max_position_embeddings=40960,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    with torch.device("cuda" if bench.cuda else "cpu"):
        try:
            model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype), attn_implementation=attn)
        except (ImportError, ValueError, OSError) as e:
            bench.notes.append(f"{model_id}: attention {attn!r} unavailable ({str(e).splitlines()[0][:120]}): sdpa")
            model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype), attn_implementation="sdpa")
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def load_recipe_model(bench: Bench, path: Path, load: dict):
    """The worker's ``models.load_model``. It falls back to SDPA only on ImportError/ValueError; a Hub
    kernel missing from an offline cache may raise something else, so retry here, with a note."""
    from autoslm.engine.train import models

    try:
        return models.load_model(str(path), load)
    except Exception as e:  # noqa: BLE001 - noted, then retried without the kernel
        if load.get("attn_implementation") in (None, "sdpa", "eager"):
            raise
        bench.notes.append(
            f"models.load_model failed with attention {load['attn_implementation']!r} "
            f"({type(e).__name__}: {str(e).splitlines()[0][:120]}): retried with sdpa"
        )
        return models.load_model(str(path), {**load, "attn_implementation": "sdpa"})


def sft_rows(tokenizer, n: int, max_length: int, *, full: bool = False, seed: int = 0) -> list[dict]:
    """Prompt/completion rows, the prompt rendered as the worker renders it. Lengths (in words, ~1.2 tokens
    each) vary from max_length/8 to max_length, so padding matters; ``full`` rows are all cut at max_length."""
    from autoslm.engine.train.data import render_prompt

    rng = random.Random(seed)

    def text(n_words: int) -> str:
        return " ".join(rng.choice(WORDS) if rng.random() < 0.8 else str(rng.randrange(1000)) for _ in range(n_words))

    rows = []
    for _ in range(n):
        total = int(max_length * 1.2) if full else rng.randint(max_length // 8, max_length)
        p = max(4, rng.randint(total // 8, total // 4))
        rows.append(
            {
                "prompt": render_prompt(tokenizer, [{"role": "user", "content": text(p)}], thinking=False),
                "completion": text(max(4, total - p - 12)),
            }
        )
    return rows


def step_timer(bench: Bench, warmup: int, deadline: float):
    """A callback noting the time and non-padding tokens seen at the end of every optimizer step; it ends
    the run once ``deadline`` (time.monotonic) has passed and at least one step was timed."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            bench.sync()
            self.marks = [(time.perf_counter(), state.num_input_tokens_seen or 0)]

        def on_step_end(self, args, state, control, **kw):
            bench.sync()  # CUDA runs ahead of Python: time what the GPU did
            self.marks.append((time.perf_counter(), state.num_input_tokens_seen or 0))
            if time.monotonic() > deadline and len(self.marks) > warmup + 1:
                control.should_training_stop = True

        def window(self) -> dict:
            steps = len(self.marks) - 1 - warmup
            if steps < 1:
                return {"timed_steps": 0}
            (t0, n0), (t1, n1) = self.marks[warmup], self.marks[-1]
            return {
                "timed_steps": steps,
                "s_per_step": round((t1 - t0) / steps, 3),
                "tokens": n1 - n0,
                "tokens_per_s": round((n1 - n0) / (t1 - t0), 1),
            }

    return StepTimer()


def quiet(trainer):
    """No per-step log lines or progress bars: the table at the end is the output."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    return trainer


def run_sft(
    bench: Bench, model, tokenizer, kw: dict, rows: list[dict], *, warmup: int, peft_config=None, max_length: int | None = None
) -> dict:
    """``max_length``: the recipe's run, built as the worker builds it (``engine.sft.sft_trainer``: rows cut
    to max_length when the batches are padding-free); None: plain TRL."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from autoslm.engine.train.sft import sft_trainer

    timer = step_timer(bench, warmup, time.monotonic() + max(30.0, bench.left() - 240))  # time for the later phases
    if max_length is not None:
        trainer = quiet(
            sft_trainer(
                model=model, args=SFTConfig(**kw), rows=rows, tokenizer=tokenizer, callbacks=[timer], max_length=max_length
            )
        )
    else:
        trainer = quiet(
            SFTTrainer(
                model=model,
                args=SFTConfig(**kw),
                train_dataset=Dataset.from_list(rows),
                processing_class=tokenizer,
                callbacks=[timer],
                peft_config=peft_config,
            )
        )
    bench.reset_memory()
    trainer.train()
    return {
        **timer.window(),
        **bench.peak_gib(),
        "micro": kw["per_device_train_batch_size"],
        "grad_accum": kw.get("gradient_accumulation_steps", 1),
    }


def phase_sft(bench: Bench, tokenizer, path: Path, *, recipe: bool):
    """One timed SFT run on the shared rows: plain TRL (transformers' default load, SFTConfig defaults, TRL's
    own LoRA wrapping) or autoslm's recipe (the worker's load_kwargs, attach_adapter, sft_config_kwargs)."""
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    from autoslm.engine.train import models
    from autoslm.engine.train.gpu import lora_config_kwargs
    from autoslm.engine.train.sft import sft_config_kwargs

    spec, info, a = bench.spec(SMALL, "sft"), MODELS[SMALL], bench.args
    steps, train = a.warmup + a.steps, spec.train
    rows = sft_rows(tokenizer, steps * train.batch_size, train.max_length)
    if recipe:
        load = models.load_kwargs(spec, info, bench.device)
        model = load_recipe_model(bench, path, load)
        attn, n_params = getattr(model.config, "_attn_implementation", None) or "sdpa", flop_params(model)
        torch.manual_seed(0)
        model, peft = models.attach_adapter(model, spec, info), None
        kw = sft_config_kwargs(spec, bench.device, attn, seed=0, output_dir=bench.work / "recipe", max_steps=steps)
        kw.update(save_strategy="no", include_num_input_tokens_seen="non_padding")
        extra = {"dtype/attn": f"{load['dtype']}/{attn}", "padding_free": kw["padding_free"], "liger": kw["use_liger_kernel"]}
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path))  # transformers' defaults: dtype, attention
        n_params, peft = flop_params(model), LoraConfig(**lora_config_kwargs(spec, info))
        micro = 2 if a.quick else BASELINE_MICRO
        kw = dict(
            output_dir=str(bench.work / "baseline"),
            max_steps=steps,
            report_to="none",
            max_length=train.max_length,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=train.batch_size // micro,
            # Measurement and noise only, no speed setting: count tokens, same data order, no bars.
            include_num_input_tokens_seen="non_padding",
            seed=0,
            data_seed=0,
            disable_tqdm=True,
        )
        if not bench.cuda:
            kw["bf16"] = False  # TRL defaults to bf16=True, which TrainingArguments rejects on a CPU
        extra = {"dtype/attn": f"{str(model.dtype).replace('torch.', '')}/{model.config._attn_implementation}"}
    out = {
        **run_sft(
            bench, model, tokenizer, kw, rows, warmup=a.warmup, peft_config=peft, max_length=train.max_length if recipe else None
        ),
        **extra,
    }
    sample = rows[:256]
    bench.results.setdefault("sft", {}).update(
        {
            "recipe" if recipe else "baseline": out,
            "flop_params": n_params,
            "mean_tokens_per_row": round(
                sum(len(tokenizer(r["prompt"] + r["completion"])["input_ids"]) for r in sample) / len(sample), 1
            ),
        }
    )
    del model
    bench.reset_memory()


def sft_summary(bench: Bench):
    """recipe/baseline tokens/s, and MFU = 6 N tokens/s / peak FLOP/s (N from ``flop_params``)."""
    sft = bench.results.get("sft", {})
    rec, base = (sft.get(k, {}).get("tokens_per_s") for k in ("recipe", "baseline"))
    sft["ratio"] = round(rec / base, 2) if rec and base else None
    if bench.peak_tflops and rec:
        per_token = sft["flop_params"] / (bench.peak_tflops * 1e12)
        sft["mfu"] = {
            "recipe_6n": round(6 * per_token * rec, 3),
            "baseline_6n": round(6 * per_token * (base or 0), 3),
            # catalog.step_seconds counts 8N per token (recompute included) at catalog.MFU
            "recipe_8n": round(8 * per_token * rec, 3),
            "planner_assumes_8n": MFU,
            "peak_tflops": bench.peak_tflops,
        }


def phase_memory(bench: Bench, tokenizer, model_id: str, path: Path | None):
    """One full-length micro-batch (every row cut at max_length: the planner's worst case) through the
    recipe's SFTTrainer; its peak against the planner's estimate for that micro-batch."""
    from autoslm.engine.train import models
    from autoslm.engine.train.recipe import attn_implementation, torch_dtype_name, use_checkpointing
    from autoslm.engine.train.sft import sft_config_kwargs

    spec, info = bench.spec(model_id, "sft"), MODELS[model_id]
    bench.reset_memory()
    if path is not None:
        model = load_recipe_model(bench, path, models.load_kwargs(spec, info, bench.device))
    else:  # too big to save and reload within the budget: built in place, as load_kwargs would load it
        model = random_model(
            bench,
            model_id,
            tokenizer,
            torch_dtype_name(spec.train, bench.device),
            attn_implementation(spec.train, info, bench.device),
        )
    attn = getattr(model.config, "_attn_implementation", None) or "sdpa"
    n_params = sum(p.numel() for p in model.parameters())
    weight_gib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
    model = models.attach_adapter(model, spec, info)
    kw = sft_config_kwargs(spec, bench.device, attn, seed=0, output_dir=bench.work / "memory", max_steps=1)
    micro = kw["per_device_train_batch_size"]
    kw.update(save_strategy="no", gradient_accumulation_steps=1)  # every micro-batch peaks alike: measure one
    shape = bench.shapes[model_id]  # the catalog entry the planner uses; in --quick, resized to the tiny shape
    planned = (
        info
        if not bench.args.quick
        else dataclasses.replace(
            info,
            params_b=n_params / 1e9,
            hidden=shape["hidden_size"],
            layers=shape["num_hidden_layers"],
            vocab=shape["vocab_size"],
        )
    )
    est = vram_breakdown(
        planned, spec.train, micro=micro, checkpointing=use_checkpointing(spec.train, bench.device), liger=kw["use_liger_kernel"]
    )
    row = {
        "model": model_id,
        "micro": micro,
        "attn": attn,
        "weights_gib": round(weight_gib, 2),
        "planner_weights_gib": round(est.weights_gb, 2),
        "planner_gib": round(est.train_gb, 2),
    }
    try:
        got = run_sft(
            bench,
            model,
            tokenizer,
            kw,
            sft_rows(tokenizer, micro, spec.train.max_length, full=True, seed=1),
            warmup=0,
            max_length=spec.train.max_length,
        )
        row.update({k: got[k] for k in ("tokens", "s_per_step", "peak_alloc_gib", "peak_reserved_gib") if k in got})
    except bench.torch.cuda.OutOfMemoryError:  # the planner said it fits and it does not: that is the finding
        row.update(oom=True, **bench.peak_gib())
    if row.get("peak_alloc_gib"):
        row["ratio"] = round(row["peak_alloc_gib"] / est.train_gb, 2)
    bench.results.setdefault("memory", []).append(row)
    del model
    bench.reset_memory()


def digit_reward(completions, **_) -> list[float]:
    """Cheap and never constant: the share of a completion's characters that are digits."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]


def phase_grpo(bench: Bench, tokenizer, path: Path, *, vllm: bool):
    """GRPO steps with the recipe's grpo_config_kwargs, straight into TRL's GRPOTrainer."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from autoslm.engine.train import models
    from autoslm.engine.train.grpo import grpo_config_kwargs

    spec, info, a = bench.spec(SMALL, "grpo"), MODELS[SMALL], bench.args
    # The transformers run hides vllm from the recipe; the vLLM run sees what this machine has.
    device = bench.device if vllm else dataclasses.replace(bench.device, packages=bench.device.packages - {"vllm"})
    notes: list[str] = []
    kw, plan = grpo_config_kwargs(
        spec, device, seed=0, output_dir=bench.work / f"grpo-{vllm}", max_steps=1 + a.grpo_steps, notes=notes
    )
    name = "vllm" if vllm else "transformers"
    if vllm and not kw.get("use_vllm"):
        bench.results.setdefault("grpo", {})[name] = {"skipped": "; ".join(notes)}
        return
    kw.update(save_strategy="no")
    model = models.attach_adapter(load_recipe_model(bench, path, models.load_kwargs(spec, info, device)), spec, info)
    rng = random.Random(2)
    rows = [
        {
            "prompt": [
                {
                    "role": "user",
                    "content": f"What is {rng.randrange(1000)} + {rng.randrange(1000)}? Answer with the number only.",
                }
            ]
        }
        for _ in range(max(64, spec.train.prompts_per_step * (2 + a.grpo_steps)))
    ]
    reserve = 150 if not vllm and "vllm" in bench.installed else 0  # time for the vLLM run after this one
    timer = step_timer(bench, 1, time.monotonic() + max(30.0, bench.left() - reserve))
    bench.reset_memory()
    t = time.perf_counter()  # construction starts colocated vLLM: reported apart from the step time
    trainer = quiet(
        GRPOTrainer(
            model=model,
            reward_funcs=[digit_reward],
            args=GRPOConfig(**kw),
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            callbacks=[timer],
        )
    )
    init_s = time.perf_counter() - t
    trainer.train()
    logs = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    out = {k: v for k, v in timer.window().items() if not k.startswith("tokens")}  # GRPO counts prompt tokens only
    bench.results.setdefault("grpo", {})[name] = {
        **out,
        **bench.peak_gib(),
        "init_s": round(init_s, 1),
        "completions_per_step": plan.completions_per_step,
        "micro": plan.per_device_train_batch_size,
        "mean_completion_tokens": round(logs[-1], 1) if logs else None,
        "notes": notes,
    }
    del trainer, model
    bench.reset_memory()


def run_phase(bench: Bench, name: str, need_s: float, fn, *args, **kwargs):
    """Run one phase; a failure is recorded (traceback on stderr) and the next phase still runs."""
    if bench.left() < need_s:
        bench.notes.append(f"skipped {name}: time budget ({bench.left():.0f} s left, needs ~{need_s:.0f} s)")
        return
    t = time.monotonic()
    print(f"[gpu_bench] {name} ...", flush=True)
    try:
        fn(bench, *args, **kwargs)
    except Exception as e:  # noqa: BLE001 - one broken phase must not hide the others' numbers
        bench.errors += 1
        traceback.print_exc()
        bench.results.setdefault("errors", {})[name] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"
        bench.reset_memory()
    print(f"[gpu_bench] {name}: {time.monotonic() - t:.1f} s", flush=True)


def fmt(x, spec=".1f") -> str:
    return "-" if x is None else format(x, spec) if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


def report(bench: Bench):
    r, sft = bench.results, bench.results.get("sft", {})
    print(
        f"\n== autoslm gpu_bench: {r['device']['name']} ({'--quick shapes' if r['quick'] else 'Qwen3 shapes'}), {r['wall_s']} s =="
    )
    if "recipe" in sft or "baseline" in sft:
        print(
            f"SFT {SMALL} shape, ~{sft['mean_tokens_per_row']} tokens/row  "
            f"{'run':9} {'dtype/attn':28} {'micro x acc':>11} {'tok/s':>10} {'s/step':>7} {'peak GiB':>9}"
        )
        for name in ("baseline", "recipe"):
            s = sft.get(name, {"dtype/attn": "failed", "micro": "-", "grad_accum": "-"})
            print(
                f"{'':44}{name:9} {s['dtype/attn']:28} {s['micro']:>5} x {s['grad_accum']:<3} {fmt(s.get('tokens_per_s')):>10} "
                f"{fmt(s.get('s_per_step'), '.3f'):>7} {fmt(s.get('peak_alloc_gib'), '.2f'):>9}"
            )
        rec = sft.get("recipe", {})
        print(
            f"  recipe / baseline tokens/s: {fmt(sft['ratio'], '.2f')}x  (padding_free={rec.get('padding_free')}, liger={rec.get('liger')})"
        )
        m = sft.get("mfu")
        print(
            f"  MFU (6N, N = {sft['flop_params'] / 1e6:.0f}M, peak {m['peak_tflops']:g} TFLOP/s): recipe {m['recipe_6n']:.1%}, "
            f"baseline {m['baseline_6n']:.1%}; at 8N (recompute) {m['recipe_8n']:.1%}, the planner assumes {m['planner_assumes_8n']:.0%}"
            if m
            else "  MFU: - (no CUDA, or a GPU the catalog lacks: --peak-tflops)"
        )
    for row in r.get("memory", []):
        peak = "OOM" if row.get("oom") else fmt(row.get("peak_alloc_gib"), ".2f")
        print(
            f"memory {row['model']:15} micro {row['micro']:>3} ({fmt(row.get('tokens'), 'd')} tokens, {row['attn']}): peak {peak} GiB"
            f" (reserved {fmt(row.get('peak_reserved_gib'), '.2f')}) vs planner {row['planner_gib']:.2f} GiB = "
            f"{fmt(row.get('ratio'), '.2f')}x; weights {row['weights_gib']:.2f} vs planner {row['planner_weights_gib']:.2f} GiB"
        )
    for name, g in r.get("grpo", {}).items():
        print(
            f"GRPO {name:12}: skipped ({g['skipped']})"
            if "skipped" in g
            else f"GRPO {name:12}: {fmt(g.get('s_per_step'), '.2f')} s/step over {g['timed_steps']} steps; {g['completions_per_step']} completions"
            f" x ~{fmt(g['mean_completion_tokens'])} tokens, micro {g['micro']}; init {g['init_s']} s; peak {fmt(g.get('peak_alloc_gib'), '.2f')} GiB"
        )
    for note in bench.notes:
        print(f"note: {note}")
    for name, err in r.get("errors", {}).items():
        print(f"FAILED {name}: {err}")
    print(json.dumps(r, default=str))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--quick", action="store_true", help="tiny shapes, few steps: a smoke test of every code path")
    p.add_argument("--steps", type=int, help="timed SFT steps per run (default 8; --quick 2)")
    p.add_argument("--warmup", type=int, help="untimed SFT steps before them (default 2; --quick 1)")
    p.add_argument("--grpo-steps", type=int, help="timed GRPO steps after one warm-up step (default 2; --quick 1)")
    p.add_argument("--peak-tflops", type=float, help="dense bf16 peak for MFU (default: the catalog's, from the GPU name)")
    p.add_argument("--budget-s", type=float, default=420, help="seconds after start-up; later phases shrink or are skipped")
    p.add_argument("--no-8b", action="store_true", help="skip the 8B memory measurement")
    p.add_argument("--grpo", action="store_true", help="measure a GRPO step instead (benchmarks/grpo_bench.py)")
    p.add_argument("--out", default="gpu_bench_grpo.json", help="--grpo: where the JSON goes")
    p.add_argument("--prompts", type=int, help="--grpo: prompts per step (default 32; CPU 4)")
    p.add_argument("--group", type=int, help="--grpo: completions per prompt (default 8; CPU 4)")
    p.add_argument("--completion-tokens", type=int, help="--grpo: max_completion_tokens (default 256; CPU 8)")
    p.add_argument("--max-length", type=int, help="--grpo: max_length (default 512; CPU 64)")
    a = p.parse_args(argv)
    if a.grpo:
        warnings.filterwarnings("ignore")
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import grpo_bench

        return grpo_bench.main(a)
    a.steps = a.steps or (2 if a.quick else 8)
    a.warmup = a.warmup if a.warmup is not None else (1 if a.quick else 2)
    a.grpo_steps = a.grpo_steps or (1 if a.quick else 2)

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    import datasets
    from transformers.utils import logging as hf_logging

    from autoslm.engine.train.recipe import torch_dtype_name
    from autoslm.engine.train.tiny import build_tokenizer

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    bench = Bench(a)
    for pkg, what in (
        ("liger_kernel", "Liger kernels"),
        ("vllm", "vLLM generation"),
        ("flash_attn", "flash-attn wheel"),
        ("kernels", "Hub attention kernels"),
    ):
        if pkg not in bench.installed:
            bench.notes.append(f"skipped: {pkg} not installed ({what})")
    if not bench.cuda:
        bench.notes.append(
            "no CUDA: the recipe's GPU paths are off (bf16, flash attention, Liger, vLLM): a smoke test, not a measurement"
        )

    try:
        tokenizer = build_tokenizer()
        # Saved once, in the dtype a real checkpoint has: the worker's load path, TRL's baseline and vLLM read it.
        path = bench.work / "qwen3-0.6b"
        model = random_model(bench, SMALL, tokenizer, torch_dtype_name(bench.spec(SMALL, "sft").train, bench.device), "sdpa")
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        del model
        bench.reset_memory()
        # Plain TRL first: Liger patches transformers' Qwen3 classes for the whole process, so a baseline
        # built after the recipe would run Liger's kernels too.
        run_phase(bench, "sft baseline", 60, phase_sft, tokenizer, path, recipe=False)
        run_phase(bench, "sft recipe", 30, phase_sft, tokenizer, path, recipe=True)
        run_phase(bench, "memory 0.6B", 20, phase_memory, tokenizer, SMALL, path)
        if not a.no_8b:
            run_phase(bench, "memory 8B", 45, phase_memory, tokenizer, LARGE, None)
        run_phase(bench, "grpo transformers", 60, phase_grpo, tokenizer, path, vllm=False)
        if "vllm" in bench.installed:  # last: colocated vLLM keeps its share of the GPU until the process ends
            run_phase(bench, "grpo vllm", 120, phase_grpo, tokenizer, path, vllm=True)
        else:
            bench.results.setdefault("grpo", {})["vllm"] = {"skipped": "vllm not installed"}
    finally:
        shutil.rmtree(bench.work, ignore_errors=True)
    sft_summary(bench)
    bench.results["wall_s"] = round(time.monotonic() - bench.t0, 1)
    report(bench)
    return 1 if bench.errors else 0


if __name__ == "__main__":
    sys.exit(main())
