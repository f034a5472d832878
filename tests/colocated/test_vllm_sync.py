"""Colocated vLLM in this process, built by the worker's own code (``engine.train.grpo.build_trainer``) on
vLLM's CPU build: the weights vLLM generates with are the trainer's (log-probabilities of a fixed
completion agree within bf16 tolerance after training steps, and differ from the base model's), and
TRL's sleep/wake control flow runs. vLLM's CPU platform refuses sleep mode and its CPU worker frees
nothing, so the platform check is patched here, in the test only: the flow is tested, a saving is not.
"""

from __future__ import annotations

import pytest

from autoslm.engine.train.gpu import installed

if not installed("vllm"):
    pytest.skip("vllm is not installed in this stack (make test-vllm runs these in .venv-vllm)", allow_module_level=True)

pytestmark = pytest.mark.vllm


class Events:
    """The worker's reporter, recording what build_trainer reports."""

    def __init__(self):
        self.events = []

    def event(self, kind, step=None, **data):
        self.events.append((kind, data))

    def beat(self, *a, **k):
        pass


def completion_logprobs(model, ids: list[int], start: int) -> list[float]:
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return [float(logp[i - 1, ids[i]]) for i in range(start, len(ids))]


def vllm_logprobs(llm, ids: list[int], start: int) -> list[float]:
    from vllm import SamplingParams

    out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    return [out.prompt_logprobs[i][ids[i]].logprob for i in range(start, len(ids))]


def test_weight_sync_is_real_and_sleep_wake_flow_runs(tmp_path, monkeypatch):
    import torch
    from vllm.platforms.cpu import CpuPlatform

    from autoslm.catalog import model_info
    from autoslm.engine.train import models
    from autoslm.engine.train.grpo import build_trainer
    from autoslm.engine.train.recipe import Device
    from autoslm.envs.task_table import load_environment
    from autoslm.spec import validate_dict

    monkeypatch.setattr(CpuPlatform, "is_sleep_mode_available", classmethod(lambda cls: True))
    # TRL and vLLM set these in this process for their one-process group; the worker runs started later
    # in this session inherit the environment, so they are restored (removed) afterwards.
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # restored afterwards (build_trainer sets it from the spec)
    spec = validate_dict(
        {
            "name": "sync",
            "model": "autoslm/tiny",
            "thinking": False,
            "environment": {"id": "autoslm/arith", "params": {"n_train": 64, "n_eval": 0}},
            "train": {
                "method": "grpo",
                "max_steps": 2,
                "prompts_per_step": 2,
                "group_size": 4,
                "max_completion_tokens": 6,
                "max_length": 64,
                "learning_rate": 1e-2,
                "eval_samples": 0,
                "vllm": {"enabled": True, "sleep_mode": True},
            },
            "artifacts": {"path": str(tmp_path / "store")},
        }
    )
    device = Device.detect()
    path = models.resolve_model_path(spec.model, tmp_path / "home")
    tok = models.load_tokenizer(path, False)
    info = model_info(spec.model)
    model = models.attach_adapter(models.load_model(path, models.load_kwargs(spec, info, device)), spec, info)
    # An adapter a run would continue from: LoRA's B starts at zero (a no-op), so give it weights, large
    # enough that the adapter moves the logprobs far past bf16's rounding (scale 0.4: moved 1.17, the served
    # gap 0.017; at 0.2 the adapter moved them 0.11, and a gap of 0.015 failed the tenfold margin).
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.4)
    events = Events()
    trainer = build_trainer(
        spec,
        model=model,
        tokenizer=tok,
        env=load_environment(spec),
        seed=0,
        output_dir=tmp_path / "out",
        callbacks=[],
        reporter=events,
        device=device,
    )
    generation = dict(events.events)["generation"]
    assert generation["engine"] == "colocated vLLM 0.31.0 (cpu)" and trainer.args.vllm_enable_sleep_mode

    vg = trainer.vllm_generation
    calls = []
    for name in ("sleep", "wake_up"):
        real = getattr(vg.llm, name)
        monkeypatch.setattr(
            vg.llm, name, lambda *a, _real=real, _name=name, **k: (calls.append((_name, k.get("tags"))), _real(*a, **k))[1]
        )
    trainer.train()
    assert trainer.state.global_step == 2
    # TRL's flow per generation: wake the weights, push them, wake the KV cache, generate, sleep again.
    assert ("wake_up", ["weights"]) in calls and ("wake_up", ["kv_cache"]) in calls and ("sleep", None) in calls

    vg.sync_weights()  # the last step's update
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 3 + 4?"}], add_generation_prompt=True, tokenize=True, enable_thinking=False
    )
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    ids = prompt + tok("7", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    trained = completion_logprobs(trainer.model.eval(), ids, len(prompt))
    with trainer.model.disable_adapter():
        base = completion_logprobs(trainer.model, ids, len(prompt))
    vg.llm.wake_up(tags=["kv_cache"])  # TRL put the engine to sleep after its last generation
    served = vllm_logprobs(vg.llm, ids, len(prompt))
    gap = max(abs(a - b) for a, b in zip(served, trained))
    moved = max(abs(a - b) for a, b in zip(base, trained))
    try:
        assert gap < 0.05, (served, trained)  # bf16 tolerance
        assert moved > 10 * gap and moved > 0.1, (base, trained, served)
    finally:
        # Free the engine and its process group (and the rendezvous port it holds) for the runs after it.
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        del trainer, vg
        cleanup_dist_env_and_memory()


def test_50_syncs_leave_the_bf16_base_bit_identical_and_push_the_float32_merge(tmp_path, monkeypatch):
    """The worker's trainer, its model in bf16 (the pod's dtype) with a trained adapter: TRL's sync, run
    through the worker's walk (``engine.train.vllm_sync``) and the CPU build's reload, never writes the
    frozen base (TRL's own merge and unmerge in place would, TRL issue 6688), and what vLLM's
    ``load_weights`` receives is the base plus the LoRA update computed in float32, cast once."""
    import torch

    from autoslm.catalog import model_info
    from autoslm.engine.train import models
    from autoslm.engine.train.grpo import build_trainer
    from autoslm.engine.train.recipe import Device
    from autoslm.envs.task_table import load_environment
    from autoslm.spec import validate_dict

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    spec = validate_dict(
        {
            "name": "base",
            "model": "autoslm/tiny",
            "thinking": False,
            "environment": {"id": "autoslm/arith", "params": {"n_train": 8, "n_eval": 0}},
            "train": {
                "method": "grpo",
                "max_steps": 1,
                "prompts_per_step": 2,
                "group_size": 2,
                "max_completion_tokens": 4,
                "max_length": 64,
                "eval_samples": 0,
                "vllm": {"enabled": True, "sleep_mode": False},
            },
            "artifacts": {"path": str(tmp_path / "store")},
        }
    )
    device = Device.detect()
    path = models.resolve_model_path(spec.model, tmp_path / "home")
    info = model_info(spec.model)
    model = models.load_model(path, dict(models.load_kwargs(spec, info, device), dtype="bfloat16"))
    model = models.attach_adapter(model, spec, info)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.01)
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    assert {str(p.dtype) for p in base.values()} == {"torch.bfloat16"}
    expected = {}
    with torch.no_grad():
        for name, m in model.named_modules():
            if hasattr(m, "lora_A") and "default" in m.lora_A:
                w = m.base_layer.weight
                delta = (m.lora_B["default"].weight.float() @ m.lora_A["default"].weight.float()) * m.scaling["default"]
                expected[name.removeprefix("base_model.model.") + ".weight"] = (w.float() + delta).to(w.dtype)
    trainer = build_trainer(
        spec,
        model=model,
        tokenizer=models.load_tokenizer(path, False),
        env=load_environment(spec),
        seed=0,
        output_dir=tmp_path / "out",
        callbacks=[],
        reporter=Events(),
        device=device,
    )
    vg = trainer.vllm_generation
    vllm_model = vg.llm.llm_engine.model_executor.driver_worker.model_runner.model
    received: dict[str, object] = {}  # the latest sync's tensors, by name
    load = vllm_model.load_weights

    def recording(weights):
        weights = list(weights)
        received.update((n, t.clone()) for n, t in weights)
        return load(weights)  # noqa: F821 - called before the `del load` below

    monkeypatch.setattr(vllm_model, "load_weights", recording)
    try:
        for _ in range(50):
            vg.sync_weights()
        params = dict(trainer.model.named_parameters())
        moved = [n for n, t in base.items() if not torch.equal(t, params[n].detach())]
        assert not moved, f"{len(moved)} base weights changed, e.g. {moved[:3]}"
        assert set(expected) <= set(received)
        for name, want in expected.items():
            # Within bf16 rounding: one fused float32 multiply-add against a separate product and sum.
            torch.testing.assert_close(received[name].float(), want.float(), rtol=2**-7, atol=1e-6, msg=name)
    finally:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        del trainer, vg, vllm_model, load
        cleanup_dist_env_and_memory()
