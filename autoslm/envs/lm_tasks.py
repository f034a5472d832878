"""Which lm-evaluation-harness tasks exist: the check behind ``[eval] lm_eval`` (spec.py), run on the
laptop before anything is rented and again by the worker before it trains.

A task name is looked up in the task list of the lm-eval this Python has: its ``tasks/`` folder read as
text (names, groups and tags, in the YAML files and in the extensionless files they ``include``, which
carry tags too), without importing lm-eval, whose own index takes 10-20 CPU-seconds to build. For the
pinned release that text holds every name of lm-eval's index (a test proves it), so a name it lacks is
refused at once; another release's index is asked about such a name. Where lm-eval is not installed
here the name cannot be checked on the laptop: the worker, which has it, checks it before training starts. A task YAML must be a file (``store:`` copies, which
``autoslm launch`` made of one, are checked by their digest when fetched).
"""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

from autoslm.recipes.harness import TASK_NAME, is_task_file

_NAMED = re.compile(r"""^[ \t]*-?[ \t]*["']?(?:task|group|tag)["']?:[ \t]*(\S.*?)[ \t]*$""", re.M)
_LISTED = re.compile(r"""^\s*-\s*["']?([A-Za-z0-9_.\-]+)["']?\s*$""")


def lm_eval_root() -> Path | None:
    """The installed lm-eval's task folder, or None."""
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]) / "tasks"
    return root if root.is_dir() else None


def _declaring_files(root: Path):
    """The files under ``root`` that can declare a name: task YAMLs, and the extensionless files they
    ``include`` (``_base_yaml``, ``eus_exams``: lm-eval reads those only through an include, and the
    including task takes their tags)."""
    for path in root.rglob("*"):
        if path.suffix == ".yaml" or (path.suffix == "" and path.is_file()):
            yield path


@functools.lru_cache(maxsize=2)
def known_tasks(root: Path) -> frozenset[str]:
    """Every task, group and tag name the task files under ``root`` declare."""
    names: set[str] = set()
    for path in _declaring_files(root):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for m in _NAMED.finditer(text):
            value = m.group(1).strip("'\"")
            if value.startswith("["):  # tag: [a, b]
                names.update(v.strip(" '\"") for v in value.strip("[]").split(","))
            elif value:
                names.add(value)
        lines = text.splitlines()
        for i, line in enumerate(lines):  # tag:\n  - a\n  - b
            if line.rstrip().replace('"', "").replace("'", "") in ("tag:", "task:", "group:"):
                for nxt in lines[i + 1 :]:
                    m = _LISTED.match(nxt)
                    if not m:
                        break
                    names.add(m.group(1))
    return frozenset(names)


@functools.lru_cache(maxsize=1)
def _index() -> frozenset[str] | None:
    try:
        from lm_eval.tasks import TaskManager
    except ImportError:  # a broken install: the worker checks again
        return None
    return frozenset(TaskManager().all_tasks)


def _indexed(name: str) -> bool:
    """Whether lm-eval's own index has ``name``: asked only for a name the text did not declare, and only
    of a release other than the pinned one (whose index the text is proven to cover)."""
    from importlib.metadata import PackageNotFoundError, version

    from autoslm.recipes.harness import LM_EVAL_VERSION

    try:
        if version("lm_eval") == LM_EVAL_VERSION:
            return False
    except PackageNotFoundError:
        pass
    index = _index()
    return index is None or name in index


LOCAL_BUILDERS = ("json", "csv", "parquet", "text", "arrow")
_TASK_LINE = re.compile(r"""^task:[ \t]*["']?([A-Za-z0-9_.\-]+)["']?[ \t]*$""", re.M)


@functools.lru_cache(maxsize=2)
def task_files(root: Path) -> dict[str, Path]:
    """{task name: the YAML that defines it} for the tasks under ``root`` (a top-level ``task:`` line;
    groups and tags, which gather other tasks, are not here)."""
    out: dict[str, Path] = {}
    for path in sorted(root.rglob("*.yaml")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for m in _TASK_LINE.finditer(text):
            out.setdefault(m.group(1), path)
    return out


def task_dataset(ref: str, root: Path | None = None) -> str | None:
    """The Hub dataset an ``[eval] lm_eval`` entry reads (its YAML's ``dataset_path``, through the files
    it ``include``s), or None: local data, a group of tasks, a name this lm-eval does not define in a
    file of its own, no lm-eval here, or a YAML that cannot be read (``task_issues`` says so)."""
    if ref.startswith("store:"):
        return None
    if is_task_file(ref):
        path: Path | None = Path(ref)
    else:
        root = root if root is not None else lm_eval_root()
        path = task_files(root).get(ref) if root is not None else None
    for _ in range(8):  # include: chains are short; a loop is cut off
        if path is None or not path.is_file():
            return None
        try:
            task = _read_task_file(path)
        except Exception:  # noqa: BLE001 - task_issues names a YAML that cannot be read
            return None
        dataset = task.get("dataset_path")
        if isinstance(dataset, str) and dataset:
            return None if dataset in LOCAL_BUILDERS or Path(dataset).is_absolute() else dataset
        included = task.get("include")
        path = path.parent / included if isinstance(included, str) else None
    return None


def _read_task_file(path: Path) -> dict:
    """A task YAML as data (lm-eval's ``!function`` tags read as their text)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor(
        "!", lambda loader, suffix, node: loader.construct_scalar(node) if isinstance(node, yaml.ScalarNode) else None
    )
    data = yaml.load(path.read_text(), Loader=Loader)  # noqa: S506 (a SafeLoader subclass)
    return data if isinstance(data, dict) else {}


def data_files(task: dict) -> list[str]:
    """The local files a task reads (``dataset_path: json`` and the like with ``data_files``)."""
    if task.get("dataset_path") not in LOCAL_BUILDERS:
        return []
    files = (task.get("dataset_kwargs") or {}).get("data_files")
    if isinstance(files, dict):
        files = [f for v in files.values() for f in (v if isinstance(v, list) else [v])]
    elif isinstance(files, str):
        files = [files]
    return [str(f) for f in files or [] if isinstance(f, str) and "://" not in f]


def task_file_issues(path: Path, field: str, remote: str | None) -> list[tuple[str, str]]:
    """A task YAML's data: a local file it reads must exist here, and cannot be read on a rented pod
    (``remote``: the providers' names, or None for a local run)."""
    try:
        task = _read_task_file(path)
    except Exception as e:  # a YAML error: lm-eval would refuse it too
        return [(field, f"task file {path} is not YAML lm-eval can read: {str(e).splitlines()[0]}")]
    out = []
    for f in data_files(task):
        p = Path(f).expanduser()
        p = p if p.is_absolute() else path.parent / p
        if remote:
            out.append(
                (
                    field,
                    f"task file {path.name} reads the local file {f}, which a {remote} pod cannot reach: put the data "
                    "in a Hub dataset (dataset_path: owner/name), or score the run here with `autoslm eval RUN --lm-eval FILE`",
                )
            )
        elif not p.is_file():
            out.append((field, f"task file {path.name} reads {f}, which does not exist"))
    return out


def task_issues(refs: list[str], root: Path | None = None, remote: str | None = None) -> list[tuple[str, str]]:
    """(field, message) for each ``[eval] lm_eval`` entry that names no task, or a task file whose data
    cannot be read where the harness runs (``remote``: the pod's providers; None: this machine)."""
    out = []
    installed = root is None  # lm-eval's own folder: a name its text does not declare is looked up in its index
    root = root if root is not None else lm_eval_root()
    for i, ref in enumerate(refs):
        field = f"eval.lm_eval.{i}"
        if is_task_file(ref):
            if ref.startswith("store:"):
                continue
            if not Path(ref).is_file():
                out.append(
                    (
                        field,
                        f"task file {ref} does not exist: put the task YAML in the spec's folder (a path relative to the spec) "
                        "or name one of lm-eval's tasks (`lm-eval ls tasks`)",
                    )
                )
            else:
                out += task_file_issues(Path(ref), field, remote)
            continue
        if not TASK_NAME.match(ref):
            out.append((field, f"{ref!r} is neither an lm-eval task name nor a task YAML (*.yaml) path"))
        elif root is not None and ref not in known_tasks(root) and not (installed and _indexed(ref)):
            out.append(
                (
                    field,
                    f"{ref!r} is not a task of lm-eval (`lm-eval ls tasks` lists them; a task of your own: a YAML file "
                    'in the spec\'s folder, e.g. lm_eval = ["my_task.yaml"])',
                )
            )
    return out
