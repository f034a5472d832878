"""Local data files travel with the run, through its artifact store.

On the laptop, ``ship_local_files(spec, store)`` runs at launch, before anything is rented: every
local file the spec names (a ``jsonl:`` dataset, ``environment.params.eval_path``, a reward file of
``environment.rewards``, up to ``MAX_REWARD_FILE_BYTES``, as the bytes its check ran) is put into the
store at ``data/sha256/<hex>`` (``autoslm.layout.data_blob``), unless that content is already there,
and the spec the worker gets names the copy instead: ``store:<hex>/<file name>``. On the worker,
``DataFiles`` fetches such a reference from the run's store, checks its sha256 and hands the
environment a local path; the laptop's path is never read there.

It must never ship a file above ``MAX_SHIP_BYTES`` (that is what a Hub dataset is for) and never
upload the same content twice.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from autoslm.errors import FatalWorkerError, UsageError
from autoslm.layout import DATA_PREFIX, data_blob, is_store_ref, store_ref
from autoslm.store.artifacts import sha256_of
from autoslm.store.atomic import write_atomic

MAX_SHIP_BYTES = 256 * 1024 * 1024
_REF = re.compile(r"^store:([0-9a-f]{64})/([^/\\]+)$")


def parse_store_ref(ref: str) -> tuple[str, str]:
    m = _REF.match(ref)
    if not m:
        raise FatalWorkerError(f"not a reference to a shipped file (want store:<sha256>/<name>): {ref!r}")
    return m.group(1), m.group(2)


def ship_file(path: Path, store, field: str, limit: int = MAX_SHIP_BYTES, data: bytes | None = None) -> str:
    """Put one local file into the store (once per content); returns its ``store:`` reference. ``data``:
    the file's content as already read (and checked), shipped instead of what the file holds now."""
    try:
        size = path.stat().st_size if data is None else len(data)
    except FileNotFoundError:
        raise UsageError(f"{field}: file not found: {path}") from None
    if size > limit:
        raise UsageError(
            f"{field}: {path} is {size / 2**20:.0f} MiB, above the {limit / 2**20:.0f} MiB that travel with a run",
            hint='push it to the Hub as a dataset (huggingface_hub upload_file) and use environment.id = "hf:owner/name"',
        )
    sha = sha256_of(path) if data is None else hashlib.sha256(data).hexdigest()
    blob = data_blob(sha)
    # One listing of the shipped files (a single request on the Hub) says whether it is there.
    if blob not in store.list_files(DATA_PREFIX):
        store.commit({blob: path if data is None else data}, message=f"ship {path.name}")
    return store_ref(sha, path.name)


def ship_local_files(spec, store):
    """The spec with every local data file replaced by a reference to the store's copy (also the data
    an "autoslm/critique" task wraps)."""
    env = spec.environment
    env_id, params = _ship_data(env.id, dict(env.params), store, "environment")
    if env_id == "autoslm/critique" and isinstance(params.get("data"), str):
        data, data_params = _ship_data(params["data"], dict(params.get("data_params") or {}), store, "environment.params.data")
        if data != params["data"] or data_params != dict(params.get("data_params") or {}):
            params = {**params, "data": data, "data_params": data_params}
    rewards = [_ship_reward(text, store, f"environment.rewards.{i}") for i, text in enumerate(env.rewards)]
    tasks = [_ship_task(t, store, f"eval.lm_eval.{i}") for i, t in enumerate(spec.eval.lm_eval)]
    if tasks != list(spec.eval.lm_eval):
        spec = spec.model_copy(update={"eval": spec.eval.model_copy(update={"lm_eval": tasks})})
    if env_id == env.id and params == dict(env.params) and rewards == list(env.rewards):
        return spec
    return spec.model_copy(update={"environment": env.model_copy(update={"id": env_id, "params": params, "rewards": rewards})})


def _ship_task(ref: str, store, field: str) -> str:
    """An lm-eval task YAML travels like a data file (the data it names must be reachable from the pod:
    a Hub dataset, or a path the pod has)."""
    from autoslm.recipes.harness import is_task_file

    if not is_task_file(ref) or is_store_ref(ref):
        return ref
    from autoslm.envs.reward_refs import MAX_REWARD_FILE_BYTES

    return ship_file(Path(ref), store, field, limit=MAX_REWARD_FILE_BYTES)


def _ship_reward(text: str, store, field: str) -> str:
    """A reward file's reference with its path replaced by the store's copy (others unchanged): the bytes
    its check ran when it was checked in this process (a rewrite since is not what was checked)."""
    from autoslm.envs.reward_check import checked_source
    from autoslm.envs.reward_refs import MAX_REWARD_FILE_BYTES, parse_reward, with_path

    ref = parse_reward(text)
    if ref.kind != "file" or is_store_ref(ref.path):
        return text
    path = Path(ref.path).expanduser()
    return with_path(ref, ship_file(path, store, field, limit=MAX_REWARD_FILE_BYTES, data=checked_source(path)))


def _ship_data(env_id: str, params: dict, store, where: str) -> tuple[str, dict]:
    """(id, params) with a local ``jsonl:`` file and ``eval_path`` shipped; ``where`` names the field."""
    id_field = "environment.id" if where == "environment" else where
    params_field = "environment.params" if where == "environment" else "environment.params.data_params"
    if env_id.startswith("jsonl:") and not is_store_ref(env_id[len("jsonl:") :]):
        env_id = "jsonl:" + ship_file(Path(env_id[len("jsonl:") :]).expanduser(), store, id_field)
    eval_path = params.get("eval_path")
    if isinstance(eval_path, str) and not is_store_ref(eval_path):
        params = {**params, "eval_path": ship_file(Path(eval_path).expanduser(), store, f"{params_field}.eval_path")}
    return env_id, params


class DataFiles:
    """Worker side: a data reference from the spec -> a local file to read."""

    def __init__(self, store, workdir: Path):
        self.store = store
        self.workdir = Path(workdir)

    def local_path(self, ref: str) -> tuple[Path, str]:
        """(local path, the name errors use). A plain path is returned as it is."""
        if not is_store_ref(ref):
            return Path(ref).expanduser(), ref
        sha, name = parse_store_ref(ref)
        dest = self.workdir / sha / name
        if dest.is_file():
            return dest, name
        # StoreUnavailable (could not tell) propagates: that one is worth a retry.
        data = self.store.read_bytes(data_blob(sha))
        if data is None:
            raise FatalWorkerError(
                f"{name}: the run's copy is missing from the store ({data_blob(sha)} in {self.store.uri})",
                hint="launch the run again from the machine that has the file",
            )
        if hashlib.sha256(data).hexdigest() != sha:
            raise FatalWorkerError(f"{name}: the run's copy in the store ({data_blob(sha)}) does not match its sha256")
        write_atomic(dest, data)  # ranks at once fetch the same file: whole, the last one wins
        return dest, name
