"""autoslm's own wheel, built from the installed package and shipped through the run's store.

A bootstrap pod (``compute.image = "bootstrap"``) starts from a public image that has no autoslm, and
installs the wheel this module ships. ``build_wheel()`` writes it in-process from the files of the
package being run -- a checkout, an editable install or an installed wheel alike -- with no network,
no build backend and no subprocess (milliseconds). The archive is deterministic (sorted entries, fixed
timestamps), so its sha256 names its content: ``ship_wheel(store)`` puts it at ``data/sha256/<hex>``
once per content, like the data files a run ships (autoslm/store/shipping.py), and returns the
``store:<hex>/<file>.whl`` reference that worker_image/boot.sh fetches.

The wheel carries ``autoslm/_image/`` (``BOOT_FILES`` and requirements-gpu.txt, links
to worker_image/ in a checkout): the pod has no checkout, and installs against those pins; the
controller runs boot_rules.py's decisions and sends boot's Python in a pod's start command.

It must never include anything but the package's own files (Python modules and ``_image/*``: no
dotfiles, caches or stray files from a checkout, no secrets: nothing is read from the environment) and never upload the same content twice.
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
import zipfile
from email.message import Message
from pathlib import Path, PurePosixPath

from autoslm.layout import DATA_PREFIX, data_blob
from autoslm.store.atomic import write_atomic

NAME = "autoslm"
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)
_SKIP_DIRS = {"__pycache__"}
_PACKAGE_SUFFIXES = (".py", ".pyi")


def package_dir() -> Path:
    """The running autoslm package's folder (this file is autoslm/controller/wheel.py)."""
    return Path(__file__).resolve().parents[1]


# boot.sh and the Python of boot (worker_image/): boot.py and the modules beside it that it imports,
# which the start command carries as one program (controller/images.py's ``boot_payload``).
BOOT_FILES = ("boot.sh", "boot.py", "boot_rules.py", "boot_net.py", "boot_install.py")


def image_file(name: str) -> Path:
    """A file of worker_image/ as the package carries it (``autoslm/_image/<name>``)."""
    path = package_dir() / "_image" / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: this autoslm install does not carry worker_image/{name}")
    return path


def _metadata_from_pyproject(pyproject: Path) -> tuple[str, str, str]:
    """(version, METADATA text, entry_points.txt text) from a checkout's pyproject.toml."""
    import tomllib

    project = tomllib.loads(pyproject.read_text())["project"]
    msg = Message()
    msg["Metadata-Version"] = "2.1"
    msg["Name"] = project["name"]
    msg["Version"] = project["version"]
    msg["Summary"] = project.get("description", "")
    if project.get("requires-python"):
        msg["Requires-Python"] = project["requires-python"]
    for dep in project.get("dependencies", []):
        msg["Requires-Dist"] = dep
    for extra, deps in project.get("optional-dependencies", {}).items():
        msg["Provides-Extra"] = extra
        for dep in deps:
            marker = f'extra == "{extra}"'
            msg["Requires-Dist"] = (
                f"{dep}; {marker}"
                if ";" not in dep
                else f"{dep.split(';')[0].strip()}; ({dep.split(';', 1)[1].strip()}) and {marker}"
            )
    scripts = project.get("scripts", {})
    entry_points = "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items()) if scripts else ""
    return project["version"], msg.as_string(), entry_points


def _metadata_installed() -> tuple[str, str, str]:
    from importlib import metadata

    dist = metadata.distribution(NAME)
    return dist.version, dist.read_text("METADATA") or "", dist.read_text("entry_points.txt") or ""


def _is_package_file(rel: PurePosixPath) -> bool:
    """What setuptools would put into the package (pyproject.toml's packages and package-data): Python
    modules and ``_image/*``; never a dotfile, a cache or a stray file left in a checkout."""
    if any(part.startswith(".") or part in _SKIP_DIRS for part in rel.parts):
        return False
    return rel.suffix in _PACKAGE_SUFFIXES or rel.name == "py.typed" or (len(rel.parts) == 2 and rel.parts[0] == "_image")


def _package_files(pkg: Path) -> list[tuple[str, bytes]]:
    out = []
    for path in sorted(pkg.rglob("*")):
        rel = PurePosixPath(path.relative_to(pkg).as_posix())
        if not _is_package_file(rel) or not path.is_file():
            continue
        out.append((f"{NAME}/{rel.as_posix()}", path.read_bytes()))  # read_bytes follows the _image links
    return out


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel_bytes() -> tuple[str, bytes]:
    """(file name, bytes) of a py3-none-any wheel of the running autoslm; the same bytes for the same files."""
    pkg = package_dir()
    pyproject = pkg.parent / "pyproject.toml"
    if pyproject.is_file() and re.search(r'(?m)^name\s*=\s*"autoslm"', pyproject.read_text()):
        version, metadata_text, entry_points = _metadata_from_pyproject(pyproject)
    else:
        version, metadata_text, entry_points = _metadata_installed()
    files = _package_files(pkg)
    for needed in BOOT_FILES:
        if not any(name == f"{NAME}/_image/{needed}" for name, _ in files):
            raise FileNotFoundError(f"{pkg}/_image/{needed} is missing: this autoslm install cannot start a bootstrap pod")
    dist_info = f"{NAME}-{version}.dist-info"
    files.append((f"{dist_info}/METADATA", metadata_text.encode()))
    files.append((f"{dist_info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: autoslm\nRoot-Is-Purelib: true\nTag: py3-none-any\n"))
    if entry_points:
        files.append((f"{dist_info}/entry_points.txt", entry_points.encode()))
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files) + f"{dist_info}/RECORD,,\n"
    files.append((f"{dist_info}/RECORD", record.encode()))

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files:
            info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
            info.external_attr = (0o755 if name.endswith(".sh") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return f"{NAME}-{version}-py3-none-any.whl", buf.getvalue()


def build_wheel(cache_dir: Path) -> tuple[Path, str]:
    """The wheel on disk under ``cache_dir/<sha256>/`` (written once per content); returns (path, sha256)."""
    name, data = build_wheel_bytes()
    sha = hashlib.sha256(data).hexdigest()
    path = Path(cache_dir) / sha / name
    if not path.is_file():
        write_atomic(path, data)  # launches at once write the same bytes: whole, the last one wins
    return path, sha


def ship_wheel(store, cache_dir: Path) -> str:
    """Put the wheel into the run's store once per content; returns its ``store:<sha256>/<file>`` reference."""
    from autoslm.store.shipping import store_ref

    path, sha = build_wheel(cache_dir)
    blob = data_blob(sha)
    # One listing of the shipped files (a single request on the Hub) says whether it is there.
    if blob not in store.list_files(DATA_PREFIX):
        store.commit({blob: path}, message=f"ship {path.name}")
    return store_ref(sha, path.name)
