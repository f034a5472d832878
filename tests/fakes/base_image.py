"""A virtualenv standing in for a bootstrap pod's public base image: no autoslm, no vLLM.

    base = make_base_venv(tmp_path / "base")                  # the pinned stack (vLLM's image, less vLLM)
    base = make_base_venv(tmp_path / "base", only=TORCH_ONLY)  # the pinned torch and nothing else (PyTorch's)
    base = make_base_venv(tmp_path / "base", leave_out=("pip",), ensurepip=False)  # a python without pip

The real base images carry torch (and vLLM) and autoslm's pod installs itself on top
(worker_image/boot.sh). Here the stack is the worker image's pinned CPU stack, taken from
``.venv-image`` (``make setup-image``: requirements-gpu.txt without the CUDA-only packages; ``source``
names another, e.g. ``.venv-vllm``) without copying gigabytes: a new venv whose one ``.pth`` line adds a
directory of links to entries of that venv's site-packages -- every one except autoslm (its
editable-install finder, ``.pth`` and dist-info) and vllm, or with ``only`` the files of those
distributions alone (read from their RECORD) -- and never a ``.pth`` file (so nothing of the checkout
is importable). pip and anything it installs land in the new venv's own site-packages, as on an image.
What it installs offline comes from the wheelhouse (``make wheelhouse``: the pinned stack's wheels and
vLLM's CPU build), given to pip as ``PIP_FIND_LINKS`` by ``pod_env``.

``ensurepip=False``: ``python -m ensurepip`` fails as on Debian's system python (a module that says
so, first on ``pythonpath``, which the pod's PYTHONPATH must carry).

The real CUDA packages cannot install here, so a test builds stand-ins for their metadata:
``add_installed(base, {"nvidia-cudnn-cu13": "9.20.0.48"})`` puts distributions (metadata only) into
the "image", as PyTorch's image has torch's nvidia-*/cuda-* wheels; ``stub_wheel(dir, name, version,
requires=..., links=...)`` writes a tiny wheel into a find-links folder: metadata only (a new nvidia-*
package a vLLM requires), or a stand-in whose one ``.pth`` line makes a real package of a test venv
importable (``links``: that venv's site-packages and the entries to link), e.g. a ``vllm`` that is
vLLM's CPU build, or a ``triton`` for a base without one.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMAGE_VENV = REPO / ".venv-image"
VLLM_VENV = REPO / ".venv-vllm"
WHEELHOUSE = REPO / ".wheelhouse"
_LEFT_OUT = ("autoslm", "__editable__", "vllm", "_virtualenv")
# What PyTorch's runtime image brings besides Python: torch, its requirements, triton, pip.
TORCH_ONLY = (
    "torch",
    "triton",
    "filelock",
    "fsspec",
    "jinja2",
    "markupsafe",
    "mpmath",
    "networkx",
    "setuptools",
    "sympy",
    "typing-extensions",
    "pip",
)
_NO_ENSUREPIP = (
    'import sys\nsys.exit("ensurepip is disabled in Debian/Ubuntu for the system python.\\n\\n'
    'Python modules for the system python are usually handled by dpkg and apt-get.")\n'
)


@dataclass(frozen=True)
class BaseVenv:
    root: Path
    bin: Path
    python: Path
    site: Path  # the venv's own site-packages (where the pod installs autoslm)
    pythonpath: str = ""  # what the pod's PYTHONPATH must be


def site_packages(venv: Path = IMAGE_VENV) -> Path:
    found = sorted((venv.resolve() / "lib").glob("python3*/site-packages"))
    if not found:
        raise FileNotFoundError(f"{venv} has no site-packages: run `make setup-image` (or setup-vllm)")
    return found[0]


def image_site_packages() -> Path:
    return site_packages(IMAGE_VENV)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _entries_of(source: Path, names: tuple[str, ...]) -> set[str]:
    """The top-level entries of ``source`` that belong to these distributions (their dist-info and files)."""
    wanted = {_norm(n) for n in names}
    out: set[str] = set()
    for dist in metadata.distributions(path=[str(source)]):
        if _norm(dist.metadata["Name"] or "") not in wanted:
            continue
        for f in dist.files or []:
            top = Path(str(f)).parts[0]
            if top not in ("..", "") and not top.endswith(".pth"):
                out.add(top)
    return out


def make_base_venv(
    root: Path,
    leave_out: tuple[str, ...] = (),
    *,
    only: tuple[str, ...] | None = None,
    source: Path = IMAGE_VENV,
    ensurepip: bool = True,
) -> BaseVenv:
    """``leave_out``: more distributions the "image" lacks (an image that cannot run autoslm offline);
    ``only``: the distributions it has, and nothing else."""
    src = site_packages(source)
    image_python = source / "bin" / "python"
    subprocess.run([str(image_python), "-m", "venv", "--without-pip", str(root)], check=True)
    site = next((root / "lib").glob("python3*/site-packages"))
    stack = root / "base-stack"
    stack.mkdir()
    keep = _entries_of(src, only) if only is not None else None
    drop = _entries_of(src, leave_out) if leave_out else set()
    for entry in sorted(src.iterdir()):
        name = entry.name.lower()
        if name.startswith(_LEFT_OUT) or name.endswith(".pth") or entry.name in drop:
            continue
        if keep is not None and entry.name not in keep:
            continue
        if any(name.startswith(x.lower().replace("-", "_")) for x in leave_out):
            continue
        (stack / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    (site / "base-stack.pth").write_text(f"{stack}\n")
    pythonpath = ""
    if not ensurepip:
        shadow = root / "no-ensurepip" / "ensurepip"
        shadow.mkdir(parents=True)
        (shadow / "__init__.py").write_text(_NO_ENSUREPIP)
        (shadow / "__main__.py").write_text(_NO_ENSUREPIP)
        pythonpath = str(shadow.parent)
    python = root / "bin" / "python"
    probe = subprocess.run(
        [str(python), "-c", "import torch; import importlib.util as u; print(u.find_spec('autoslm'), u.find_spec('vllm'))"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        cwd=str(root),
    )
    if probe.returncode != 0 or probe.stdout.strip() != "None None":
        raise RuntimeError(f"the base venv is not what it should be: {probe.stdout} {probe.stderr[-2000:]}")
    return BaseVenv(root, root / "bin", python, site, pythonpath)


def _dist_info(name: str, version: str, requires: tuple[str, ...] = ()) -> dict[str, str]:
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    return {
        "METADATA": meta,
        "WHEEL": "Wheel-Version: 1.0\nGenerator: autoslm-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        "INSTALLER": "pip\n",
    }


def add_installed(base: BaseVenv, dists: dict[str, str]) -> None:
    """Distributions the "image" has installed (metadata and an empty RECORD; no files)."""
    for name, version in dists.items():
        info = base.site / f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"
        info.mkdir()
        for fname, text in _dist_info(name, version).items():
            (info / fname).write_text(text)
        (info / "RECORD").write_text("")


def stub_wheel(
    folder: Path, name: str, version: str, *, requires: tuple[str, ...] = (), links: tuple[Path, tuple[str, ...]] | None = None
) -> Path:
    """A py3-none-any wheel in ``folder``: ``name`` ``version`` requiring ``requires``; with ``links``
    (site-packages, entries), a ``.pth`` that makes those entries of that site-packages importable."""
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[-_.]+", "_", name)
    info = f"{stem}-{version}.dist-info"
    files = {f"{info}/{k}": v for k, v in _dist_info(name, version, requires).items() if k != "INSTALLER"}
    if links is not None:
        site, entries = links
        target = folder / f"{stem}-links"
        target.mkdir(exist_ok=True)
        for entry in entries:
            if not (target / entry).exists():
                (target / entry).symlink_to(site / entry, target_is_directory=(site / entry).is_dir())
        files[f"{stem}_standin.pth"] = f"{target}\n"
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
    path = folder / f"{stem}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
    return path


def pod_env(base: BaseVenv) -> dict[str, str]:
    """A fake pod's environment on this "image": its bin first, nothing of the checkout importable, pip
    offline with the wheelhouse as its only source."""
    return {
        "PATH": f"{base.bin}:/usr/bin:/bin",
        "PYTHONPATH": base.pythonpath,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(WHEELHOUSE),
        "PIP_NO_CACHE_DIR": "1",
    }


if __name__ == "__main__":  # python -m tests.fakes.base_image DIR: build one to look at
    print(make_base_venv(Path(sys.argv[1])))
