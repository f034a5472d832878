"""The pod's installs, resolved from the package index's metadata for the pod's platform: worker_image/pod-lock.json.

    make lock                                  # refresh pod-lock.json (the network: metadata only)
    make check-pins                            # resolve afresh and fail if it differs from pod-lock.json

A twin of each base image the planner can choose, as a package set, then what boot (worker_image/boot.py)
would install on it, resolved by pip's resolver for Linux x86_64, the image's Python and CUDA wheels,
without downloading a wheel (``pip install --dry-run --report --ignore-installed --only-binary=:all:
--platform ... --python-version ...``; pip reads each wheel's metadata file where the index serves one):

- ``pytorch`` (RunPod's base, pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime, Python 3.12 in /opt/conda, Ubuntu 24.04
  with glibc 2.39): torch 2.13.0
  with its published requirements at the versions they resolve to (exact pins in its METADATA:
  ../shared/reference/wheels/), plus torchvision and torchaudio as that image ships them. Source:
  pytorch/pytorch's Dockerfile (its ``conda-installs`` stage) installs ``torch torchvision torchaudio``
  unpinned from PyTorch's CUDA index, so the image has the newest torchvision whose metadata accepts
  torch 2.13.0 and the newest torchaudio (torchaudio 2.11 declares no torch requirement).
- ``vllm`` (Vast's base, vllm/vllm-openai:v0.31.0, Python 3.12, Ubuntu 22.04): vllm 0.31.0 with its published
  requirements, which on Python 3.12 include ``setuptools<81`` and ``six`` (markers ``python_version > "3.11"``).

The Python of a twin matters beyond its wheel tags: a requirement with a ``python_version`` marker, and a
release that dropped a Python (numpy 2.5 needs 3.12), resolve differently on another one.

An image is built when its release is: each twin resolves as the index was then (``built``, pip's
``--uploaded-prior-to``: torch 2.13.0's wheels reached the index between 2026-07-08 and 07-10, vllm
0.31.0's between 10-04 and 10-06), so a requirement given as a range (torch's ``cuda-bindings>=13.0.3,<14``)
takes the version the image got, not today's newest. What boot installs on the pod resolves as the
index is now.

Then, per twin: autoslm's wheel (built from this checkout) with its pod extras and the spec-less pod's
constraints (boot_rules.py's ``constraints``: the twin's held set at its versions, requirements-gpu.txt for the
rest, and the twin's other packages as installed); and on a twin without vLLM, the pinned vllm with
boot's own constraints for it (the held set pinned, requirements-gpu.txt for the rest; a package that
is not held may change, as pip would change it on the pod): once with the held set pinned, and where
that cannot resolve, once more with boot_rules.py's KEEP_IMAGES unpinned, as boot does. The lock records the resolutions, not decisions:
tests/unit/test_pod_lock.py runs boot_rules.py's decisions on them. ``pins_sha256`` ties the lock to
requirements-gpu.txt and autoslm's requirements in pyproject.toml (the base set and the pod's extras): a
changed pin without `make lock` fails that test.

It installs nothing: every pip run is a dry run in an isolated pip (no pip.conf, no PIP_* settings).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LOCK = HERE / "pod-lock.json"
PINS = HERE / "requirements-gpu.txt"


def platform(glibc_minor: int) -> list[str]:
    """pip's options for a Linux x86_64 image with glibc 2.<glibc_minor>: every manylinux tag it runs (pip
    does not widen a --platform by itself), CPython, wheels only."""
    tags = [f"manylinux_2_{m}_x86_64" for m in range(glibc_minor, 4, -1)] + [
        "manylinux2014_x86_64",
        "manylinux2010_x86_64",
        "manylinux1_x86_64",
    ]
    return [arg for tag in tags for arg in ("--platform", tag)] + ["--implementation", "cp", "--only-binary=:all:"]


# One twin per bootstrap base (a vendor's ``Vendor.bootstrap_base`` names the one its pods start from).
TWINS = {
    "pytorch": {
        "python": "3.12",
        "glibc": 39,
        "built": "2026-07-12T00:00:00Z",
        "requirements": ["torch==2.13.0", "torchvision", "torchaudio"],
        "source": "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime: pytorch/pytorch's Dockerfile (conda-installs stage) "
        "pip-installs `torch torchvision torchaudio` unpinned from PyTorch's CUDA 13.0 index; torch's own "
        "requirements as its published METADATA pins them",
    },
    "vllm": {
        "python": "3.12",
        "glibc": 35,
        "built": "2026-10-07T00:00:00Z",
        "requirements": ["vllm==0.31.0"],
        "source": "vllm/vllm-openai:v0.31.0: vllm 0.31.0 and its published requirements",
    },
}


def _rules():
    """boot's decisions (worker_image/boot_rules.py), as the pod runs them."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("autoslm_boot_rules", HERE / "boot_rules.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


rules = _rules()


def pins_sha256() -> str:
    """What the lock depends on in this checkout: the pod's pins and autoslm's own requirements (the
    base set and the extras a pod installs; a test tool or a linter's settings change no pod)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    requirements = {
        "dependencies": project.get("dependencies", []),
        **{name: extras.get(name, []) for name in rules.EXTRAS.split(",")},
    }
    h = hashlib.sha256(PINS.read_bytes())
    h.update(json.dumps(requirements, sort_keys=True).encode())
    return h.hexdigest()


# Pure-Python packages the pod needs that the index serves as source only (lm-eval's sqlitedict,
# word2number and rouge-score): pip on the pod builds each into a py3-none-any wheel. A dry run for
# another platform takes wheels only, so the lock builds those wheels here first (``source_wheels``, at
# requirements-gpu.txt's pins) and offers them with --find-links: the resolution then reads the same
# metadata the pod's build gives.
SOURCE_ONLY = ("sqlitedict", "word2number", "rouge-score")


def source_wheels(pins_text: str, work: Path) -> Path:
    """A folder of wheels built from the source-only packages at their pins."""
    out = work / "source-wheels"
    out.mkdir(parents=True, exist_ok=True)
    reqs = [f"{name}=={rules.pinned_of(pins_text, name)}" for name in SOURCE_ONLY]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    r = subprocess.run(
        [sys.executable, "-m", "pip", "--isolated", "wheel", "--no-deps", "--quiet", "-w", str(out), *reqs],
        capture_output=True,
        text=True,
        env=env,
    )
    if r.returncode != 0:
        raise SystemExit(f"could not build wheels of {', '.join(reqs)}: {rules.last_error(r.stdout + r.stderr)}")
    return out


def resolve(
    twin: dict, requirements: list[str], constraints: str, work: Path, *, built: bool = False, wheels: Path | None = None
) -> dict:
    """{"install": {name: version}} from pip's dry run, or {"error": pip's last error line}. ``built``: as
    the index was when the image was built (``--uploaded-prior-to``), for the image's own package set.
    ``wheels``: a folder of wheels built here (``source_wheels``), for autoslm's install."""
    cons = work / "constraints.txt"
    cons.write_text(constraints)
    report = work / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "--isolated",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--report",
        str(report),
        "--python-version",
        twin["python"],
        *platform(twin["glibc"]),
        "-c",
        str(cons),
        *requirements,
    ]
    if wheels is not None:
        cmd[cmd.index("--report") : cmd.index("--report")] = ["--find-links", str(wheels)]
    if built:
        cmd[cmd.index("--report") : cmd.index("--report")] = ["--uploaded-prior-to", twin["built"]]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return {"error": rules.last_error(r.stdout + r.stderr)}
    return {"install": rules.report_installs(json.loads(report.read_text()))}


def as_installed(pkgs: dict[str, str], pins_text: str) -> str:
    """Constraints for packages a pod already has and boot does not hold: their versions, unless the pins name them."""
    pinned = {
        rules.norm(rules.PIN.match(line).group(1)) for line in pins_text.splitlines() if rules.PIN.match(line.split("#")[0])
    }
    return "".join(f"{n}=={v}\n" for n, v in sorted(pkgs.items()) if n not in pinned and not rules.is_held(n))


def lock_twin(name: str, twin: dict, wheel: Path, pins_text: str, work: Path) -> dict:
    base = resolve(twin, twin["requirements"], "", work, built=True)
    if "error" in base:
        raise SystemExit(f"the {name} twin does not resolve: {base['error']}")
    image = base["install"]
    held = rules.held_of(image)
    cons = rules.constraints(pins_text, held) + as_installed(image, pins_text)
    autoslm = resolve(twin, [f"{wheel}[{rules.EXTRAS}]"], cons, work, wheels=work / "source-wheels")
    out = {"source": twin["source"], "built": twin["built"], "python": twin["python"], "image": image, "autoslm": autoslm}
    if "vllm" in image or "error" in autoslm:
        return out
    vllm_req = f"vllm=={rules.pinned_of(pins_text, 'vllm')}"
    rounds = {}
    for label, pinned in (
        ("held", held),
        ("keep_images_unpinned", {n: v for n, v in held.items() if n not in rules.KEEP_IMAGES}),
    ):
        cons = rules.vllm_constraints(pins_text, pinned)  # exactly boot's: what is not held may change
        rounds[label] = resolve(twin, [vllm_req], cons, work)
        if "install" in rounds[label]:
            break
    out["vllm"] = {"requirement": vllm_req, **rounds}
    return out


def build_lock() -> dict:
    sys.path.insert(0, str(ROOT))
    from autoslm.controller.wheel import build_wheel

    pins_text = PINS.read_text()
    with tempfile.TemporaryDirectory() as tmp:
        wheel, _ = build_wheel(Path(tmp) / "wheel")
        source_wheels(pins_text, Path(tmp))
        twins = {name: lock_twin(name, twin, wheel, pins_text, Path(tmp)) for name, twin in TWINS.items()}
    return {
        "pins_sha256": pins_sha256(),
        "platform": "linux x86_64 (manylinux up to each image's glibc), CPython, CUDA 13.0 wheels",
        "twins": twins,
    }


def main(argv: list[str]) -> int:
    lock = build_lock()
    text = json.dumps(lock, indent=1, sort_keys=True) + "\n"
    if argv[1:] == ["--check"]:
        if not LOCK.is_file() or LOCK.read_text() != text:
            print(
                f"{LOCK.relative_to(ROOT)} is not what the index resolves now: run `make lock` and review the diff",
                file=sys.stderr,
            )
            return 1
        print(f"ok: {LOCK.relative_to(ROOT)} matches a fresh resolution")
        return 0
    LOCK.write_text(text)
    print(f"wrote {LOCK.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
