"""`autoslm export --on runpod`: the export as a run of its own on a rented GPU (the fake RunPod, whose pod
is the real worker as a local process), its files in the store and then here; `autoslm download` of the
export run fetches them again; and what it refuses before anything is rented.

The trained run is the built-in model with a real LoRA adapter (peft's, its B matrices set so that the
merge changes the weights), written into a store as a finished run's; the pod's home gets the converter
copy `make converter` fetched (without it, the pod fetches it itself).

    .venv/bin/python -m pytest tests/integration/test_export_rented.py -q
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from autoslm.controller.registry import Registry, RunRecord
from autoslm.controller.state import RunState, run_state
from autoslm.layout import RunPaths
from autoslm.recipes.export import CONVERTER_VERSION
from autoslm.spec import JobSpec
from autoslm.store import RunArtifacts, open_store
from tests.conftest import REPO, shared_models_dir
from tests.fakes.runpod import fake_runpod  # noqa: F401 - pytest fixture


def trained_tiny_run(home: Path, tmp_path: Path, run_id: str = "tiny-1") -> str:
    """A succeeded run of the built-in model in this home, its adapter (real LoRA files) in its store."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from autoslm.engine.train.tiny import ensure_tiny

    spec = JobSpec.model_validate(
        {
            "name": "tiny",
            "model": "autoslm/tiny",
            "environment": {"id": "autoslm/arith"},
            "train": {"method": "sft", "max_steps": 8, "lora_rank": 8},
            "compute": {"provider": "runpod", "gpu": "RTX 4090", "image": "ghcr.io/autoslm/worker:test"},
            "artifacts": {"store": "local", "path": str(tmp_path / "store")},
        }
    )
    store_uri = (tmp_path / "store").resolve().as_uri()
    now = time.time()
    registry = Registry(home)
    registry.create_run(RunRecord(run_id, "tiny", "sft", spec.to_json(), None, store_uri, now, now + 3600), [0])
    registry.update_replica(run_id, 0, state=RunState.SUCCEEDED)
    model = AutoModelForCausalLM.from_pretrained(ensure_tiny(home / "models"), dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p, generator=torch.Generator().manual_seed(0)) * 0.05)
    peft.save_pretrained(tmp_path / "adapter")
    RunArtifacts(open_store(store_uri), RunPaths("sft", run_id, 0)).put_adapter(tmp_path / "adapter")
    return run_id


def pod_home(tmp_path: Path) -> Path:
    """The pods' AUTOSLM_HOME: the shared built-in model and, where make fetched it, the converter."""
    home = tmp_path / "pod-home"
    (home / "llama.cpp").mkdir(parents=True)
    (home / "models").symlink_to(shared_models_dir(tmp_path), target_is_directory=True)
    made = REPO / ".llama-cpp" / f"convert-{CONVERTER_VERSION}"
    if (made / ".complete").exists():
        (home / "llama.cpp" / made.name).symlink_to(made, target_is_directory=True)
    return home


def wait_until(what: str, pred, timeout: float):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if got := pred():
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_an_export_on_a_rented_gpu_lands_in_the_store_and_here(cli, home, tmp_path, fake_runpod):  # noqa: F811
    from gguf import GGUFReader

    run_id = trained_tiny_run(home, tmp_path)
    fake_runpod.extra_env["AUTOSLM_HOME"] = str(pod_home(tmp_path))
    dest = tmp_path / "here"
    r = cli(
        "export", run_id, "--format", "gguf", "--quant", "q8_0", "--on", "runpod", "--max-usd", "1", "--yes",
        "--to", str(dest), "--poll-s", "1", env=fake_runpod.env(), timeout=900,
    )  # fmt: skip
    assert r.code == 0, r.out + r.err
    assert sorted(p.name for p in dest.iterdir()) == ["Modelfile", "model-q8_0.gguf"], r.out
    assert GGUFReader(dest / "model-q8_0.gguf").fields["general.file_type"].contents() == 7  # MOSTLY_Q8_0
    assert "FROM ./model-q8_0.gguf" in (dest / "Modelfile").read_text()
    assert "exporting" in r.out or "converting" in r.out  # the pod's steps, as its heartbeat said them
    registry = Registry(home)
    (export_id,) = [x for x in registry.all_run_ids() if x != run_id]
    spec = registry.get_run(export_id).spec
    assert spec.export.source_run == run_id and spec.export.format == "gguf" and spec.limits.max_usd == 1
    assert run_state(registry.replicas(export_id)) == RunState.SUCCEEDED
    (pod,) = fake_runpod.pods()
    wait_until("the pod to be deleted", lambda: fake_runpod.pod(pod.id).deleted, 60)
    again = tmp_path / "again"
    d = cli("download", export_id, "--to", str(again))
    assert d.code == 0, d.err
    assert (again / "model-q8_0.gguf").read_bytes() == (dest / "model-q8_0.gguf").read_bytes()


@pytest.mark.parametrize(
    "args, said",
    [
        (["--on", "runpod"], "an export on runpod needs --max-usd"),
        (["--on", "local-ish", "--max-usd", "1"], "--on 'local-ish': not a provider that rents a GPU"),
        (["--on", "runpod", "--max-usd", "1", "--format", "gguf", "--quant", "q4_k_m"], "a rented pod does not have it"),
        (["--on", "runpod", "--max-usd", "1", "--format", "tflite"], "--format 'tflite': not a format autoslm exports"),
    ],
)
def test_a_rented_export_is_refused_before_anything_is_rented(cli, home, tmp_path, fake_runpod, args, said):  # noqa: F811
    run_id = trained_tiny_run(home, tmp_path)
    r = cli("export", run_id, *args, "--yes", "--to", str(tmp_path / "out"), env=fake_runpod.env())
    assert r.code == 2 and said in r.err, r.out + r.err
    assert len(r.err.strip().splitlines()) == 1
    assert fake_runpod.launch_calls == [] and fake_runpod.pods() == []
    assert not (tmp_path / "out").exists()
