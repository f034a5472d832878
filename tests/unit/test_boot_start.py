"""How a bootstrap pod starts before autoslm is importable (worker_image/boot.sh), and what the controller
sends to start it: the error record a broken base leaves with the standard library alone, the one
relaunch a passing network fault gets, PID 1's duties, the start command's size, the wheel's contents,
and which worker failures are never retried.

    .venv/bin/python -m pytest -q tests/unit/test_boot_start.py      # ~15 s
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path, PurePosixPath

import pytest

from autoslm.controller import images
from autoslm.controller.wheel import _is_package_file, build_wheel_bytes
from autoslm.engine.pod.failures import is_retryable
from autoslm.errors import FatalWorkerError
from autoslm.layout import RunPaths
from autoslm.store import RunArtifacts
from autoslm.store.local import LocalStore

REPO = Path(__file__).resolve().parents[2]
BOOT = REPO / "worker_image" / "boot.sh"
SH = shutil.which("dash") or "/bin/sh"
WHEEL = "store:" + "a" * 64 + "/autoslm-0.1.0-py3-none-any.whl"


def boot(tmp_path: Path, *args: str, attempt: int = 1, script: str | None = None) -> subprocess.CompletedProcess:
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "PYTHONPATH": "",
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp_path),
        "AUTOSLM_STORE": (tmp_path / "store").as_uri(),
        "AUTOSLM_RUN_ID": "run-1",
        "AUTOSLM_SEED": "0",
        "AUTOSLM_ATTEMPT": str(attempt),
        "AUTOSLM_JOBSPEC": json.dumps({"train": {"method": "grpo"}}),
        "HF_TOKEN": "hf_NeverInTheRecord12345",
    }
    cmd = [SH, "-c", script, "autoslm-boot"] if script is not None else [SH, str(BOOT)]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, env=env, timeout=120, cwd=str(tmp_path))


def error_of(tmp_path: Path):
    return RunArtifacts(LocalStore(tmp_path / "store"), RunPaths("grpo", "run-1", 0)).get_error()


def test_a_wheel_the_store_cannot_give_is_retryable_once_then_fatal(tmp_path):
    # The controller's start command (comments dropped) behaves as the file does.
    first = boot(tmp_path, "--wheel", WHEEL, "--", "python", "-c", "print('worker ran')", script=images.boot_script())
    assert first.returncode == 2 and "worker ran" not in first.stdout
    err = error_of(tmp_path)
    assert err.message.startswith("could not fetch autoslm's wheel from the run's store: could not read data/sha256/")
    assert err.retryable is True and "recorded the error in the run's store (retryable once)" in first.stdout
    second = boot(tmp_path, "--wheel", WHEEL, attempt=2)
    err = error_of(tmp_path)
    assert second.returncode == 2 and err.retryable is False and err.message.endswith("(again, on attempt 2)")
    assert "hf_NeverInTheRecord12345" not in (tmp_path / "store" / "grpo" / "run-1" / "seed0" / "error_grpo.txt").read_text()


def test_a_python_older_than_3_11_is_named_in_the_record(tmp_path):
    # The image's only python is a stand-in that says it is 3.8 to the version check and is this python
    # otherwise; boot.py still runs on it to record why.
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text(
        f'#!/bin/sh\nfor a; do case "$a" in *version_info*\\>=*) exit 1;; *"%d.%d"*) echo 3.8; exit 0;; esac; done\n'
        f'exec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)
    tools = tmp_path / "tools"  # what the prologue uses besides a python: no other python on PATH
    tools.mkdir()
    for tool in ("dirname", "head"):
        (tools / tool).symlink_to(shutil.which(tool))
    r = subprocess.run(
        [SH, str(BOOT), "--wheel", WHEEL],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(tmp_path),
        env={
            "PATH": f"{fake.parent}:{tools}",
            "HOME": str(tmp_path),
            "TMPDIR": str(tmp_path),
            "AUTOSLM_STORE": (tmp_path / "store").as_uri(),
            "AUTOSLM_RUN_ID": "run-1",
            "AUTOSLM_JOBSPEC": '{"train": {"method": "grpo"}}',
        },
    )
    assert r.returncode == 2, r.stdout + r.stderr
    err = error_of(tmp_path)
    assert err.message == "the base image's python (3.8) is older than 3.11, which autoslm needs" and not err.retryable


def test_the_start_command_is_a_short_posix_prologue_plus_boot_py_and_asks_for_vllm_for_grpo():
    script = images.boot_script()
    text = BOOT.read_text()
    assert len(text.splitlines()) < 60 and not any(line.lstrip().startswith("#") for line in script.splitlines())
    assert len(script) < 12_000, len(script)  # the RunPod `args` string (15 KB as sh): docs/worker-image.md states its size
    assert subprocess.run([SH, "-n", "-c", script]).returncode == 0
    if shutil.which("shellcheck"):
        r = subprocess.run(["shellcheck", "--shell=sh", "-"], input="#!/bin/sh\n" + script, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout
    sft = images.boot_command(WHEEL, ["python", "-m", "autoslm.engine"])
    grpo = images.boot_command(WHEEL, ["python", "-m", "autoslm.engine"], vllm=True)
    assert sft[3:7] == ["autoslm-boot", "--wheel", WHEEL, "--"] and grpo[3:8] == [
        "autoslm-boot",
        "--wheel",
        WHEEL,
        "--vllm",
        "--",
    ]


def test_the_start_command_carries_boot_py_and_its_decisions_as_one_program():
    import ast
    import base64
    import zlib

    payload = images.boot_payload()
    assert payload == images.boot_payload() and not set("'\"$`") & set(payload)
    source = zlib.decompress(base64.b64decode(payload)).decode()
    tree = ast.parse(source, feature_version=(3, 8))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    beside = {"boot_rules", "boot_net", "boot_install"}
    assert not beside & imported and not any(isinstance(n, ast.ImportFrom) and n.module in beside for n in ast.walk(tree))
    assert [n.module for n in tree.body if isinstance(n, ast.ImportFrom)] == ["__future__"]  # once, first
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert {
        "plan_vllm",
        "held_of",
        "environment_packages",
        "parse_args",
        "Boot",
        "main",
        "fetch_wheel",
        "install_vllm",
    } <= defined
    assert "with no I/O" not in source and not ast.get_docstring(tree)  # boot_rules' docstrings dropped like boot.py's


def test_4bit_grpo_and_models_vllm_cannot_serve_never_ask_boot_for_vllm():
    from autoslm.spec import load_spec

    spec = load_spec(str(REPO / "jobspecs" / "qwen3-0.6b-grpo-gpu.toml"))
    assert images.wants_vllm(spec)
    four = spec.model_copy(update={"train": spec.train.model_copy(update={"quantization": "4bit"})})
    assert not images.wants_vllm(four) and not images.pod_packages(four, "runpod", "bootstrap").vllm
    sft = spec.model_copy(update={"train": spec.train.model_copy(update={"method": "sft"})})
    assert not images.wants_vllm(sft)


def test_pid_1_reaps_orphans_and_passes_sigterm_on(tmp_path):
    if subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode != 0:
        pytest.skip("this machine does not allow a PID namespace (unshare --pid)")
    worker = tmp_path / "worker.py"
    worker.write_text(
        "import os, signal, sys, time\n"
        "os.system(\"sh -c 'sleep 0.2 &'\")  # the sleep is orphaned: PID 1 inherits it\n"
        "time.sleep(1.0)\n"
        "z = [p for p in os.listdir('/proc') if p.isdigit() and open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[0] == 'Z']\n"
        # os.write, not print: the TERM may land while the print below is still flushing stdout.
        "signal.signal(signal.SIGTERM, lambda *a: (os.write(1, b'got TERM\\n'), os._exit(0)))\n"
        "print('pid', os.getpid(), 'zombies', len(z), flush=True)\n"
        "time.sleep(60)\n"
    )
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}
    p = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", SH, str(BOOT), "--", "python", str(worker)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        line = ""
        while "zombies" not in line:
            line = p.stdout.readline()
            assert line, "the worker did not start"
        assert line.split()[1] != "1" and line.split()[3] == "0", line  # the shell stays PID 1 and reaps
        pid1 = int(Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()[0])
        os.kill(pid1, signal.SIGTERM)
        out = p.stdout.read()
        assert p.wait(timeout=30) == 0 and "got TERM" in out, out
    finally:
        p.kill()
        p.wait()


def test_the_wheel_takes_only_package_files():
    assert _is_package_file(PurePosixPath("controller/wheel.py")) and _is_package_file(PurePosixPath("_image/boot.sh"))
    for stray in (
        ".env",
        "controller/.secret.py",
        "notes.txt",
        "controller/wheel.py.orig",
        "__pycache__/x.py",
        ".ipynb_checkpoints/cli.py",
        "_image/sub/x.sh",
    ):
        assert not _is_package_file(PurePosixPath(stray)), stray
    names = zipfile.ZipFile(io.BytesIO(build_wheel_bytes()[1])).namelist()
    assert all(
        n.endswith((".py", "/METADATA", "/WHEEL", "/RECORD", "/entry_points.txt")) or n.startswith("autoslm/_image/")
        for n in names
    ), names


def test_a_missing_package_is_never_retried_and_4bit_names_bitsandbytes():
    from autoslm.engine.train.models import require_package

    assert not is_retryable(ImportError("cannot import name 'X' from 'trl'"))
    assert not is_retryable(ModuleNotFoundError("No module named 'liger_kernel'"))
    assert is_retryable(RuntimeError("CUDA error: an illegal memory access"))
    with pytest.raises(FatalWorkerError, match="4-bit loading needs no_such_pkg_autoslm, which this pod's python does not have"):
        require_package("no_such_pkg_autoslm", "4-bit loading")
    require_package("json", "anything")


def test_plan_says_where_vllm_comes_from_per_provider():
    from autoslm.spec import load_spec

    spec = load_spec(str(REPO / "jobspecs" / "qwen3-0.6b-grpo-gpu.toml"))
    spec = spec.model_copy(update={"compute": spec.compute.model_copy(update={"image": "bootstrap"})})
    line = images.describe(spec)
    assert "runpod: pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime + vLLM 0.31.0 installed at start" in line
    assert "vast: vllm/vllm-openai:v0.31.0" in line and "(no vLLM)" not in line
    for provider in ("runpod", "vast"):
        assert images.pod_packages(spec, provider, "bootstrap").vllm and images.pod_packages(spec, provider, "bootstrap").kernels
    off = spec.model_copy(
        update={"train": spec.train.model_copy(update={"vllm": spec.train.vllm.model_copy(update={"enabled": False})})}
    )
    assert not images.pod_packages(off, "runpod", "bootstrap").vllm
    assert images.VLLM_PIN == next(
        line.split("==")[1]
        for line in (REPO / "worker_image" / "requirements-gpu.txt").read_text().splitlines()
        if line.startswith("vllm==")
    )


def test_a_hub_kernel_verified_by_the_prefetch_is_not_checked_again_by_each_load(tmp_path):
    from transformers.integrations import hub_kernels

    from autoslm.engine.pod.prefetch import record_trusted_kernel, trusted_kernel

    env = {"HF_HOME": str(tmp_path / "hf")}
    kernel = "kernels-community/flash-attn2"
    with trusted_kernel(kernel, env):
        assert hub_kernels.ALLOW_ALL_KERNELS is False  # not verified on this pod: transformers checks it
    record_trusted_kernel(kernel, env)
    record_trusted_kernel(kernel, env)
    assert (tmp_path / "hf" / "hub" / "autoslm-trusted-kernels.txt").read_text() == kernel + "\n"
    with trusted_kernel(kernel, env):
        assert hub_kernels.ALLOW_ALL_KERNELS is True  # verified once by the prefetch: no Hub lookup per load
    assert hub_kernels.ALLOW_ALL_KERNELS is False
    with trusted_kernel("kernels-community/vllm-flash-attn3", env), trusted_kernel("sdpa", env):
        assert hub_kernels.ALLOW_ALL_KERNELS is False
