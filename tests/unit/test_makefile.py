"""`make test` sets itself up: the system packages its tests use come first, and where they cannot be
installed it stops at once with one line naming them, not deep inside a test.

    .venv/bin/python -m pytest tests/unit/test_makefile.py -q
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make here")

# Run as `make` itself runs from a shell: under `make test` the environment carries the outer make's
# MAKELEVEL/MAKEFLAGS, and a make started with them prints "make[1]: ..." lines of its own.
PLAIN_ENV = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")}


def test_make_test_installs_the_system_packages_first():
    for target in ("test", "test-fast"):
        dry = subprocess.run(
            ["make", "-n", target], capture_output=True, text=True, cwd=str(REPO), check=True, env=PLAIN_ENV
        ).stdout
        lines = dry.splitlines()
        assert "ci-deps: the system packages the tests use: chromium shellcheck" in lines[0], dry[:300]
        assert "apt-get install" in dry and dry.index("apt-get install") < dry.index("pytest")


def test_without_a_package_manager_it_says_what_to_install_in_one_line():
    # No chromium, no shellcheck and no apt-get on this PATH (make's own shell is /bin/sh).
    r = subprocess.run(
        [shutil.which("make"), "--no-print-directory", "ci-deps", "PATH=/nonexistent"],
        capture_output=True,
        text=True,
        cwd=str(REPO),
        env=PLAIN_ENV,
    )
    assert r.returncode != 0
    said = [x for x in r.stderr.splitlines() if not x.startswith("make: ***")]
    assert said == [
        "make: the tests need the system packages chromium shellcheck (headless Chromium, shellcheck): "
        "install them with this system's package manager, then run make again"
    ], r.stderr


def test_make_test_fast_builds_what_its_tests_need():
    """From a fresh clone the inner loop builds the wheelhouse that a test of boot's installs hands pip
    (every prerequisite remade: what a clone without .wheelhouse runs)."""
    dry = subprocess.run(
        ["make", "-n", "-B", "test-fast"], capture_output=True, text=True, cwd=str(REPO), check=True, env=PLAIN_ENV
    ).stdout
    assert "-w .wheelhouse" in dry and dry.index("-w .wheelhouse") < dry.index("-m pytest"), dry[-2000:]


def test_make_test_fetches_the_pinned_converter_and_make_test_long_builds_llamas_runtime_first():
    """The export tests' converter (the pinned source distribution, through the product's own fetch) is set
    up before any test runs; llama.cpp's runtime, built from that same source, before make test-long's
    tests, which alone use it (make test does not spend its build)."""
    from autoslm.recipes.export import CONVERTER_VERSION

    def dry(*targets: str) -> str:
        return subprocess.run(
            ["make", "-n", "-B", *targets], capture_output=True, text=True, cwd=str(REPO), check=True, env=PLAIN_ENV
        ).stdout

    def setup_of(target: str) -> set[str]:
        out = dry(target)
        line = next(x for x in out.splitlines() if " setup setup-image " in x)  # the set-up (a sub-make)
        assert out.index(line) < out.index("-m pytest"), out[-3000:]
        return set(line.split())

    test = setup_of("test")
    assert "converter" in test and "llama-cpp" not in test
    assert {"converter", "llama-cpp"} <= setup_of("test-long")
    steps = dry("llama-cpp")
    fetch, build = "-m autoslm.engine.export.converter .llama-cpp --keep-sdist", "cmake --build .llama-cpp/build"
    assert fetch in steps and build in steps and steps.index(fetch) < steps.index(build), steps[-3000:]
    assert f"llama_cpp_python-{CONVERTER_VERSION}.tar.gz" in steps
    assert '-e ".[worker,notebook,test,trackers,export]"' in steps
    # The C++ build waits for nothing but the source: it runs beside the venvs' installs, not after .venv's.
    built = dry(".llama-cpp/build/.built")
    assert build in built and fetch in built and ".venv/" not in built and "venv .venv\n" not in built, built[-3000:]


def test_make_test_leaves_the_long_tests_to_make_test_long():
    def marks(target: str) -> list[str]:
        dry = subprocess.run(["make", "-n", target], capture_output=True, text=True, cwd=str(REPO), env=PLAIN_ENV).stdout
        return re.findall(r' -m pytest [^;]*?-m "([^"]+)"', dry)

    for target, tier in (("test", "and not long"), ("test-long", "and long")):
        got = marks(target)
        assert len(got) == 3 and all(m.endswith(tier) for m in got), (target, got)  # the laptop's, the image's, vLLM's
    for target in ("test-fast", "test-image", "test-vllm"):
        got = marks(target)
        assert got and all(re.search(r"\bnot \(?.*\blong\b", m) for m in got), (target, got)


def test_the_laptops_and_the_images_tests_give_torch_one_thread_and_vllms_its_own():
    """Side by side on a few cores, an OpenMP team on the built-in model's tiny matrices mostly waits."""
    for target in ("test", "test-fast", "test-image"):
        dry = subprocess.run(["make", "-n", target], capture_output=True, text=True, cwd=str(REPO), env=PLAIN_ENV).stdout
        runs = [x for x in dry.replace("\\\n", " ").split(";") if " -m pytest " in x]
        assert runs, (target, dry[-2000:])
        for run in runs:
            assert ("OMP_NUM_THREADS=1 " in run) is ('-m "vllm' not in run), (target, run)
