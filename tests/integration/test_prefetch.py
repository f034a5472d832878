"""The image's model prefetch (engine/pod/prefetch.py) against the fake Hub: it downloads what the worker
loads, reports progress as "setup" heartbeats in the run's store, and never blocks the worker."""

from __future__ import annotations

import io
import json

import pytest
from huggingface_hub import HfApi

from autoslm.engine.pod.prefetch import main
from autoslm.layout import RunPaths
from autoslm.store import RunArtifacts, open_store
from tests.fakes.hub import FAKE_HUB_TOKEN, fake_hub  # noqa: F401 - pytest fixture

pytestmark = pytest.mark.worker  # also runs on the worker image's pins (huggingface_hub 1.33)

MODEL = "someone/small-model"


def _env(tmp_path, hub, spec: dict) -> dict[str, str]:
    return {
        "AUTOSLM_JOBSPEC": json.dumps(spec),
        "AUTOSLM_RUN_ID": "run-1",
        "AUTOSLM_SEED": "0",
        "AUTOSLM_ATTEMPT": "2",
        "AUTOSLM_STORE": (tmp_path / "store").as_uri(),
        "HF_ENDPOINT": hub.endpoint,
        "HF_TOKEN": FAKE_HUB_TOKEN,
        "HF_HOME": str(tmp_path / "hf"),
    }


def test_prefetch_downloads_the_model_files_and_reports_progress(tmp_path, fake_hub):  # noqa: F811
    api = HfApi(endpoint=fake_hub.endpoint, token=FAKE_HUB_TOKEN)
    api.create_repo(MODEL, repo_type="model")
    weights = b"\0" * 300_000
    for name, data in (
        ("config.json", b"{}"),
        ("model.safetensors", weights),
        ("tokenizer.json", b"{}"),
        ("pytorch_model.bin", b"x" * 1000),
        ("README.md", b"# card"),
    ):
        api.upload_file(path_or_fileobj=io.BytesIO(data), path_in_repo=name, repo_id=MODEL, repo_type="model")
    env = _env(tmp_path, fake_hub, {"model": MODEL, "train": {"method": "grpo"}})
    assert main(env, every_s=0.01) == 0
    snapshot = next((tmp_path / "hf" / "hub" / "models--someone--small-model" / "snapshots").iterdir())
    assert sorted(p.name for p in snapshot.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    store = open_store(env["AUTOSLM_STORE"])
    hb = RunArtifacts(store, RunPaths("grpo", "run-1", 0)).get_json(RunPaths("grpo", "run-1", 0).heartbeat)
    assert hb["stage"] == "setup" and hb["attempt"] == 2
    assert hb["message"] == f"downloaded {MODEL} (0.0 GB)"


def test_prefetch_never_blocks_the_worker(tmp_path, fake_hub):  # noqa: F811
    missing = _env(tmp_path, fake_hub, {"model": "someone/does-not-exist"})
    assert main(missing, every_s=0.01) == 1  # one line in the log; the worker reports the real error
    assert main(_env(tmp_path, fake_hub, {"model": "autoslm/tiny"})) == 0  # built locally: nothing to fetch
    assert main({"AUTOSLM_JOBSPEC": "not json"}) == 0
