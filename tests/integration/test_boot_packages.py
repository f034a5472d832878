"""A pod of an image that has autoslm (the worker image, or one of your own) installs the spec's
``[environment] packages`` at start, with the image's stack held as a bootstrap pod's is.

The "image": a base venv (tests/fakes/base_image.py) with autoslm's wheel installed into it; pip offline,
the package a tiny wheel built here. boot.sh runs as the image's ENTRYPOINT does (no --wheel).

    .venv/bin/python -m pytest -q tests/integration/test_boot_packages.py      # ~30 s
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from autoslm.controller.wheel import build_wheel
from autoslm.layout import RunPaths
from autoslm.store import RunArtifacts
from autoslm.store.local import LocalStore
from tests.fakes.base_image import REPO, WHEELHOUSE, make_base_venv, pod_env, stub_wheel


def test_an_images_pod_installs_the_specs_packages_with_its_stack_held(tmp_path):
    if not any(WHEELHOUSE.glob("*.whl")):
        pytest.fail(f"{WHEELHOUSE} has no wheels: run `make wheelhouse`")
    base = make_base_venv(tmp_path / "image")
    wheel, _ = build_wheel(tmp_path / "wheel")
    subprocess.run(
        [str(base.python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    stubs = tmp_path / "stubs"
    stub_wheel(stubs, "my-env-pkg", "2.0.1")
    store = tmp_path / "store"
    spec = {
        "name": "p",
        "model": "autoslm/tiny",
        "environment": {"id": "autoslm/arith", "packages": ["my-env-pkg==2.0.1"]},
        "train": {"method": "sft"},
    }
    env = {
        **pod_env(base),
        "PIP_FIND_LINKS": f"{WHEELHOUSE} {stubs}",
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp_path),
        "AUTOSLM_STORE": store.as_uri(),
        "AUTOSLM_RUN_ID": "run-1",
        "AUTOSLM_JOBSPEC": json.dumps(spec),
    }
    before = _versions(base)
    r = subprocess.run(
        [shutil.which("dash") or "/bin/sh", str(REPO / "worker_image" / "boot.sh"), "--", "python", "-c", "print('worker ran')"],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=300,
    )
    assert r.returncode == 0 and "worker ran" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    after = _versions(base)
    assert after["my-env-pkg"] == "2.0.1"
    held = [n for n in before if n in ("torch", "triton") or n.startswith(("nvidia-", "cuda-"))]
    assert held and {n: after[n] for n in held} == {n: before[n] for n in held}
    events = RunArtifacts(LocalStore(store), RunPaths("sft", "run-1", 0)).read_events()
    (install,) = [e.data for e in events if e.kind == "install"]
    assert install == {"what": "my-env-pkg==2.0.1", "added": ["my-env-pkg==2.0.1"], "kept": []}


def _versions(base) -> dict[str, str]:
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
