"""The parts of a bootstrap pod that run on the laptop or in any shell: the image choice (against a
fake registry), autoslm's wheel, worker_image/boot.sh under a POSIX sh, and `make image`.

    .venv/bin/python -m pytest -q tests/unit/test_bootstrap.py        # ~10 s

The pod's whole start (wheel from the fake Hub, install, training) is tests/e2e/test_bootstrap.py.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from autoslm.controller import images
from autoslm.controller.wheel import build_wheel, build_wheel_bytes, ship_wheel
from autoslm.spec import validate_dict
from autoslm.store.local import LocalStore
from tests.conftest import at_once
from tests.fakes.container_registry import FakeContainerRegistry

REPO = Path(__file__).resolve().parents[2]
BOOT = REPO / "worker_image" / "boot.sh"


def spec(**compute):
    return validate_dict(
        {
            "name": "b",
            "model": "autoslm/tiny",
            "environment": {"id": "autoslm/arith"},
            "compute": {"provider": "runpod", "gpu": "RTX 4090", **compute},
            "artifacts": {"store": "hf", "repo": "someone/runs"},
        },
        "<test>",
    )


# -- the image choice -----------------------------------------------------------------------------
def test_the_registry_says_whether_the_published_image_exists():
    with FakeContainerRegistry(published={"autoslm/worker:0.1.0"}) as reg:
        assert images.image_exists("ghcr.io/autoslm/worker:0.1.0", base_url=reg.url) is True
        assert images.image_exists("ghcr.io/autoslm/worker:9.9.9", base_url=reg.url) is False
        # The anonymous token dance: 401 with a challenge, the token, then the HEAD again.
        assert ("GET", "/token?service=fake&scope=repository%3Aautoslm%2Fworker%3Apull") in reg.requests
    assert images.image_exists("ghcr.io/autoslm/worker:0.1.0", base_url="http://127.0.0.1:9") is None


def test_auto_means_the_published_image_if_it_exists_else_bootstrap():
    def say(answer):
        return lambda ref: answer

    assert images.choose_image("auto", exists=say(True)).value == "ghcr.io/autoslm/worker:0.1.0"
    assert images.choose_image("auto", exists=say(False)).value == "bootstrap"
    assert "could not ask" in images.choose_image("auto", exists=say(None)).why  # offline: bootstrap
    assert images.choose_image("bootstrap", exists=say(True)).value == "bootstrap"
    assert images.choose_image("reg.example/me/w:1", exists=say(False)).value == "reg.example/me/w:1"
    assert images.resolve_image(spec(), exists=say(False)).compute.image == "bootstrap"
    local = validate_dict({"name": "b", "model": "autoslm/tiny", "environment": {"id": "autoslm/arith"}}, "<test>")
    assert images.resolve_image(local, exists=say(False)).compute.image == "auto"  # a local run has no image


def test_plan_line_names_each_providers_base_and_the_set_up_time():
    line = images.describe(spec(provider=["runpod", "vast"]), exists=lambda ref: False)
    assert "bootstrap (ghcr.io/autoslm/worker:0.1.0 is not published)" in line
    assert "runpod: pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime (no vLLM)" in line
    setups = [images.pod_setup(spec(provider=["runpod", "vast"]), p, "bootstrap") for p in ("runpod", "vast")]
    assert "vast: vllm/vllm-openai:v0.31.0," in line
    assert f"expected set-up {min(s.low_min for s in setups)}-{max(s.high_min for s in setups)} min" in line
    line = images.describe(spec(image="reg.example/me/w:1"))
    assert line.startswith("pod image: reg.example/me/w:1 (compute.image)")


def test_image_refs_split_like_a_registry_client_does():
    assert images.split_ref("ghcr.io/autoslm/worker:0.1.0") == ("ghcr.io", "autoslm/worker", "0.1.0")
    assert images.split_ref("vllm/vllm-openai:v0.31.0@sha256:ab") == ("registry-1.docker.io", "vllm/vllm-openai", "sha256:ab")
    assert images.split_ref("python") == ("registry-1.docker.io", "library/python", "latest")
    assert images.split_ref("localhost:5000/w") == ("localhost:5000", "w", "latest")


def test_a_bad_image_setting_is_refused_by_the_spec():
    from autoslm.errors import SpecError

    with pytest.raises(SpecError, match="compute.image"):
        spec(image="two words")


# -- the wheel ------------------------------------------------------------------------------------
def test_the_wheel_is_deterministic_and_carries_boot_sh_and_the_pins():
    name, data = build_wheel_bytes()
    assert name == "autoslm-0.1.0-py3-none-any.whl" and build_wheel_bytes()[1] == data
    z = zipfile.ZipFile(io.BytesIO(data))
    assert z.read("autoslm/_image/boot.sh") == BOOT.read_bytes()
    for name in (
        "boot.py",
        "boot_rules.py",
        "boot_net.py",
        "boot_install.py",
    ):  # the controller's decisions (podlock.py), the payload
        assert z.read(f"autoslm/_image/{name}") == BOOT.with_name(name).read_bytes()
    assert z.read("autoslm/_image/requirements-gpu.txt") == (REPO / "worker_image" / "requirements-gpu.txt").read_bytes()
    meta = z.read("autoslm-0.1.0.dist-info/METADATA").decode()
    assert 'Requires-Dist: trl>=1.0; extra == "worker"' in meta and "Requires-Dist: pydantic>=2.7" in meta
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in z.namelist())
    assert z.testzip() is None


def test_the_wheel_is_shipped_once_per_content(tmp_path):
    commits = []

    class Counting(LocalStore):
        def commit(self, add, delete=(), message="autoslm"):
            commits.append(message)
            return super().commit(add, delete, message)

    store = Counting(tmp_path / "store")
    ref = ship_wheel(store, tmp_path / "wheels")
    assert ship_wheel(store, tmp_path / "wheels") == ref and commits == ["ship autoslm-0.1.0-py3-none-any.whl"]
    sha = ref.split(":")[1].split("/")[0]
    assert hashlib.sha256(store.read_bytes(f"data/sha256/{sha}")).hexdigest() == sha
    assert build_wheel(tmp_path / "wheels")[0] == tmp_path / "wheels" / sha / "autoslm-0.1.0-py3-none-any.whl"


BUILDERS = """
from pathlib import Path
from autoslm.controller.wheel import build_wheel
for i in range(int(sys.argv[3])):
    print(build_wheel(Path(sys.argv[2]) / str(i))[1])
"""


def test_launches_at_once_build_the_wheel_into_one_cache_without_a_failure_or_a_torn_file(tmp_path):
    # Two launches (two terminals, a sweep) share $AUTOSLM_HOME/wheels: each writes the same content,
    # and none may fail on, or publish, another's half-written file.
    rounds = 4
    outs = at_once(tmp_path, BUILDERS, str(tmp_path / "wheels"), str(rounds))
    (sha,) = {line for out in outs for line in out.split()}
    for i in range(rounds):
        (wheel,) = (tmp_path / "wheels" / str(i) / sha).iterdir()  # the wheel, and no part left beside it
        assert hashlib.sha256(wheel.read_bytes()).hexdigest() == sha


def test_the_start_command_carries_the_script_and_no_secret(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_ShouldNeverAppear123")
    cmd = images.boot_command("store:" + "a" * 64 + "/autoslm-0.1.0-py3-none-any.whl", ["python", "-m", "autoslm.engine"])
    assert cmd[:3] == ["sh", "-c", images.boot_script()] and cmd[3:5] == ["autoslm-boot", "--wheel"]
    assert "hf_ShouldNeverAppear123" not in " ".join(cmd)


# -- boot.sh --------------------------------------------------------------------------------------
def test_boot_sh_is_shellcheck_clean_posix_sh():
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed: `make ci-deps` installs it")
    r = subprocess.run(["shellcheck", "--shell=sh", str(BOOT)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def _run_boot(*args: str) -> subprocess.CompletedProcess:
    sh = shutil.which("dash") or "/bin/sh"  # a shell without bash's extensions, as a small image has
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "HOME": os.environ.get("HOME", "/tmp"),
    }
    return subprocess.run([sh, str(BOOT), *args], capture_output=True, text=True, env=env, timeout=120)


def test_boot_sh_as_the_images_entrypoint_prefetches_then_runs_its_command():
    r = _run_boot("python", "-c", "import os; print('worker ran, prefetch', os.environ['AUTOSLM_PREFETCH_S'], 's')")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[autoslm] prefetch: no model needs no download" in r.stdout and "worker ran, prefetch" in r.stdout


def test_boot_sh_refuses_a_wheel_option_without_a_value():
    r = _run_boot("--wheel")
    assert r.returncode == 2 and "--wheel needs a store:<sha256>/<file>.whl reference" in r.stdout


def test_the_dockerfile_starts_with_the_same_script():
    dockerfile = (REPO / "worker_image" / "Dockerfile").read_text()
    files = "worker_image/boot.py worker_image/boot_rules.py worker_image/boot_net.py worker_image/boot_install.py"
    assert f"COPY worker_image/boot.sh {files} /opt/autoslm/" in dockerfile
    assert 'ENTRYPOINT ["/usr/bin/tini", "--", "/opt/autoslm/boot.sh"]' in dockerfile
    assert (REPO / "autoslm" / "_image" / "boot.sh").resolve() == BOOT.resolve()
    for name in ("boot.py", "boot_rules.py", "boot_net.py", "boot_install.py"):
        assert (REPO / "autoslm" / "_image" / name).resolve() == BOOT.with_name(name).resolve()


# -- make image -----------------------------------------------------------------------------------
@pytest.mark.parametrize("with_docker", [False, True])
def test_make_image_without_a_running_engine_fails_with_one_clear_line(tmp_path, with_docker):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("make", "sh", "sed"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    if with_docker:  # a docker CLI whose daemon is not there
        (bin_dir / "docker").write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
        (bin_dir / "docker").chmod(0o755)
    r = subprocess.run(
        ["make", "--no-print-directory", "image"],
        capture_output=True,
        text=True,
        cwd=str(REPO),
        env={"PATH": str(bin_dir)},
        timeout=60,
    )
    assert r.returncode != 0 and r.stdout == ""
    lines = [line for line in r.stderr.splitlines() if line.startswith("make image:")]
    assert len(lines) == 1, r.stderr
    assert ("no container engine answers here" if with_docker else "neither docker nor podman is installed") in lines[0]
