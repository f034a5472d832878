"""How much of a GRPO step is generation? Colocated vLLM (its CPU build) against transformers
generation, same JobSpec, same process, on this CPU.

    .venv-vllm/bin/python benchmarks/bench_vllm_generation.py [--steps 6] [--completion-tokens 32]

Builds the worker's own GRPO trainer (``engine.train.grpo.build_trainer``) for the built-in tiny model twice,
once with ``train.vllm.enabled = false`` and once with ``true``, trains ``--steps`` steps with each and
prints the median step time of each (the first step, which warms up, is left out) and the ratio
transformers/vLLM: above 1.0 means vLLM makes the step faster. Needs .venv-vllm (make setup-vllm).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoslm.spec import validate_dict  # noqa: E402 - after the path fix above


class Quiet:
    def event(self, *a, **k):
        pass

    def beat(self, *a, **k):
        pass


def step_times(enabled: bool, steps: int, tokens: int, work: Path) -> list[float]:
    from transformers import TrainerCallback

    from autoslm.catalog import model_info
    from autoslm.engine.train import models
    from autoslm.engine.train.grpo import build_trainer
    from autoslm.engine.train.recipe import Device
    from autoslm.envs.task_table import load_environment

    spec = validate_dict(
        {
            "name": "bench",
            "model": "autoslm/tiny",
            "thinking": False,
            "environment": {"id": "autoslm/arith", "params": {"n_train": 512, "n_eval": 0}},
            "train": {
                "method": "grpo",
                "max_steps": steps,
                "prompts_per_step": 8,
                "group_size": 8,
                "max_completion_tokens": tokens,
                "max_length": 64 + tokens,
                "eval_samples": 0,
                "save_every": 1000,
                "vllm": {"enabled": enabled},
            },
            "artifacts": {"path": str(work / "store")},
        }
    )
    device = Device.detect()
    path = models.resolve_model_path(spec.model, work / "home")
    tok = models.load_tokenizer(path, False)
    info = model_info(spec.model)
    model = models.attach_adapter(models.load_model(path, models.load_kwargs(spec, info, device)), spec, info)
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t)

    trainer = build_trainer(
        spec,
        model=model,
        tokenizer=tok,
        env=load_environment(spec),
        seed=0,
        output_dir=work / f"out-{enabled}",
        callbacks=[Clock()],
        reporter=Quiet(),
        device=device,
    )
    assert bool(trainer.args.use_vllm) is enabled
    trainer.train()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--completion-tokens", type=int, default=32)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as d:
        hf = step_times(False, args.steps, args.completion_tokens, Path(d))
        vl = step_times(True, args.steps, args.completion_tokens, Path(d))
    t_hf, t_vl = statistics.median(hf[1:]), statistics.median(vl[1:])
    print(
        f"GRPO step, tiny model, 8 prompts x 8 completions x {args.completion_tokens} tokens, {args.steps} steps (first left out)"
    )
    print(f"  transformers generation: {t_hf:.2f} s/step")
    print(f"  colocated vLLM (cpu):    {t_vl:.2f} s/step")
    print(f"  ratio transformers/vLLM: {t_hf / t_vl:.2f}")


if __name__ == "__main__":
    main()
