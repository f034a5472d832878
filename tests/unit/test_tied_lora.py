"""LoRA on the head or the input embedding of a model that ties them never reaches colocated vLLM:
``named_parameters()`` yields the tied matrix once, under the embedding's name, so the pushed weights are
not peft's merge. ``validate`` (and so ``plan`` and ``launch``) refuses such targets in one line where the
catalog knows the model ties them and vLLM may generate; the worker refuses them on the model it loaded.
Runs on both stacks (``-m worker``: ``make test`` on the image's pins, ``make test-fast`` on the laptop's).
"""

from __future__ import annotations

import pytest

from autoslm.spec import validate_dict

pytestmark = pytest.mark.worker

SPEC = """name = "tied"
model = "{model}"
[environment]
id = "autoslm/arith"
[train]
method = "{method}"
max_steps = 5
lora_targets = {targets}
{extra}
[compute]
provider = "runpod"
gpu = "H100 80GB"
[artifacts]
store = "hf"
repo = "someone/runs"
"""


def _write(tmp_path, model="Qwen/Qwen3-0.6B", method="grpo", targets='["q_proj", "lm_head"]', extra=""):
    path = tmp_path / "spec.toml"
    path.write_text(SPEC.format(model=model, method=method, targets=targets, extra=extra))
    return str(path)


@pytest.mark.parametrize(
    "targets,named",
    [
        ('["q_proj", "lm_head"]', "lm_head"),
        ('["embed_tokens", "v_proj"]', "embed_tokens"),
        ('"(.*\\\\.)?(q_proj|lm_head)"', "(.*\\.)?(q_proj|lm_head)"),
    ],
)
def test_validate_refuses_lora_on_a_tied_head_when_vllm_generates_in_one_line(cli, tmp_path, targets, named):
    r = cli("validate", _write(tmp_path, targets=targets))
    assert r.code == 2, r.out + r.err
    lines = [ln for ln in r.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.err, r.err
    line = lines[0]
    assert "train.lora_targets" in line and named in line and "Qwen/Qwen3-0.6B" in line
    assert "train.vllm.enabled = false" in line and "drop" in line


@pytest.mark.parametrize(
    "model,method,targets,extra",
    [
        ("Qwen/Qwen3-0.6B", "grpo", '["q_proj", "lm_head"]', "[train.vllm]\nenabled = false"),  # transformers generates
        ("Qwen/Qwen3-8B", "grpo", '["q_proj", "lm_head"]', ""),  # its head is its own matrix
        ("Qwen/Qwen3-0.6B", "sft", '["q_proj", "lm_head"]', ""),  # no vLLM in SFT
        ("Qwen/Qwen3-0.6B", "grpo", '"all-linear"', ""),  # peft leaves the head out
        ("Qwen/Qwen3-0.6B", "grpo", '["q_proj", "v_proj"]', ""),
    ],
)
def test_a_spec_where_vllm_gets_what_was_trained_still_passes(cli, tmp_path, model, method, targets, extra):
    r = cli("validate", _write(tmp_path, model=model, method=method, targets=targets, extra=extra))
    assert r.code == 0 and r.out.startswith("ok:"), r.out + r.err


def test_a_model_the_catalog_does_not_know_is_a_warning_left_to_the_worker(cli, tmp_path):
    r = cli("validate", _write(tmp_path, model="someone/custom-1.5B"))
    assert r.code == 0 and r.out.startswith("ok:"), r.out + r.err
    warned = [ln for ln in r.err.splitlines() if "train.lora_targets" in ln]
    assert len(warned) == 1 and warned[0].startswith("warning:") and "lm_head" in warned[0]


def _tiny(tmp_path, targets):
    """The built-in model (tied, like every catalog model under ~8B) with a trained-looking LoRA on ``targets``."""
    import torch

    from autoslm.catalog import model_info
    from autoslm.engine.train import models
    from autoslm.engine.train.recipe import Device

    spec = validate_dict(
        {
            "name": "tied",
            "model": "autoslm/tiny",
            "environment": {"id": "autoslm/arith", "params": {"n_train": 8, "n_eval": 0}},
            "train": {
                "method": "grpo",
                "max_steps": 1,
                "prompts_per_step": 2,
                "group_size": 2,
                "max_completion_tokens": 4,
                "max_length": 64,
                "lora_targets": targets,
                "vllm": {"enabled": False},
            },
            "artifacts": {"path": str(tmp_path / "store")},
        }
    )
    info = model_info(spec.model)
    model = models.load_model(
        models.resolve_model_path(spec.model, tmp_path / "home"),
        dict(models.load_kwargs(spec, info, Device.detect()), dtype="float32"),
    )
    model = models.attach_adapter(model, spec, info)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name or "lora_embedding_B" in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return spec, model


def test_the_push_of_a_tied_head_differs_from_peft_merge_and_the_worker_refuses_it(tmp_path):
    import copy

    import torch

    from autoslm.catalog import model_info
    from autoslm.engine.train.vllm_sync import merged_named_params, refuse_tied_lora, tied_lora_layers
    from autoslm.errors import FatalWorkerError

    assert model_info("autoslm/tiny").tied
    spec, model = _tiny(tmp_path, ["q_proj", "lm_head"])
    from trl.generation.vllm_generation import VLLMGeneration

    pushed = dict(merged_named_params(model, VLLMGeneration.__new__(VLLMGeneration)._fix_param_name_to_vllm))
    merged = copy.deepcopy(model).merge_and_unload(safe_merge=True)
    assert "lm_head.weight" not in pushed  # one tied matrix, one name: the embedding's
    assert not torch.allclose(merged.lm_head.weight, pushed["model.embed_tokens.weight"])  # the head vLLM would use
    assert tied_lora_layers(model) == ["lm_head"]
    with pytest.raises(FatalWorkerError) as e:
        refuse_tied_lora(model, spec)
    assert "train.lora_targets" in str(e.value) and "lm_head" in str(e.value) and "\n" not in str(e.value)


def test_the_worker_lets_lora_off_the_tied_matrix_through(tmp_path):
    from autoslm.engine.train.vllm_sync import refuse_tied_lora, tied_lora_layers

    spec, model = _tiny(tmp_path, ["q_proj", "v_proj"])
    assert tied_lora_layers(model) == []
    refuse_tied_lora(model, spec)
