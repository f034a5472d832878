"""llama.cpp's converter at the pinned version: fetched once into autoslm's home, asked what it knows.

The converter (``convert_hf_to_gguf.py``, ``convert_lora_to_gguf.py``, their ``conversion`` package and
``gguf-py``) ships in llama-cpp-python's source distribution. On first use the pinned one is downloaded
with pip from the package index and only those files are unpacked, under
``$AUTOSLM_HOME/llama.cpp/convert-<version>/`` (written whole: a folder renamed into place). Nothing is
compiled. This module never converts anything itself: ``gguf_convert.py`` runs the converter's own
entry point in a process of its own.

    python -m autoslm.engine.export.converter DIR [--sdist FILE] [--keep-sdist]   # make's cached copy
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from autoslm.errors import UsageError
from autoslm.recipes.export import CONVERTER_DIST, CONVERTER_VERSION

# What is taken from the source distribution's vendor/llama.cpp (and nothing else: no C++ source).
SOURCE_FILES = ("convert_hf_to_gguf.py", "convert_lora_to_gguf.py", "LICENSE")
SOURCE_DIRS = ("conversion", "gguf-py/gguf")
COMPLETE = ".complete"


def converter_dir(root: Path) -> Path:
    return Path(root) / f"convert-{CONVERTER_VERSION}"


def home_root(home: Path) -> Path:
    return Path(home) / "llama.cpp"


def ensure_converter(root: Path, log=lambda msg: None) -> Path:
    """The unpacked converter under ``root``, fetched and unpacked first if it is not there."""
    target = converter_dir(root)
    if (target / COMPLETE).exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=root) as tmp:
        sdist = fetch_sdist(Path(tmp), log)
        return unpack(sdist, root)


def fetch_sdist(dest: Path, log=lambda msg: None) -> Path:
    """The pinned source distribution, downloaded with pip into ``dest`` (about 80 MB, once)."""
    log(f"fetching llama.cpp's converter: {CONVERTER_DIST} {CONVERTER_VERSION}'s source (about 80 MB, once)")
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"]
    cmd += [f"{CONVERTER_DIST}=={CONVERTER_VERSION}", "-d", str(dest)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(dest.glob("*.tar.gz"))
    if p.returncode != 0 or not found:
        tail = [line for line in (p.stderr or p.stdout).splitlines() if line.strip()][-1:]
        raise UsageError(
            f"could not download llama.cpp's converter ({CONVERTER_DIST}=={CONVERTER_VERSION}): {tail[0] if tail else p.returncode}",
            hint="the first GGUF export needs the package index once; later ones use the copy kept in autoslm's home",
        )
    return found[0]


def unpack(sdist: Path, root: Path) -> Path:
    """The converter's files out of ``sdist``, into ``converter_dir(root)``, renamed into place whole."""
    target = converter_dir(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=root))
    tmp.chmod(0o755)  # mkdtemp makes it private; the converter is read by whoever exports
    try:
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                rel = _wanted(member.name)
                if rel is None or not member.isfile():
                    continue
                out = tmp / rel
                out.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        missing = [
            f for f in (*SOURCE_FILES[:2], "conversion/__init__.py", "gguf-py/gguf/__init__.py") if not (tmp / f).is_file()
        ]
        if missing:
            raise UsageError(
                f"{sdist.name} holds no {', '.join(missing)}: not the source distribution the converter is pinned to"
            )
        (tmp / COMPLETE).write_text(f"{CONVERTER_DIST}=={CONVERTER_VERSION}\n")
        try:
            os.replace(tmp, target)
        except OSError:  # another export unpacked it first: its copy is the same
            if not (target / COMPLETE).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _wanted(name: str) -> str | None:
    """The path under vendor/llama.cpp of a member the converter needs, else None."""
    parts = Path(name).parts
    if len(parts) < 4 or parts[1:3] != ("vendor", "llama.cpp") or ".." in parts:
        return None
    rel = "/".join(parts[3:])
    if rel in SOURCE_FILES or any(rel.startswith(d + "/") for d in SOURCE_DIRS):
        return rel
    return None


def known_architectures(converter: Path) -> list[str]:
    """The Hugging Face architectures (``config.json``'s ``architectures``) the converter writes as text
    models, read from its own table without importing it."""
    tree = ast.parse((converter / "conversion" / "__init__.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
        if isinstance(target, ast.Name) and target.id == "TEXT_MODEL_MAP" and isinstance(node.value, ast.Dict):
            return sorted(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    raise UsageError(f"{converter}: the converter's table of architectures was not found (a damaged copy: delete it)")


def unknown_architecture(arch: str, known: list[str]) -> str:
    """The one line that says the converter does not know ``arch``, and which it knows."""
    causal = [a for a in known if a.endswith("ForCausalLM")]
    return (
        f"llama.cpp's converter ({CONVERTER_DIST} {CONVERTER_VERSION}) does not know the architecture {arch}; "
        f"it converts {len(known)}, among them {', '.join(causal)}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autoslm.engine.export.converter", description=__doc__.splitlines()[0])
    p.add_argument("root", type=Path, help="folder that gets convert-<version>/")
    p.add_argument("--sdist", type=Path, help="unpack this source distribution instead of downloading it")
    p.add_argument("--keep-sdist", action="store_true", help="keep the downloaded source distribution in ROOT")
    a = p.parse_args(argv)
    if a.sdist is None and (a.keep_sdist or not (converter_dir(a.root) / COMPLETE).exists()):
        a.root.mkdir(parents=True, exist_ok=True)
        existing = sorted(a.root.glob(f"*-{CONVERTER_VERSION}.tar.gz"))
        a.sdist = existing[0] if existing else fetch_sdist(a.root, log=print)
    if a.sdist is not None and not (converter_dir(a.root) / COMPLETE).exists():
        unpack(a.sdist, a.root)
    if a.sdist is not None and not a.keep_sdist and a.sdist.parent == a.root:
        a.sdist.unlink(missing_ok=True)
    print(converter_dir(a.root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
