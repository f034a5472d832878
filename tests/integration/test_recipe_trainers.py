"""Every GPU recipe ``--print-config`` prints builds the real TRL trainer and trains 2 steps.

For every jobspec, and for the catalog's kinds (dense, vision-language, 4-bit) on several GPUs, the
trainer settings come from the functions ``python -m autoslm.engine --print-config SPEC --device cuda
--gpu NAME`` calls (``print_config.pod_device``, ``models.load_kwargs``, the engine's own
``build_trainer``). Only what needs a GPU is changed (``cpu_stand_in``): the device, bf16, Liger, the
attention kernel, vLLM, FSDP. The built-in tiny model stands in for the weights (a tiny Qwen2.5-VL for
the vision-language kind). Each case trains 2 steps and must log a finite loss and move every LoRA
weight. Runs on both stacks (``-m worker``: ``make test`` on the image's pins, ``make test-fast`` on the laptop's), in one process, seconds per case.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from autoslm.catalog import model_info
from autoslm.engine.train import models
from autoslm.engine.train.print_config import build, pod_device
from autoslm.envs.base import Environment, Example
from autoslm.spec import load_spec, validate_dict

pytestmark = pytest.mark.worker

REPO = Path(__file__).resolve().parents[2]
JOBSPECS = sorted((REPO / "jobspecs").glob("*.toml"))
STEPS = 2


def cpu_stand_in(kwargs: dict, multi_turn: bool = False) -> dict:
    """The trainer keywords with only what needs a GPU changed, and 2 steps."""
    out = dict(kwargs)
    out.update(use_cpu=True, bf16=False, fp16=False, use_liger_kernel=False, max_steps=STEPS, save_strategy="no")
    if out.get("use_vllm"):
        out["use_vllm"] = False  # the image stack has no vLLM (its own stack tests it)
    if "num_generations" in out:
        # Not GPU settings, but the stand-in weights are random: they never end a completion, so every
        # one runs to the limit (kept short here: 256 tokens x 256 completions is minutes on a CPU), and
        # masking every truncated one would leave nothing to learn from.
        # (Multi-turn: that switch also drops episodes over their budget, and every one is.)
        out["mask_truncated_completions"] = False
        if not multi_turn:
            out["max_completion_length"] = min(out["max_completion_length"], 8)
        # Multi-turn keeps the spec's budget: the rollout already cuts each model turn to its share
        # (a few tokens), the rest is the environment's turns, which are written, not generated; cut to
        # 8, no second turn would fit and the episodes the test trains would not be multi-turn ones.
    for key in ("fsdp", "fsdp_config"):  # FSDP needs GPUs; one CPU process stands in for the ranks
        out.pop(key, None)
    return out


def cpu_load(load: dict) -> dict:
    out = dict(load, dtype="float32", attn_implementation="sdpa", device_map=None)
    if "quantization_config" in out:  # bitsandbytes runs NF4 on a CPU too
        out["quantization_config"] = dict(out["quantization_config"], bnb_4bit_compute_dtype="float32")
    return out


class Events:
    def __init__(self):
        self.seen: list[tuple[str, dict]] = []

    def event(self, kind, **fields):
        self.seen.append((kind, fields))


class Chats(Environment):
    """Stands in for a Hub chat dataset (``hf:``), which cannot be read offline: several turns each."""

    name = "chats"

    def train_examples(self):
        out = []
        for i in range(48):
            chat = [
                {"role": "user", "content": f"What is {i} + {i}?"},
                {"role": "assistant", "content": str(2 * i)},
                {"role": "user", "content": "And times 3?"},
                {"role": "assistant", "content": str(6 * i) * (1 + i % 40)},
            ]
            out.append(Example(prompt=chat[:1], target=chat[1]["content"], conversation=chat))
        return out


class Shaped(Environment):
    """The spec's environment, its train split cut to what 2 steps use (TRL tokenizes all of it), and
    for GRPO one more reward that varies between random completions (the share of digits), so a tiny
    untrained model gets a non-zero advantage and the LoRA weights must move."""

    def __init__(self, env, n: int):
        self.env, self.name, self.multi_turn, self.max_turns = env, env.name, env.multi_turn, env.max_turns
        self.n = n

    def __getattr__(self, name):
        # What the rollout reads off a multi-turn environment and the base class lacks (the critique
        # task's env_turn_tokens, its episode_metrics): the spec's environment's own.
        return getattr(self.env, name)

    def train_examples(self):
        return self.env.train_examples()[: self.n]

    def eval_examples(self):
        return self.env.eval_examples()

    def tools(self):
        return self.env.tools()

    def step(self, example, messages, state):
        return self.env.step(example, messages, state)

    def reward_functions(self):
        def digits(example, completion: str) -> float:
            return sum(c.isdigit() for c in completion) / max(1, len(completion))

        return [*self.env.reward_functions(), ("digits", digits, 1.0)]


GSM8K_ROWS = [
    {
        "question": f"Tom has {i} apples and buys {i % 5 + 2}. How many now?",  # short: 2 steps of 320
        "answer": f"He has {i} + {i % 5 + 2} = <<{i}+{i % 5 + 2}={i + i % 5 + 2}>>{i + i % 5 + 2} apples.\n#### {i + i % 5 + 2}",
    }
    for i in range(220)
]


def gsm8k_sample(spec, tmp_path: Path):
    """The spec with its Hub dataset replaced by a local GSM8K-shaped sample (question, worked answer
    ending in "#### N"), read with the spec's own columns, prompt template and answer format."""
    import json

    data = tmp_path / "gsm8k-sample.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in GSM8K_ROWS))
    params = {k: v for k, v in spec.environment.params.items() if k in ("columns", "prompt_template", "max_rows")}
    raw = json.loads(spec.to_json())
    raw["environment"] = {**raw["environment"], "id": f"jsonl:{data}", "params": {**params, "eval_fraction": 0.1}}
    return validate_dict(raw)


def _spec(model: str, method: str, gpu: str, **train):
    raw = {
        "name": "kinds",
        "model": model,
        "environment": {"id": "autoslm/arith", "params": {"n_train": 64, "n_eval": 4}},
        "train": {"method": method, "max_steps": 10, "max_length": 1024, **train},
        "compute": {"provider": "runpod", "gpu": gpu},
        "artifacts": {"store": "hf", "repo": "someone/runs"},
    }
    return validate_dict(raw)


KINDS = {
    "dense-sft-rtx4090": lambda: _spec("Qwen/Qwen3-1.7B", "sft", "RTX 4090", batch_size=32),
    "dense-sft-h100": lambda: _spec("Qwen/Qwen3-8B", "sft", "H100 80GB", batch_size=16, packing=True),
    "dense-grpo-h100": lambda: _spec(
        "Qwen/Qwen3-8B", "grpo", "H100 80GB", prompts_per_step=8, group_size=4, max_completion_tokens=16
    ),
    "dense-grpo-l4": lambda: _spec("Qwen/Qwen3-1.7B", "grpo", "L4", prompts_per_step=4, group_size=4, max_completion_tokens=16),
    "vl-sft-l40s": lambda: _spec("Qwen/Qwen2.5-VL-3B-Instruct", "sft", "L40S", batch_size=16),
    "vl-grpo-h100": lambda: _spec(
        "Qwen/Qwen2.5-VL-7B-Instruct", "grpo", "H100 80GB", prompts_per_step=4, group_size=4, max_completion_tokens=16
    ),
    "4bit-sft-rtx4090": lambda: _spec("Qwen/Qwen3-14B", "sft", "RTX 4090", batch_size=16),
    "4bit-grpo-a100": lambda: _spec(
        "Qwen/Qwen3-32B", "grpo", "A100 80GB SXM", prompts_per_step=4, group_size=4, max_completion_tokens=16
    ),
}
# A shipped jobspec that runs another's recipe on a bigger model of the same family: its trainer is the
# other's (test_a_jobspec_that_shares_a_recipe_builds_the_same_trainer says so), trained once, there.
SAME_RECIPE = {"qwen2.5-1.5b-gsm8k-grpo-gpu.toml": "qwen2.5-0.5b-gsm8k-grpo-gpu.toml"}
CASES = [pytest.param(lambda p=p: load_spec(p), id=p.name) for p in JOBSPECS if p.name not in SAME_RECIPE] + [
    pytest.param(make, id=name) for name, make in KINDS.items()
]


@pytest.mark.parametrize("name, twin", SAME_RECIPE.items())
def test_a_jobspec_that_shares_a_recipe_builds_the_same_trainer(name, twin):
    spec, other = load_spec(REPO / "jobspecs" / name), load_spec(REPO / "jobspecs" / twin)
    mine_m, their_m = model_info(spec.model), model_info(other.model)
    assert (mine_m.model_type, mine_m.tied, mine_m.vision, mine_m.quant) == (
        their_m.model_type,
        their_m.tied,
        their_m.vision,
        their_m.quant,
    )
    for section in ("train", "environment", "eval"):
        assert getattr(spec, section) == getattr(other, section), section
    mine, theirs = build(spec, device_kind="cuda")["trainer"], build(other, device_kind="cuda")["trainer"]
    sized = {"vllm_gpu_memory_utilization"}  # vLLM's share, sized to the model; nothing the CPU stand-in trains with
    assert {k: v for k, v in mine.items() if k not in sized} == {k: v for k, v in theirs.items() if k not in sized}


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """The tiny model's directory (text), and a tiny Qwen2.5-VL built beside it (vision-language)."""
    from autoslm.engine.train.tiny import ensure_tiny

    root = Path(os.environ.get("AUTOSLM_TEST_MODELS") or tmp_path_factory.getbasetemp().parent / "autoslm-models")
    text = ensure_tiny(root)
    return {"text": text, "vision": _tiny_vl(text, tmp_path_factory.mktemp("vl"))}


def _tiny_vl(text: Path, out: Path) -> Path:
    from transformers import AutoTokenizer, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(text)
    n = len(tok)  # image/video ids past the tokenizer's range: text never holds one
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=n + 4,
            hidden_size=64,
            intermediate_size=192,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
            bos_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        ),
        vision_config=dict(
            depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, fullatt_block_indexes=[0]
        ),
        image_token_id=n,
        video_token_id=n + 1,
        vision_start_token_id=n + 2,
        vision_end_token_id=n + 3,
    )
    Qwen2_5_VLForConditionalGeneration(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _lora(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.pod  # a GPU recipe trains only on a pod: on the image's pins
@pytest.mark.parametrize("make", CASES)
def test_gpu_recipe_builds_and_trains(make, weights, tmp_path):
    import torch
    from transformers import set_seed

    from autoslm.envs.task_table import load_environment

    spec = make()
    info = model_info(spec.model)
    device = pod_device(spec, "cuda")
    printed = build(spec, device_kind="cuda")  # what --print-config shows for this GPU
    load = models.load_kwargs(spec, info, device)
    assert printed["model"]["attn_implementation"] == load["attn_implementation"]
    if "quantization_config" in load:
        pytest.importorskip("bitsandbytes", reason="the 4-bit tier needs bitsandbytes: the image stack (-m worker) has it")
    path = weights["vision" if info is not None and info.vision else "text"]
    tokenizer = models.load_tokenizer(str(path), False)
    set_seed(0)
    model = models.attach_adapter(models.load_model(str(path), cpu_load(load)), spec, info)
    if spec.environment.id.startswith("hf:"):  # a Hub dataset cannot be read offline: a local stand-in
        env = load_environment(gsm8k_sample(spec, tmp_path)) if spec.train.method == "grpo" else Chats()
    else:
        env = load_environment(spec)
    per_step = spec.train.prompts_per_step if spec.train.method == "grpo" else spec.train.batch_size
    env = Shaped(env, (STEPS + 1) * per_step)
    if spec.train.method == "grpo":
        from autoslm.engine.train.grpo import build_trainer

        seen = {}

        def adjust(kwargs):
            seen.update(kwargs)
            return cpu_stand_in(kwargs, multi_turn=env.multi_turn)

        trainer = build_trainer(
            spec,
            model=model,
            tokenizer=tokenizer,
            env=env,
            seed=0,
            output_dir=tmp_path / "out",
            callbacks=[],
            reporter=Events(),
            device=device,
            adjust=adjust,
        )
    else:
        from autoslm.engine.train.sft import build_trainer

        seen = {}

        def adjust(kwargs):
            seen.update(kwargs)
            return cpu_stand_in(kwargs)

        trainer = build_trainer(
            spec,
            model=model,
            tokenizer=tokenizer,
            env=env,
            seed=0,
            output_dir=tmp_path / "out",
            callbacks=[],
            reporter=Events(),
            device=device,
            attn=load["attn_implementation"],
            adjust=adjust,
        )
    # What was trained is what --print-config printed (before the CPU stand-in changed the GPU parts).
    for key in (
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "padding_free",
        "packing",
        "use_vllm",
        "bf16",
        "use_liger_kernel",
        "max_length",
        "vllm_enable_sleep_mode",
        "gradient_checkpointing",
        "activation_checkpointing",
    ):
        if key in seen:
            assert printed["trainer"].get(key) == seen[key], (key, printed["trainer"].get(key), seen[key])
    before = _lora(trainer.model)
    assert before, "no trainable parameters"
    # LoRA state in fp32 in every tier (TRL casts a 4-bit model's adapter to bf16, where small updates vanish).
    assert {str(p.dtype) for p in before.values()} == {"torch.float32"}
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert trainer.state.global_step == STEPS and losses and all(math.isfinite(x) for x in losses), trainer.state.log_history
    after = dict(trainer.model.named_parameters())
    moved = {n for n, p in before.items() if not torch.equal(p, after[n].detach())}
    # Every adapted module moved (lora_B starts at zero, so after a warm-up step only B may have moved yet).
    still = sorted(
        {n.replace("lora_A", "lora_?").replace("lora_B", "lora_?") for n in before}
        - {n.replace("lora_A", "lora_?").replace("lora_B", "lora_?") for n in moved}
    )
    assert not still, f"{len(still)} LoRA modules did not move, e.g. {still[:3]}"


class Long(Environment):
    """Short prompts, answers of 10 to 200 tokens: many rows are longer than max_length."""

    name = "long"

    def train_examples(self):
        return [
            Example(
                prompt=[{"role": "user", "content": f"Count from {i}."}],
                answer="",
                target=" ".join(str(i + k) for k in range(5 + 4 * i)),
            )
            for i in range(24)
        ]


def test_padding_free_rows_are_cut_to_max_length(weights, tmp_path):
    from autoslm.engine.train.sft import build_trainer

    spec = _spec("Qwen/Qwen3-0.6B", "sft", "RTX 4090", batch_size=8, max_length=64)
    device = pod_device(spec, "cuda")
    load = models.load_kwargs(spec, model_info(spec.model), device)
    tokenizer = models.load_tokenizer(str(weights["text"]), False)
    model = models.attach_adapter(models.load_model(str(weights["text"]), cpu_load(load)), spec, model_info(spec.model))
    trainer = build_trainer(
        spec,
        model=model,
        tokenizer=tokenizer,
        env=Long(),
        seed=0,
        output_dir=tmp_path / "out",
        callbacks=[],
        reporter=Events(),
        device=device,
        attn=load["attn_implementation"],
        adjust=cpu_stand_in,
    )
    assert trainer.args.padding_free is True and trainer.args.max_length is None
    lengths = [len(ids) for ids in trainer.train_dataset["input_ids"]]
    assert max(lengths) == 64 and len(lengths) == 24  # long rows cut, none left without an answer token
    assert all(any(t != -100 for t in labels) for labels in trainer.train_dataset["labels"])
    trainer.train()
    assert trainer.state.global_step == STEPS


def test_the_gsm8k_jobspec_builds_as_verl_scores(weights, tmp_path):
    """verl's GRPO-LoRA baseline (jobspecs/qwen2.5-0.5b-gsm8k-grpo-gpu.toml): the trainer its GPU recipe
    (an L40S) builds scores a GSM8K-shaped local sample strictly after "####", with verl's prompt, 5
    completions a prompt and the KL coefficient. (test_gpu_recipe_builds_and_trains trains it 2 steps.)"""
    from autoslm.engine.train.grpo import build_trainer
    from autoslm.envs.task_table import load_environment

    spec = load_spec(REPO / "jobspecs" / "qwen2.5-0.5b-gsm8k-grpo-gpu.toml")
    assert spec.environment.answer_format == "gsm8k" and spec.train.lora_rank == 32 and spec.environment.id == "hf:openai/gsm8k"
    info = model_info(spec.model)
    device = pod_device(spec, "cuda")
    printed = build(spec, device_kind="cuda")
    assert printed["trainer"]["num_generations"] == 5 and printed["trainer"]["beta"] == 0.001
    assert printed["trainer"]["use_vllm"] is True and printed["trainer"]["loss_type"] == "dapo"
    local = gsm8k_sample(spec, tmp_path)
    env = load_environment(local)
    ex = env.train_examples()[0]
    assert ex.prompt[-1]["content"].endswith('Let\'s think step by step and output the final answer after "####".')
    assert env.reward(ex, "so 0 + 2 = 2\n#### 2") == 1.0 and env.reward(ex, "The answer is 2.") == 0.0
    load = models.load_kwargs(spec, info, device)
    tokenizer = models.load_tokenizer(str(weights["text"]), False)
    model = models.attach_adapter(models.load_model(str(weights["text"]), cpu_load(load)), spec, info)
    trainer = build_trainer(
        local,
        model=model,
        tokenizer=tokenizer,
        env=env,
        seed=0,
        output_dir=tmp_path / "out",
        callbacks=[],
        reporter=Events(),
        device=device,
        adjust=cpu_stand_in,
    )
    assert trainer.args.num_generations == 5 and trainer.reward_func_names == ["correct"]
    assert model.peft_config["default"].r == 32
    # The published run's schedule (its log: 116 steps, one epoch of the 7473 problems at 64 a step), lr
    # 3e-5 constant, weight decay 0.01, gradient clipping 1.0.
    t = spec.train
    assert t.prompts_per_step == 64 and t.max_steps == 7473 // 64  # verl's loader drops the last partial batch
    assert (trainer.args.learning_rate, str(trainer.args.lr_scheduler_type.value)) == (3e-5, "constant")
    assert trainer.args.weight_decay == 0.01 and trainer.args.max_grad_norm == 1.0
    completions = [[{"role": "assistant", "content": c}] for c in ("0 + 2 = 2\n#### 2", "#### 3", "2")]
    assert trainer.reward_funcs[0]([ex.prompt] * 3, completions, answer=[ex.answer] * 3, info=["{}"] * 3) == [1.0, 0.0, 0.0]
