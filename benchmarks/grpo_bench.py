"""python benchmarks/gpu_bench.py --grpo [--out FILE]   # on a GPU: Qwen3-0.6B's shape; on a CPU: the built-in model

A GRPO step, measured, beside what `autoslm plan` estimated for it and beside plain TRL's defaults for the
same model and batch. Per timed step: generation time, weight-sync time (TRL pushes the policy into
colocated vLLM before generating), scoring time (rewards and log-probs), training time, decode waves,
peak GPU memory and tokens/s. Writes the numbers as JSON (``--out``) and prints a short table.

The two runs, same model, same prompts, same prompts x completions per step, same completion length:

- "autoslm": the worker's own trainer (``engine.train.grpo.build_trainer``) with the recipe the pod would
  run on this device: the planner's micro-batch, vLLM share (``catalog.fit_report``) and generation batch.
- "trl-defaults": ``GRPOTrainer`` with ``GRPOConfig``'s defaults for everything but the batch shape
  (micro-batch 8, accumulated to the same step), LoRA of the same rank, and, where vLLM is installed on a
  GPU, colocated vLLM at TRL's default share (``vllm_gpu_memory_utilization`` 0.3).

Waves: with transformers' generate(), the generation calls a step takes (autoslm splits the generation batch
where generate()'s KV cache would not fit); with vLLM, a process's rollouts at full length over the KV cache
vLLM allocated (``cache_config.num_gpu_blocks x block_size`` tokens). A random model never samples EOS, so
every completion runs to ``max_completion_tokens``: the planner's worst case.

Compare with plan: the "plan" row is ``catalog.fit_report`` and ``catalog.step_seconds`` for this GPU (the
numbers `autoslm plan` and ``python -m autoslm.engine --print-config --gpu NAME`` print for the same spec):
its waves against the measured ones, its step time against the measured s/step, its peak against the
measured peak (torch's allocator; vLLM's share is allocated through it too). On a CPU there is no plan row.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

# Qwen3-0.6B's config.json shape (random weights: nothing is downloaded).
QWEN3_06B = dict(
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    tie_word_embeddings=True,
    vocab_size=151936,
)


class Quiet:
    """The worker's reporter, silenced: the table at the end is the output."""

    def event(self, *a, **k):
        pass

    def beat(self, *a, **k):
        pass


def bench_spec(model: str, args, *, vllm: bool):
    from autoslm.spec import validate_dict

    return validate_dict(
        {
            "name": "grpo-bench",
            "model": model,
            "thinking": False,
            "environment": {"id": "autoslm/arith", "params": {"n_train": max(256, args.prompts * (args.steps + 2)), "n_eval": 0}},
            "train": {
                "method": "grpo",
                "max_steps": args.steps,
                "prompts_per_step": args.prompts,
                "group_size": args.group,
                "max_completion_tokens": args.completion_tokens,
                "max_length": args.max_length,
                "eval_samples": 0,
                "save_every": 10**6,
                "learning_rate": 1e-5,
                "beta": 0.0,
                "lora_rank": 16,
                "lora_alpha": 32,
                "mask_truncated_completions": False,
                "vllm": {"enabled": "auto" if vllm else False},
            },
            "artifacts": {"path": str(Path(args.work) / "store")},
        }
    )


def model_path(cuda: bool, args) -> tuple[str, str]:
    """(what the spec names, a local checkpoint path): the built-in model on a CPU; on a GPU Qwen3-0.6B's
    shape with random weights, saved once (vLLM and both trainers read it)."""
    from autoslm.engine.train import models

    if not cuda:
        return "autoslm/tiny", models.resolve_model_path("autoslm/tiny", Path(args.work) / "home")
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from autoslm.engine.train.tiny import build_tokenizer

    path = Path(args.work) / "qwen3-0.6b-shape"
    tok = build_tokenizer()
    config = Qwen3Config(
        **QWEN3_06B,
        max_position_embeddings=40960,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    # Built on the CPU: this process must hold no CUDA memory while the runs' processes measure theirs.
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    del model
    return "Qwen/Qwen3-0.6B", str(path)


class Probe:
    """Times the parts of every optimizer step by wrapping the trainer's own methods (TRL 1.16 names)."""

    def __init__(self, trainer, torch, cuda: bool, completions: int, processes: int = 1):
        self.trainer, self.torch, self.cuda, self.completions = trainer, torch, cuda, completions
        self.steps: list[dict] = []
        self.cur: dict = {}
        self.running: set[str] = set()  # the wrapped methods now running (by key)
        self.scoring = False
        self._wrap(trainer, "_generate_and_score_completions", "gen_score_s", count="rounds")
        self._wrap(trainer, "_generate", "generate_s")
        vg = getattr(trainer, "vllm_generation", None)
        if vg is not None and hasattr(vg, "sync_weights"):
            self._wrap(vg, "sync_weights", "sync_s")
        self.kv_tokens = vllm_kv_tokens(trainer)
        self.per_process = completions // max(1, processes)

    def wrap_scoring(self):
        """Time scoring's parts too: the log-prob passes made while scoring (the reference model's for
        beta > 0, the old policy's where TRL needs it; the update's own pass is not counted) and the rewards."""
        self.scoring = True
        self._wrap(self.trainer, "_get_per_token_logps_and_entropies", "logps_s", inside="gen_score_s")
        self._wrap(self.trainer, "_calculate_rewards", "reward_s")

    def _wrap(self, obj, name: str, key: str, count: str | None = None, inside: str | None = None):
        """Add the time ``obj.name`` takes to ``cur[key]`` (only while ``inside``'s method runs, if given)."""
        original = getattr(obj, name, None)
        if original is None:
            return

        def timed(*a, **k):
            if inside and inside not in self.running:
                return original(*a, **k)
            t = time.perf_counter()
            self.running.add(key)
            try:
                return original(*a, **k)
            finally:
                self.running.discard(key)
                self.cur[key] = self.cur.get(key, 0.0) + time.perf_counter() - t
                if count:
                    self.cur[count] = self.cur.get(count, 0) + 1

        setattr(obj, name, timed)

    def callback(self):
        from transformers import TrainerCallback

        probe = self

        class StepProbe(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                probe.sync()
                if probe.cuda:
                    probe.torch.cuda.reset_peak_memory_stats()
                probe.cur = {"t0": time.perf_counter()}

            def on_step_end(self, args, state, control, **kw):
                probe.sync()
                c = probe.cur
                step = time.perf_counter() - c.pop("t0")
                gen_score, generate, sync = c.get("gen_score_s", 0.0), c.get("generate_s", 0.0), c.get("sync_s", 0.0)
                probe.steps.append(
                    {
                        "step": state.global_step,
                        "step_s": step,
                        "generation_s": max(0.0, generate - sync),
                        "sync_s": sync,
                        "score_s": max(0.0, gen_score - generate),
                        "train_s": max(0.0, step - gen_score),
                        "rounds": c.get("rounds", 0),
                        "peak_gib": probe.torch.cuda.max_memory_allocated() / 2**30 if probe.cuda else None,
                    }
                )
                if probe.scoring:  # scoring = log-probs + rewards + the rest (decoding text, advantages)
                    logps, rewards = c.get("logps_s", 0.0), c.get("reward_s", 0.0)
                    probe.steps[-1].update(
                        {
                            "logps_s": logps,
                            "reward_s": rewards,
                            "other_s": max(0.0, probe.steps[-1]["score_s"] - logps),
                            "update_s": probe.steps[-1]["train_s"],
                        }
                    )

            def on_log(self, args, state, control, logs=None, **kw):
                if logs and probe.steps and "completions/mean_length" in logs:
                    probe.steps[-1]["completion_tokens"] = logs["completions/mean_length"] * probe.completions

        return StepProbe()

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def waves(self, step: dict, max_length: int) -> int | None:
        if self.kv_tokens:  # vLLM: a process's rollouts at full length over its KV cache
            return max(1, math.ceil(self.per_process * max_length / self.kv_tokens))
        if getattr(self.trainer.args, "use_vllm", False):
            return None  # vLLM that does not say its KV cache size: unknown, not "1"
        return max(1, step["rounds"])


def vllm_kv_tokens(trainer) -> int | None:
    """Tokens colocated vLLM's KV cache holds (None without vLLM, or where this vLLM does not say)."""
    try:
        cache = trainer.vllm_generation.llm.llm_engine.vllm_config.cache_config
        return int(cache.num_gpu_blocks) * int(cache.block_size)
    except Exception:  # noqa: BLE001 - a CPU run, transformers generation, or another vLLM layout
        return None


def run(name: str, args, cuda: bool, model_id: str, path: str) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from autoslm.catalog import model_info
    from autoslm.engine.rollout.rewards import build_reward_set
    from autoslm.engine.train import models
    from autoslm.engine.train.gpu import installed, lora_config_kwargs
    from autoslm.engine.train.grpo import build_trainer
    from autoslm.engine.train.recipe import Device
    from autoslm.envs.task_table import load_environment

    vllm = cuda and installed("vllm")
    spec = bench_spec(model_id, args, vllm=vllm)
    device = Device.detect()
    info = model_info(model_id)
    tok = models.load_tokenizer(path, False)
    env = load_environment(spec)
    per_step = args.prompts * args.group
    out_dir = Path(args.work) / name
    if name == "autoslm":
        # The spec names the catalog model (the planner sizes it); the weights are the saved checkpoint.
        model = models.attach_adapter(models.load_model(path, models.load_kwargs(spec, info, device)), spec, info)
        trainer = build_trainer(
            spec,
            model=model,
            tokenizer=tok,
            env=env,
            seed=0,
            output_dir=out_dir,
            callbacks=[],
            reporter=Quiet(),
            device=device,
            adjust=lambda kw: {**kw, "logging_steps": 1, "save_strategy": "no", "report_to": "none"},
        )
    else:
        micro = min(8, per_step)  # TrainingArguments' default per_device_train_batch_size
        kw = dict(
            output_dir=str(out_dir),
            max_steps=args.steps,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=max(1, per_step // micro),
            num_generations=args.group,
            max_completion_length=args.completion_tokens,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            seed=0,
            mask_truncated_completions=False,
            beta=0.0,
        )
        if vllm:
            kw.update(use_vllm=True, vllm_mode="colocate", vllm_max_model_length=args.max_length)  # TRL's default share
        if not cuda:
            kw.update(use_cpu=True, bf16=False)
        rewards = build_reward_set(env, thinking=False)
        rng = random.Random(0)
        rows = [{"prompt": ex.prompt} for ex in env.train_examples()]
        rng.shuffle(rows)
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(path),
            reward_funcs=rewards.funcs,
            args=GRPOConfig(**kw, **rewards.grpo_config_kwargs()),
            train_dataset=Dataset.from_list(rows),
            processing_class=tok,
            peft_config=LoraConfig(**lora_config_kwargs(spec, info)),
        )
    probe = Probe(trainer, torch, cuda, per_step)
    trainer.add_callback(probe.callback())
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    t = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t
    timed = probe.steps[1:] if len(probe.steps) > 1 else probe.steps  # the first step warms up
    med = {k: statistics.median(s[k] for s in timed) for k in ("step_s", "generation_s", "sync_s", "score_s", "train_s")}
    tokens = [s["completion_tokens"] / s["step_s"] for s in timed if s.get("completion_tokens")]
    peaks = [s["peak_gib"] for s in probe.steps if s["peak_gib"] is not None]
    result = {
        **{k: round(v, 3) for k, v in med.items()},
        "waves": probe.waves(timed[-1], args.max_length) if timed else None,
        "generation_calls": timed[-1]["rounds"] if timed else None,
        "vllm_kv_tokens": probe.kv_tokens,
        "peak_gib": round(max(peaks), 2) if peaks else None,
        "completion_tokens_per_s": round(statistics.median(tokens), 1) if tokens else None,
        "engine": "vllm" if getattr(trainer.args, "use_vllm", False) else "transformers",
        "vllm_gpu_memory_utilization": getattr(trainer.args, "vllm_gpu_memory_utilization", None)
        if trainer.args.use_vllm
        else None,
        "micro_batch": trainer.args.per_device_train_batch_size,
        "steps_per_generation": trainer.args.steps_per_generation,
        "wall_s": round(wall, 1),
        "steps": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in s.items()} for s in probe.steps],
    }
    del trainer
    if cuda:
        torch.cuda.empty_cache()
    return result


def planned(args, cuda: bool, model_id: str) -> dict | None:
    """What `autoslm plan` / --print-config estimate for this spec on this GPU (None on a CPU or an unknown card)."""
    if not cuda:
        return None
    import torch

    from autoslm import catalog
    from autoslm.engine.train.gpu import installed

    g = catalog.gpu_info(torch.cuda.get_device_name(0))
    if g is None:
        return None
    spec = bench_spec(model_id, args, vllm=installed("vllm"))
    fit = catalog.fit_report(model_id, g, spec.train, has_vllm=installed("vllm"))
    step = catalog.step_seconds(model_id, g, spec.train, waves=max(1, fit.waves), has_vllm=fit.engine == "vllm")
    return {
        "gpu": g.name,
        "step_s": round(step, 2) if step else None,
        "waves": fit.waves,
        "peak_gib": round(fit.need_gb or 0, 2),
        "micro_batch": fit.micro,
        "vllm_gpu_memory_utilization": fit.vllm_util,
        "engine": fit.engine,
        "generation_batch": fit.generation_batch,
        "fits": fit.ok,
    }


def table(result: dict) -> str:
    head = f"{'run':13} {'engine':12} {'s/step':>7} {'gen s':>7} {'sync s':>7} {'score s':>7} {'train s':>7} {'waves':>5} {'peak GiB':>8} {'tok/s':>8} {'micro':>5}"
    lines = [
        f"GRPO {result['model']} on {result['device']}: {result['prompts']} prompts x {result['group']} completions x "
        f"{result['completion_tokens']} tokens (max_length {result['max_length']}), {result['steps']} steps, first left out",
        head,
        "-" * len(head),
    ]

    def fmt(x, f=".2f"):
        return "-" if x is None else format(x, f) if isinstance(x, float) else str(x)

    for name in ("autoslm", "trl-defaults"):
        r = result["runs"].get(name)
        if r is None or "error" in r:
            lines.append(f"{name:13} failed: {(r or {}).get('error', 'not run')}")
            continue
        lines.append(
            f"{name:13} {r['engine']:12} {fmt(r['step_s']):>7} {fmt(r['generation_s']):>7} {fmt(r['sync_s']):>7} "
            f"{fmt(r['score_s']):>7} {fmt(r['train_s']):>7} {fmt(r['waves']):>5} {fmt(r['peak_gib']):>8} "
            f"{fmt(r['completion_tokens_per_s'], '.1f'):>8} {r['micro_batch']:>5}"
        )
    p = result.get("plan")
    if p:
        lines.append(
            f"{'plan':13} {p['engine']:12} {fmt(p['step_s']):>7} {'':>7} {'':>7} {'':>7} {'':>7} {fmt(p['waves']):>5} "
            f"{fmt(p['peak_gib']):>8} {'':>8} {fmt(p['micro_batch']):>5}"
        )
    else:
        lines.append("plan: - (no CUDA device in the catalog: the planner sizes GPUs only)")
    ratio = result.get("autoslm_over_trl")
    if ratio:
        lines.append(f"trl-defaults s/step / autoslm s/step: {ratio:.2f}x")
    return "\n".join(lines)


def _child(name: str, args, cuda: bool, model_id: str, path: str, out: str) -> None:
    """One run in a process of its own (colocated vLLM keeps its share of the GPU until its process ends)."""
    import warnings

    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    result = {"run": run(name, args, cuda, model_id, path)}
    if cuda:
        import torch

        result["device"] = torch.cuda.get_device_name(0)
        result["plan"] = planned(args, cuda, model_id)
    Path(out).write_text(json.dumps(result))


def main(args) -> int:
    """``gpu_bench.py --grpo``: both runs (each in its own process), the plan row, the JSON file and the
    table. 1 if a run failed."""
    import multiprocessing
    import tempfile

    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cuda = args.device != "cpu" and torch.cuda.is_available()
    if args.device == "cuda" and not cuda:
        sys.exit("gpu_bench --grpo: --device cuda but torch sees no CUDA device")
    args.prompts = args.prompts or (32 if cuda else 4)
    args.group = args.group or (8 if cuda else 4)
    args.completion_tokens = args.completion_tokens or (256 if cuda else 8)
    args.max_length = args.max_length or (512 if cuda else 64)
    args.steps = max(2, args.grpo_steps or 3)
    failed = 0
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="grpo_bench-") as work:
        args.work = work
        model_id, path = model_path(cuda, args)
        result = {
            "model": model_id,
            "device": "cpu",
            "prompts": args.prompts,
            "group": args.group,
            "completion_tokens": args.completion_tokens,
            "max_length": args.max_length,
            "steps": args.steps,
            "runs": {},
            "plan": None,
        }
        for name in ("trl-defaults", "autoslm"):
            print(f"[gpu_bench --grpo] {name} ...", flush=True)
            out = Path(work) / f"{name}.json"
            proc = ctx.Process(target=_child, args=(name, args, cuda, model_id, path, str(out)))
            proc.start()
            proc.join()
            if proc.exitcode != 0 or not out.exists():  # its traceback is on stderr
                failed += 1
                result["runs"][name] = {"error": f"the run's process exited with {proc.exitcode}"}
                continue
            child = json.loads(out.read_text())
            result["runs"][name] = child["run"]
            result["device"] = child.get("device", result["device"])
            result["plan"] = child.get("plan") or result["plan"]
    a, b = result["runs"].get("autoslm", {}), result["runs"].get("trl-defaults", {})
    if a.get("step_s") and b.get("step_s"):
        result["autoslm_over_trl"] = round(b["step_s"] / a["step_s"], 2)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(f"wrote {args.out}")
    return 1 if failed else 0
