"""Before anything is rented: does the ``hf:owner/name`` dataset exist, and are its columns usable?

Runs on the laptop (``autoslm plan``, ``autoslm launch``, ``Client.prepare``), where there is no
``datasets``, pyarrow or torch: it asks the Hub with huggingface_hub for the repo's files, picks the
files of the split the way ``datasets`` names them (a ``configs`` section of the README, else file
and folder names such as ``train``/``test``), and reads only the head of one: the first line of a
jsonl file, the header of a csv, the schema in a parquet file's footer. The column rules are those of
``autoslm.envs.rows``, which the worker applies to every row.

It must never download a whole data file, and never call a dataset bad when it could not tell: a
format it cannot read is let through (the worker reports it); the network failing is exit 3.
"""

from __future__ import annotations

import csv
import fnmatch
import io
import json
import re

from autoslm.envs.hub_dataset import PREFIX, HubDatasetParams
from autoslm.envs.parquet_footer import parquet_columns
from autoslm.envs.rows import RowError, missing_columns, rename, to_example
from autoslm.errors import StoreUnavailable, UsageError

# Files datasets can read; only the first four are opened here (the others are let through unread).
DATA_EXTENSIONS = (".parquet", ".jsonl", ".json", ".csv", ".tsv", ".txt", ".arrow", ".gz", ".zst", ".bz2", ".xz", ".zip", ".lz4")
READABLE = (".parquet", ".jsonl", ".json", ".csv")
HEAD_BYTES = 64 * 1024
TIMEOUT_S = 30.0
# The names datasets gives each split's files (datasets.data_files.KEYWORDS_IN_PATH_NAME_BASE_PATTERNS).
SPLIT_WORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}


def check_data(spec, api=None) -> None:
    """Raise UsageError (exit 2) if the spec's Hub dataset (or the one an "autoslm/critique" wraps) is
    missing or unusable, or a Hub dataset its lm-eval tasks read is missing or closed to HF_TOKEN; a
    no-op otherwise."""
    env_id, params = spec.environment.id, spec.environment.params
    if env_id == "autoslm/critique" and isinstance(params.get("data"), str):  # the data the critique wraps
        env_id, params = params["data"], dict(params.get("data_params") or {})
    if env_id.startswith(PREFIX):
        # A judge, or reward functions without the environment's own match, score rows without an answer.
        scored = bool(spec.environment.rewards) and "env" not in spec.environment.rewards
        check_hub_dataset(env_id, params, api=api, judged=spec.environment.judge is not None or scored)
    check_lm_eval_data(spec, api=api)


def check_lm_eval_data(spec, api=None) -> None:
    """Raise UsageError (exit 2) if a Hub dataset an ``[eval] lm_eval`` task reads is missing, gated or
    unreadable with this HF_TOKEN; StoreUnavailable (exit 3) if the Hub cannot be asked. A task that reads
    local files is checked by ``envs.lm_tasks.task_issues``. huggingface_hub's API (a fifth of a second to
    import) is imported only for a task that reads the Hub: a spec without one pays nothing here."""
    if not spec.eval.lm_eval:
        return
    from autoslm.envs.lm_tasks import task_dataset

    for i, ref in enumerate(spec.eval.lm_eval):
        repo = task_dataset(ref)
        if repo is not None:
            if api is None:
                from huggingface_hub import HfApi

                api = HfApi()
            _repo_files(api, repo, None, f"eval.lm_eval.{i} = {ref!r} reads the Hub dataset {repo}", f"{repo} (eval.lm_eval.{i})")


def check_hub_dataset(env_id: str, params: dict, api=None, judged: bool = False) -> dict[str, list[str]]:
    """{split: columns found} for the splits the run reads. Raises UsageError or StoreUnavailable."""
    from huggingface_hub import HfApi

    p = HubDatasetParams.model_validate(params)
    repo = env_id[len(PREFIX) :]
    api = api or HfApi()
    files = _repo_files(api, repo, p.revision, f"environment.id = {env_id}", env_id)
    configs = _configs(api, repo, p.revision, files)
    if not configs and not _data_files(files):
        return {}  # no data file this check knows (a loading script, an exotic layout): the worker will tell
    out = {}
    for split in [p.split] + ([p.eval_split] if p.eval_split else []):
        chosen = split_files(files, split, p.config, configs)
        if not chosen:
            raise UsageError(
                f"environment.id = {env_id}: no data files for split {split!r}"
                + (f" in config {p.config!r}" if p.config else ""),
                hint=f"data files found: {', '.join(_data_files(files)[:8]) or 'none'}",
            )
        readable = [f for f in chosen if f.lower().endswith(READABLE)]
        if not readable:
            continue
        columns, first = _head(api, repo, p.revision, readable[0], env_id)
        if columns is None:
            continue  # a format this check cannot read: the worker will tell
        renamed = set(rename(dict.fromkeys(columns), p.columns))
        problem = missing_columns(renamed, judged)
        if problem:
            raise UsageError(f"environment.id = {env_id} (split {split!r}, {readable[0]}): {problem}")
        if first is not None:
            try:
                to_example(rename(first, p.columns))
            except RowError as e:
                raise UsageError(f"environment.id = {env_id} ({readable[0]}, first row): {e}") from None
        out[split] = sorted(columns)
    return out


def _repo_files(api, repo: str, revision: str | None, where: str, name: str) -> list[str]:
    """The dataset repo's files. ``where`` says which field asked for it; ``name`` is how it was written."""
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        info = api.dataset_info(repo, revision=revision, timeout=TIMEOUT_S)
    except GatedRepoError:
        raise UsageError(
            f"{where}: the dataset is gated",
            hint="accept its terms on the Hub, and set HF_TOKEN to a token of that account",
        ) from None
    except RevisionNotFoundError:
        raise UsageError(f"{where}: no revision {revision!r} (environment.params.revision)") from None
    except RepositoryNotFoundError:
        raise UsageError(
            f"{where}: no such dataset on the Hub, or it is private and HF_TOKEN cannot read it",
            hint="check the id; for a private dataset set HF_TOKEN",
        ) from None
    except HfHubHTTPError as e:
        status = e.response.status_code if getattr(e, "response", None) is not None else None
        if status in (401, 403):
            raise UsageError(
                f"{where}: the Hub refused to show the dataset (HTTP {status})",
                hint="set HF_TOKEN to a token that can read it",
            ) from None
        raise StoreUnavailable(f"Hugging Face Hub: could not look up {name} (HTTP {status})", hint="retry later") from None
    except Exception as e:  # noqa: BLE001 - connection errors and timeouts of the Hub client's transport
        raise StoreUnavailable(
            f"Hugging Face Hub: could not look up {name}: {type(e).__name__}", hint="check the network and HF_ENDPOINT"
        ) from None
    return [s.rfilename for s in info.siblings or []]


def _data_files(files: list[str]) -> list[str]:
    return sorted(f for f in files if f.lower().endswith(DATA_EXTENSIONS) and not f.startswith("."))


def _configs(api, repo: str, revision: str | None, files: list[str]) -> list[dict] | None:
    """The README's YAML ``configs`` list, if it has one."""
    if "README.md" not in files:
        return None
    try:
        text = _read(api, repo, revision, "README.md", None).decode("utf-8", "replace")
    except Exception:  # noqa: BLE001 - no card: fall back to file names, as datasets does
        return None
    m = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", text, re.DOTALL)
    if not m:
        return None
    try:
        import yaml

        meta = yaml.safe_load(m.group(1)) or {}
    except Exception:  # noqa: BLE001
        return None
    configs = meta.get("configs") if isinstance(meta, dict) else None
    return configs if isinstance(configs, list) and configs else None


def split_files(files: list[str], split: str, config: str | None, configs: list[dict] | None) -> list[str]:
    """The data files ``datasets`` would read for ``split`` (the common layouts, not every rule)."""
    data = _data_files(files)
    if configs:
        chosen = (
            next((c for c in configs if c.get("config_name") == config), None)
            if config
            else (
                next((c for c in configs if c.get("default")), None)
                or next((c for c in configs if c.get("config_name") == "default"), None)
                or configs[0]
            )
        )
        if chosen is None:
            return []
        patterns = chosen.get("data_files")
        if patterns is None:  # a config by folder (data_dir): the usual file names inside it
            folder = str(chosen.get("data_dir") or "").strip("/")
            return split_files([f for f in data if not folder or f.startswith(folder + "/")], split, None, None)
        if isinstance(patterns, (str, list)) and not (isinstance(patterns, list) and patterns and isinstance(patterns[0], dict)):
            patterns = [{"split": "train", "path": patterns}]
        for entry in patterns or []:
            if isinstance(entry, dict) and entry.get("split") == split:
                paths = entry.get("path")
                paths = [paths] if isinstance(paths, str) else list(paths or [])
                return [f for f in data if any(fnmatch.fnmatch(f, pat) for pat in paths)]
        return []
    if config:
        under = [f for f in data if f.split("/")[0] == config]
        data = under or data
    words = SPLIT_WORDS.get(split, (split,))
    named = [f for f in data if _names_split(f, words)]
    if named:
        return named
    if split == "train" and not any(_names_split(f, ws) for ws in SPLIT_WORDS.values() for f in data):
        return data  # no file names a split: everything is train
    return []


def _names_split(path: str, words) -> bool:
    return any(re.search(rf"(^|[/_.\-]){re.escape(w)}([/_.\-]|\d|$)", path) for w in words)


def _head(api, repo, revision, path, env_id) -> tuple[list[str] | None, dict | None]:
    """(columns, first row or None) of a data file, from its first or last bytes only."""
    low = path.lower()
    try:
        if low.endswith((".jsonl", ".json")):
            head = _read(api, repo, revision, path, (0, HEAD_BYTES - 1))
            if low.endswith(".json") and head.lstrip()[:1] == b"[":
                return None, None  # a JSON array: its first object cannot be cut out reliably
            line = head.split(b"\n", 1)[0]
            if not line.strip():
                raise UsageError(f"environment.id = {env_id}: {path} starts with an empty line or is empty")
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                if len(head) >= HEAD_BYTES and b"\n" not in head:
                    return None, None  # a first line longer than what was read: let the worker judge
                raise UsageError(f"environment.id = {env_id}: {path}:1: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise UsageError(f"environment.id = {env_id}: {path}:1: each line must be a JSON object")
            return list(row), row
        if low.endswith(".csv"):
            head = _read(api, repo, revision, path, (0, HEAD_BYTES - 1)).decode("utf-8", "replace")
            return next(csv.reader(io.StringIO(head.split("\n", 1)[0])), []), None
        if low.endswith(".parquet"):
            return parquet_columns(
                lambda start, end: _read(api, repo, revision, path, (start, end)), _size(api, repo, revision, path)
            ), None
    except (UsageError, StoreUnavailable):
        raise
    except Exception:  # noqa: BLE001 - a file this check cannot read (ParquetError, a 404 in a race): let it through
        return None, None
    return None, None


def _read(api, repo, revision, path, byte_range) -> bytes:
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url = hf_hub_url(repo, path, repo_type="dataset", revision=revision, endpoint=api.endpoint)
    headers = build_hf_headers(token=api.token)
    if byte_range is not None:
        headers["Range"] = f"bytes={byte_range[0]}-{byte_range[1]}"
    try:
        r = get_session().get(url, headers=headers, follow_redirects=True, timeout=TIMEOUT_S)
    except Exception as e:  # noqa: BLE001 - httpx or httpx2 transport errors
        raise StoreUnavailable(f"Hugging Face Hub: could not read {path} of {repo}: {type(e).__name__}") from None
    if r.status_code == 416:
        return b""  # a range past the end: the file is empty
    if r.status_code >= 500 or r.status_code == 429:
        raise StoreUnavailable(f"Hugging Face Hub: reading {path} of {repo} failed (HTTP {r.status_code})")
    hf_raise_for_status(r)
    return r.content


def _size(api, repo, revision, path) -> int:
    from autoslm.store.hf import install_client_factory

    install_client_factory()  # get_paths_info takes no timeout: give the shared client one
    infos = api.get_paths_info(repo, [path], repo_type="dataset", revision=revision)
    return int(infos[0].size)
