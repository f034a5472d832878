"""`chat`, `download` and `status` on ``hf://`` references that lead nowhere or to a damaged adapter:
one line that names the cause (the missing repo or run, the damaged file and what is wrong with it),
a non-zero exit, no traceback. Through the real CLI against the fake Hub.

    .venv/bin/python -m pytest tests/integration/test_chat_refs.py -q
"""

from __future__ import annotations

import json

import pytest

from autoslm.layout import Heartbeat, RunPaths
from autoslm.store import RunArtifacts
from autoslm.store.adapters import AdapterDamaged, check_adapter
from autoslm.store.hf import HfStore
from tests.fakes.adapters import LORA, safetensors_bytes
from tests.fakes.hub import FAKE_HUB_TOKEN, fake_hub  # noqa: F401 - pytest fixture

REPO = "alice/runs"
RUN = "far-20261130-120000-beef"


CONFIG = {
    "peft_type": "LORA",
    "r": 8,
    "lora_alpha": 16,
    "base_model_name_or_path": "autoslm/tiny",
    "target_modules": ["q_proj"],
    "task_type": "CAUSAL_LM",
}


def adapter_dir(path, config: bytes | None = None, weights: bytes | None = None):
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_bytes(json.dumps(CONFIG).encode() if config is None else config)
    (path / "adapter_model.safetensors").write_bytes(safetensors_bytes(LORA) if weights is None else weights)
    return path


def test_the_adapter_check_names_the_file_and_the_problem(tmp_path):
    good = adapter_dir(tmp_path / "good")
    check_adapter(good)
    safetensors = pytest.importorskip("safetensors")
    with safetensors.safe_open(str(good / "adapter_model.safetensors"), "np") as f:  # the library agrees it is whole
        assert sorted(f.keys()) == sorted(LORA)
    whole = safetensors_bytes(LORA)
    cases = {
        "truncated": (
            None,
            whole[: len(whole) - 100],
            "adapter_model.safetensors",
            r"truncated: 4,\d{3} bytes of the 4,\d{3} its header describes",
        ),
        "cut in the header": (None, whole[:40], "adapter_model.safetensors", r"truncated: 40 bytes, but its header alone is"),
        "empty weights": (None, b"", "adapter_model.safetensors", r"truncated: 0 bytes, shorter than a safetensors header"),
        "not json": (
            b'{"peft_type": "LORA", "r": 8',
            None,
            "adapter_config.json",
            r"not valid JSON \(.* at line 1, column \d+\)",
        ),
        "no peft_type": (json.dumps({"r": 8}).encode(), None, "adapter_config.json", "has no peft_type"),
        "a list": (b"[]", None, "adapter_config.json", r"not a JSON object \(a list\)"),
    }
    for name, (config, weights, file, problem) in cases.items():
        d = adapter_dir(tmp_path / name.replace(" ", "-"), config, weights)
        with pytest.raises(AdapterDamaged, match=problem) as e:
            check_adapter(d)
        assert e.value.path == d / file, name
        assert str(e.value).startswith(f"{d / file}: "), name
        if file.endswith(".safetensors") and weights:
            with pytest.raises(Exception):  # noqa: B017 - safetensors raises its own error type
                safetensors.safe_open(str(d / file), "np")
    (good / "adapter_model.safetensors").unlink()
    with pytest.raises(AdapterDamaged, match="missing: no adapter weights"):
        check_adapter(good)


@pytest.fixture
def hub_runs(fake_hub, tmp_path):  # noqa: F811
    """Two finished runs in the fake Hub repo: one whose adapter was cut short, one with a bad config."""
    store = HfStore(REPO, token=FAKE_HUB_TOKEN, endpoint=fake_hub.endpoint, timeout=5)
    whole = safetensors_bytes(LORA)
    for run, config, weights in (("cut-1", None, whole[: len(whole) // 2]), ("badcfg-1", b"{not json", None)):
        art = RunArtifacts(store, RunPaths("sft", run, 0))
        art.put_heartbeat(Heartbeat(run_id=run, seed=0, phase="sft", stage="done", step=5, total_steps=5, time=110.0))
        art.put_train_meta(
            {
                "spec": {
                    "name": "far",
                    "model": "autoslm/tiny",
                    "environment": {"id": "autoslm/arith"},
                    "train": {"method": "sft", "max_steps": 5},
                }
            }
        )
        art.put_metrics({"final_loss": 0.6})
        art.put_adapter(adapter_dir(tmp_path / run, config, weights))
        art.mark_done()
    return fake_hub


def one_line_error(r) -> str:
    lines = r.err.strip().splitlines()
    assert r.code != 0 and len(lines) == 1 and "Traceback" not in r.err and lines[0].startswith("error: "), (r.code, r.err)
    return lines[0]


def test_refs_to_a_missing_repo_or_run_say_so_in_one_line(cli, hub_runs):
    pytest.importorskip("torch")  # chat checks for the worker extra first
    env = hub_runs.env()
    for cmd in (("chat", "--prompt", "hi"), ("download",), ("status",)):
        line = one_line_error(cli(cmd[0], "hf://alice/missing/sft/x", *cmd[1:], env=env))
        assert "hf://alice/missing: no store" in line or "no store hf://alice/missing" in line, line
        assert "does not exist" in line, line
        line = one_line_error(cli(cmd[0], f"hf://{REPO}/sft/nope-1", *cmd[1:], env=env))
        assert f"no run nope-1 under sft/ in hf://{REPO}" in line, line
        line = one_line_error(cli(cmd[0], f"hf://{REPO}/grpo/cut-1", *cmd[1:], env=env))  # the right id, the wrong phase
        assert "no run cut-1 under grpo/" in line, line
        assert "not in the store yet" not in line and "internal error" not in line


def test_chat_and_download_name_the_damaged_adapter_file(cli, hub_runs, tmp_path):
    pytest.importorskip("torch")
    env = hub_runs.env()
    r = cli("chat", f"hf://{REPO}/sft/cut-1", "--prompt", "What is 3 + 4?", env=env)
    line = one_line_error(r)
    assert f"hf://{REPO}/sft/cut-1/seed0/adapter/adapter_model.safetensors: truncated: " in line, line
    assert r.out == "", "nothing was answered"
    r = cli("chat", f"hf://{REPO}/sft/badcfg-1", "--prompt", "hi", env=env)
    line = one_line_error(r)
    assert "badcfg-1/seed0/adapter/adapter_config.json: not valid JSON" in line, line
    r = cli("download", f"hf://{REPO}/sft/cut-1", "--to", str(tmp_path / "dl"), env=env)
    line = one_line_error(r)
    assert f"{tmp_path / 'dl' / 'adapter_model.safetensors'}: truncated: " in line and "download it again" in line, line
    # The run itself is there and finished: status answers.
    st = cli("status", f"hf://{REPO}/sft/cut-1", "--json", env=env)
    assert st.code == 0 and json.loads(st.out)["state"] == "succeeded", st.err
