"""A virtualenv standing in for a bootstrap pod's public base image: the pinned stack, no autoslm, no vLLM.

    base = make_base_venv(tmp_path / "base")       # base.bin first on a fake pod's PATH

The real base images carry torch (and vLLM) and autoslm's pod installs itself on top
(worker_image/boot.sh). Here the stack is the worker image's pinned CPU stack, taken from
``.venv-image`` (``make setup-image``: requirements-gpu.txt without the CUDA-only packages) without
copying gigabytes: a new venv whose one ``.pth`` line adds a directory of links to every entry of
``.venv-image``'s site-packages except autoslm (its editable-install finder, ``.pth`` and
dist-info) and vllm, and except every ``.pth`` file (so nothing of the checkout is importable).
pip and anything it installs land in the new venv's own site-packages, as on an image.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMAGE_VENV = REPO / ".venv-image"
_LEFT_OUT = ("autoslm", "__editable__", "vllm", "_virtualenv")


@dataclass(frozen=True)
class BaseVenv:
    root: Path
    bin: Path
    python: Path
    site: Path  # the venv's own site-packages (where the pod installs autoslm)


def image_site_packages() -> Path:
    found = sorted((IMAGE_VENV.resolve() / "lib").glob("python3*/site-packages"))
    if not found:
        raise FileNotFoundError(f"{IMAGE_VENV} has no site-packages: run `make setup-image`")
    return found[0]


def make_base_venv(root: Path, leave_out: tuple[str, ...] = ()) -> BaseVenv:
    """``leave_out``: more distributions the "image" lacks (an image that cannot run autoslm offline)."""
    source = image_site_packages()
    image_python = IMAGE_VENV / "bin" / "python"
    subprocess.run([str(image_python), "-m", "venv", "--without-pip", str(root)], check=True)
    site = next((root / "lib").glob("python3*/site-packages"))
    stack = root / "base-stack"
    stack.mkdir()
    for entry in sorted(source.iterdir()):
        name = entry.name.lower()
        if name.startswith(_LEFT_OUT + leave_out) or name.endswith(".pth"):
            continue
        (stack / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    (site / "base-stack.pth").write_text(f"{stack}\n")
    python = root / "bin" / "python"
    probe = subprocess.run([str(python), "-c", "import torch, pip; import importlib.util as u; "
                            "print(u.find_spec('autoslm'), u.find_spec('vllm'))"],
                           capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, cwd=str(root))
    if probe.returncode != 0 or probe.stdout.strip() != "None None":
        raise RuntimeError(f"the base venv is not what it should be: {probe.stdout} {probe.stderr[-2000:]}")
    return BaseVenv(root, root / "bin", python, site)


if __name__ == "__main__":  # python -m tests.fakes.base_image DIR: build one to look at
    print(make_base_venv(Path(sys.argv[1])))
