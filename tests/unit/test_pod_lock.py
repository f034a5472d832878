"""boot's decisions on the lock file (worker_image/pod-lock.json: the pod's installs resolved from the real
index's metadata against a twin of each base image, `make lock`): on every base, autoslm's install keeps
each held version, and on the base without vLLM boot keeps the vLLM it installs.

    .venv/bin/python -m pytest -q tests/unit/test_pod_lock.py      # < 1 s; `make check-pins` resolves afresh
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

from autoslm.controller import images, podlock

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("autoslm_lock", REPO / "worker_image" / "lock.py")
lockgen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lockgen)


def test_the_lock_is_for_these_pins():
    # A changed pin (requirements-gpu.txt, pyproject.toml) needs a fresh resolution before it lands.
    assert podlock.load()["pins_sha256"] == lockgen.pins_sha256(), "the pins changed: run `make lock` and review the diff"


def test_boot_keeps_vllm_and_every_held_version_on_each_twin():
    lock = podlock.load()
    assert set(lock["twins"]) == {"pytorch", "vllm"}
    assert podlock.problems(lock) == []
    pytorch = lock["twins"]["pytorch"]
    assert pytorch["image"]["torch"] == "2.13.0" and "vllm" not in pytorch["image"]
    assert pytorch["image"]["nvidia-cudnn-cu13"] == "9.20.0.48"  # torch 2.13.0's exact pin
    outcome = podlock.vllm_outcome(pytorch)
    assert outcome.install["vllm"] == "0.31.0" and outcome.refusal is None
    # vLLM brings CUDA packages torch does not: additions, which boot allows.
    assert {"nvidia-cudnn-frontend", "nvidia-cutlass-dsl"} <= set(outcome.install)
    assert podlock.vllm_outcome(lock["twins"]["vllm"]) is None  # vLLM's own image


def test_a_pin_that_would_change_a_held_package_fails_the_check():
    lock = copy.deepcopy(podlock.load())
    pytorch = lock["twins"]["pytorch"]
    resolved = next(r for r in ("held", "keep_images_unpinned") if "install" in pytorch["vllm"].get(r, {}))
    pytorch["vllm"][resolved]["install"]["torch"] = "2.12.0"  # as a vllm pin needing another torch would resolve
    assert podlock.problems(lock) == ["pytorch: boot would not install vLLM (it would change the image's torch 2.13.0 -> 2.12.0)"]
    lock = copy.deepcopy(podlock.load())
    lock["twins"]["vllm"]["autoslm"]["install"]["triton"] = "3.6.0"
    assert podlock.problems(lock) == ["vllm: installing autoslm would change the image's triton 3.7.1 -> 3.6.0"]
    lock = copy.deepcopy(podlock.load())
    lock["twins"]["pytorch"]["vllm"] = {
        "requirement": "vllm==0.31.0",
        "held": {"error": "ResolutionImpossible"},
        "keep_images_unpinned": {"error": "ResolutionImpossible"},
    }
    assert podlock.problems(lock)[0].startswith("pytorch: boot would not install vLLM (it does not resolve")


def test_plan_names_the_torchaudio_consequence_where_the_lock_shows_it():
    lock = copy.deepcopy(podlock.load())
    pytorch = lock["twins"]["pytorch"]
    pytorch["image"]["torchaudio"] = "2.11.1"
    resolved = next(r for r in ("held", "keep_images_unpinned") if "install" in pytorch["vllm"].get(r, {}))
    pytorch["vllm"][resolved]["install"]["torchaudio"] = "2.11.0"
    assert podlock.kept_against_vllm("runpod", lock) == {"torchaudio": ("2.11.1", "2.11.0")}
    assert images.vllm_note("runpod", lock) == " (torchaudio stays 2.11.1, vLLM pins 2.11.0: its audio models are unavailable)"
    assert podlock.problems(lock) == []


# What the published wheels require on a Python above 3.11 (their METADATA's Requires-Dist, December 2026):
# requirements with a python_version marker, which a twin resolved for the wrong Python would miss.
PUBLISHED = {
    "vllm": ['six>=1.16.0; python_version > "3.11"', 'setuptools<81.0.0,>=77.0.3; python_version > "3.11"'],
    "torch": ["setuptools>=77.0.3"],
}


def test_each_twin_is_its_images_python():
    # PyTorch's 2.13.0 image runs Python 3.12 (Ubuntu 24.04, glibc 2.39); vLLM's v0.31.0 image too.
    assert {name: (t["python"], t["glibc"]) for name, t in lockgen.TWINS.items()} == {
        "pytorch": ("3.12", 39),
        "vllm": ("3.12", 35),
    }
    assert {name: t["python"] for name, t in podlock.load()["twins"].items()} == {"pytorch": "3.12", "vllm": "3.12"}


def test_every_install_of_vllm_or_torch_in_the_lock_meets_their_python_dependent_requirements():
    from packaging.requirements import Requirement

    lock = podlock.load()
    sets = []
    for name, twin in lock["twins"].items():
        sets.append((f"{name} image", twin["python"], twin["image"]))
        sets.append((f"{name} autoslm", twin["python"], {**twin["image"], **twin["autoslm"]["install"]}))
        for label, got in twin.get("vllm", {}).items():
            if isinstance(got, dict) and "install" in got:
                sets.append((f"{name} vllm ({label})", twin["python"], {**twin["image"], **got["install"]}))
    checked, unmet = 0, []
    for label, python, installed in sets:
        env = {
            "python_version": python,
            "python_full_version": f"{python}.0",
            "platform_machine": "x86_64",
            "platform_system": "Linux",
            "sys_platform": "linux",
            "extra": "",
        }
        for pkg, reqs in PUBLISHED.items():
            if pkg not in installed:
                continue
            for r in map(Requirement, reqs):
                if r.marker is not None and not r.marker.evaluate(env):
                    continue
                checked += 1
                version = installed.get(r.name)
                if version is None or not r.specifier.contains(version):
                    unmet.append(f"{label}: {pkg} requires {r.name}{r.specifier}, has {version}")
    assert not unmet
    assert checked >= 8  # vLLM's two on its image, its round and both autoslm sets' vLLM; torch's everywhere
