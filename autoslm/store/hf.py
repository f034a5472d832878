"""A Hugging Face dataset repo as the artifact store: ``hf://owner/repo``.

For: moving a run's bytes to and from a Hub dataset repo with huggingface_hub, under the Store
contract of ``autoslm.store.base``. It must never: wait on the network without a timeout; report
"could not tell" as "not there" (a network error, timeout, 429 or 5xx raises StoreUnavailable, never
None or []); put a token into an exception message or a file.

How it meets that:
- Timeouts. huggingface_hub's shared HTTP client has none by default. ``install_client_factory``
  gives it one (``FALLBACK_TIMEOUT_S``) plus a request hook that applies this store's ``timeout`` to
  every request made while one of its calls runs (the library passes ``timeout=None`` explicitly in
  places, which would otherwise win). LFS uploads that the library runs on its own worker threads
  get the fallback.
- Retries. The library does not retry the commit POST; inside a commit it retries preupload, LFS
  batch and LFS PUT itself (up to five times, ~25 s of sleeps). Reads here (resolve, tree, revision)
  go straight through the library's session, so each is one request. Every operation is then
  retried ``max_attempts`` times with exponential backoff on 429/5xx/timeouts, honouring Retry-After
  up to ``max_backoff_s`` (a longer one is raised at once with ``retry_after`` set, for the caller
  to honour).
- A retried commit is safe to repeat: additions are whole files (the client skips those already
  there) and deletions are checked afresh each attempt (paths-info for files, the folder's tree for
  folders), because the Hub fails a commit that deletes a path that is not there (404 EntryNotFound).
- Reads of ``main`` are single requests; ``download`` pins one commit so that a concurrent commit
  cannot mix two checkpoints in one download.

Xet: with hf_xet installed the library uploads LFS files through xet (the Hub's default). Set
``HF_HUB_DISABLE_XET=1`` before huggingface_hub is imported to force the plain LFS path (a Hub mirror
or the test suite's fake Hub, which do not speak xet). This module leaves that choice to the
environment.
"""

from __future__ import annotations

import contextvars
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import TypeVar
from urllib.parse import quote

import huggingface_hub
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
from huggingface_hub.errors import HfHubHTTPError, RemoteEntryNotFoundError, RepositoryNotFoundError
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

try:  # huggingface_hub 1.x/2.x speak httpx2 (a fork of httpx with the same API)
    import httpx2 as _httpx
except ImportError:  # pragma: no cover - older clients use httpx
    import httpx as _httpx

from autoslm.errors import StoreAuthError, StoreError, StoreUnavailable
from autoslm.secrets import REDACTED, redact
from autoslm.store.atomic import atomic_file
from autoslm.store.base import Content

T = TypeVar("T")

REPO_TYPE = "dataset"
REVISION = "main"
# Applies to Hub requests made outside an HfStore call (model downloads in the worker, say) once the
# factory is installed: generous, but not forever.
FALLBACK_TIMEOUT_S = 120.0
_NOT_THERE_CODES = ("EntryNotFound", "RepoNotFound", "RevisionNotFound")
_REPO_ID_RE = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")

_call_timeout: contextvars.ContextVar[float | None] = contextvars.ContextVar("autoslm_hf_timeout", default=None)
_factory_lock = threading.Lock()
_factory_installed = False


def _apply_call_timeout(request) -> None:
    timeout = _call_timeout.get()
    if timeout is not None:
        request.extensions = {**request.extensions, "timeout": _httpx.Timeout(timeout).as_dict()}


def _client_factory():
    # Start from the library's own client (its request hook handles offline mode and request ids).
    from huggingface_hub.utils import _http as hf_http

    base = getattr(hf_http, "default_client_factory", None)
    client = base() if base is not None else _httpx.Client(follow_redirects=True)
    client.timeout = _httpx.Timeout(FALLBACK_TIMEOUT_S)
    hooks = client.event_hooks
    client.event_hooks = {
        "request": [*hooks.get("request", []), _apply_call_timeout],
        "response": list(hooks.get("response", [])),
    }
    return client


def install_client_factory() -> None:
    """Give huggingface_hub's shared HTTP client timeouts (idempotent; process-wide)."""
    global _factory_installed
    with _factory_lock:
        if not _factory_installed:
            huggingface_hub.set_client_factory(_client_factory)
            _factory_installed = True


@contextmanager
def _timeout(seconds: float):
    token = _call_timeout.set(seconds)
    try:
        yield
    finally:
        _call_timeout.reset(token)


def _error_chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _retry_after(response) -> float | None:
    value = (response.headers.get("Retry-After") or "").strip() if response is not None else ""
    return float(value) if value.isdigit() else None


def _not_there(response) -> bool:
    return response.status_code == 404 and response.headers.get("X-Error-Code") in _NOT_THERE_CODES


class HfStore:
    """A Hugging Face dataset repo as a Store. Thread-safe: it keeps no per-call state."""

    def __init__(
        self,
        repo_id: str,
        *,
        token: str | None = None,
        endpoint: str | None = None,
        private: bool = True,
        timeout: float = 30.0,
        create: bool = True,
        max_attempts: int = 3,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ):
        """``token``: default HF_TOKEN or the saved ``hf auth login`` (resolved per call by the library).
        ``endpoint``: default $HF_ENDPOINT, read now (the library reads it only at import).
        ``create``: the first write creates the repo (private unless ``private=False``) if it is missing.
        """
        repo_id = repo_id.strip("/")
        if not _REPO_ID_RE.match(repo_id):
            raise ValueError(f'Hugging Face repo must look like "owner/name", got {repo_id!r}')
        self.repo_id = repo_id
        self.uri = f"hf://{repo_id}"
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
        self.private = private
        self.timeout = float(timeout)
        self.create = create
        self.max_attempts = max(1, int(max_attempts))
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._sleep = sleep
        self._token = token or None
        install_client_factory()
        self._api = HfApi(endpoint=self.endpoint, token=self._token, library_name="autoslm")

    def __repr__(self) -> str:  # never the token
        return f"HfStore({self.repo_id!r}, endpoint={self.endpoint!r})"

    # -- Store protocol -----------------------------------------------------------------------------
    def read_bytes(self, path: str) -> bytes | None:
        path = path.strip("/")
        url = self._resolve_url(path, REVISION)

        def get() -> bytes | None:
            r = get_session().get(url, headers=self._headers())
            if _not_there(r):
                return None
            hf_raise_for_status(r)
            return r.content

        return self._run(f"read {path}", get)

    def exists(self) -> bool:
        """The repo has a main branch this token can read (the Hub answers a repo it hides as missing)."""
        return self._run("resolve main", self._head_sha) is not None

    def list_files(self, prefix: str) -> list[str]:
        prefix = prefix.strip("/")
        return sorted(p for p, _ in self._run(f"list {prefix or '/'}", lambda: self._tree(prefix, REVISION)))

    def commit(self, add: Mapping[str, Content], delete: Iterable[str] = (), message: str = "autoslm") -> None:
        add = {p.strip("/"): c for p, c in add.items()}
        delete = [d.lstrip("/") for d in delete]
        for content in add.values():
            if not isinstance(content, bytes) and not Path(content).is_file():
                raise FileNotFoundError(f"cannot commit {content}: not a file")
        if not add and not delete:
            return
        self._run(f"commit '{message}'", lambda: self._commit(add, delete, message or "autoslm"))

    def append_text(self, path: str, text: str) -> None:
        # The Hub has no append: read and rewrite in one commit. Only one writer appends to a file
        # (a replica's own events), so there is no lost update to guard against.
        old = self.read_bytes(path) or b""
        if old and not old.endswith(b"\n"):
            old += b"\n"  # a torn last line from a crash must not swallow the next record
        self.commit({path: old + text.encode()}, message=f"append {PurePosixPath(path).name}")

    def download(self, prefix: str, dest: Path) -> Path:
        dest = Path(dest)
        prefix = prefix.strip("/")
        sha = self._run("resolve main", self._head_sha)
        if sha is None:
            return dest
        files = self._run(f"list {prefix or '/'}", lambda: self._tree(prefix, sha))
        for path, _size in files:
            rel = path[len(prefix) + 1 :] if prefix else path
            if not rel or any(part in ("", ".", "..") for part in rel.split("/")):
                raise StoreError(f"refusing to download {path!r} from {self.repo_id}: not a plain relative path")
            out = dest / rel
            self._run(f"download {path}", lambda: self._download(path, sha, out))  # noqa: B023 - called in this iteration
        return dest

    # -- repo ---------------------------------------------------------------------------------------
    def ensure_repo(self, private: bool | None = None) -> None:
        """Create the dataset repo if it is missing (private unless ``private`` or this store says otherwise)."""
        if private is not None:
            self.private = private
        self._run("create repo", self._create_repo)

    def _create_repo(self) -> None:
        self._api.create_repo(self.repo_id, repo_type=REPO_TYPE, private=self.private, exist_ok=True)

    # -- one attempt of each operation ---------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        return build_hf_headers(token=self._token, library_name="autoslm")

    def _resolve_url(self, path: str, revision: str) -> str:
        return f"{self.endpoint}/datasets/{self.repo_id}/resolve/{quote(revision, safe='')}/{quote(path, safe='/')}"

    def _head_sha(self) -> str | None:
        url = f"{self.endpoint}/api/datasets/{self.repo_id}/revision/{REVISION}"
        r = get_session().get(url, headers=self._headers())
        if _not_there(r):
            return None
        hf_raise_for_status(r)
        return r.json()["sha"]

    def _tree(self, prefix: str, revision: str) -> list[tuple[str, int]]:
        url = f"{self.endpoint}/api/datasets/{self.repo_id}/tree/{quote(revision, safe='')}"
        if prefix:
            url += "/" + quote(prefix, safe="")
        params: dict | None = {"recursive": "true", "expand": "false"}
        files: list[tuple[str, int]] = []
        while url:
            r = get_session().get(url, params=params, headers=self._headers())
            if _not_there(r):
                return []
            hf_raise_for_status(r)
            for entry in r.json():
                if entry.get("type") == "file":
                    files.append((entry["path"], int(entry.get("size") or 0)))
            url = r.links.get("next", {}).get("url")
            params = None  # the next-page link carries the query
        return files

    def _download(self, path: str, revision: str, out: Path) -> None:
        with get_session().stream("GET", self._resolve_url(path, revision), headers=self._headers()) as r:
            if r.status_code >= 400:
                r.read()
                hf_raise_for_status(r)
            with atomic_file(out) as f:
                for chunk in r.iter_bytes(1 << 20):
                    f.write(chunk)

    def _commit(self, add: dict[str, Content], delete: list[str], message: str) -> None:
        try:
            self._commit_once(add, delete, message)
        except RepositoryNotFoundError as e:
            if e.response is None or e.response.status_code != 404:
                raise
            if not add:
                return  # nothing to delete in a repo that does not exist
            if not self.create:
                raise
            self._create_repo()
            self._commit_once(add, delete, message)
        except RemoteEntryNotFoundError:
            if not delete:
                raise
            # Someone deleted a path between our listing and the commit: list again, once.
            self._commit_once(add, delete, message)

    def _commit_once(self, add: dict[str, Content], delete: list[str], message: str) -> None:
        # Fresh operation objects every attempt: the library mutates them and refuses to reuse them.
        ops: list = [
            CommitOperationAdd(path_in_repo=p, path_or_fileobj=c if isinstance(c, bytes) else str(c)) for p, c in add.items()
        ]
        for path, is_folder in self._existing(delete):
            ops.append(CommitOperationDelete(path_in_repo=path, is_folder=is_folder))
        if not ops:
            return
        self._api.create_commit(self.repo_id, ops, commit_message=message, repo_type=REPO_TYPE, revision=REVISION)

    def _existing(self, delete: list[str]) -> list[tuple[str, bool]]:
        """The deletions that name something there now, as (path, is_folder)."""
        files = [d for d in delete if not d.endswith("/")]
        present: set[str] = set()
        if files:
            present = {e.path for e in self._api.get_paths_info(self.repo_id, files, repo_type=REPO_TYPE, revision=REVISION)}
        out = [(d, False) for d in files if d in present]
        out += [(d, True) for d in delete if d.endswith("/") and self._folder_exists(d.rstrip("/"))]
        return out

    def _folder_exists(self, path: str) -> bool:
        url = f"{self.endpoint}/api/datasets/{self.repo_id}/tree/{REVISION}/{quote(path, safe='')}"
        r = get_session().get(url, params={"recursive": "false", "expand": "false"}, headers=self._headers())
        if _not_there(r):
            return False
        hf_raise_for_status(r)
        return bool(r.json())

    # -- errors and retries ---------------------------------------------------------------------------
    def _run(self, what: str, fn: Callable[[], T]) -> T:
        attempt = 0
        while True:
            attempt += 1
            try:
                with _timeout(self.timeout):
                    return fn()
            except StoreError:
                raise
            except Exception as e:  # noqa: BLE001 - translated below; anything unknown is re-raised as is
                translated = self._translate(e, what)
                if translated is None:
                    raise
                err, transient = translated
            retry_after = getattr(err, "retry_after", None)
            if not transient or attempt >= self.max_attempts:
                raise err from None
            if retry_after is not None and retry_after > self.max_backoff_s:
                raise err from None  # the caller (the uploader) honours long waits without holding us
            wait = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
            self._sleep(max(wait, retry_after or 0.0))

    def _translate(self, exc: BaseException, what: str) -> tuple[StoreError, bool] | None:
        where = f"Hugging Face Hub: {what} in {self.repo_id}"
        for e in _error_chain(exc):
            if isinstance(e, HfHubHTTPError) and getattr(e, "response", None) is not None:
                response = e.response
                status = response.status_code
                server = self._clean(getattr(e, "server_message", None) or "")
                detail = f"HTTP {status}" + (f": {server}" if server else "")
                if status in (401, 403):
                    hint = (
                        "set HF_TOKEN to a token with write access to this repo"
                        if self._token is None and not os.environ.get("HF_TOKEN")
                        else "check that the token can write to this repo"
                    )
                    return StoreAuthError(self._clean(f"{where} refused ({detail})"), hint=hint), False
                if status in (408, 429) or status >= 500:
                    err = StoreUnavailable(
                        self._clean(f"{where} failed ({detail})"), hint="the Hub is rate limiting or unwell; retry later"
                    )
                    err.retry_after = _retry_after(response)
                    return err, True
                if status == 404 and response.headers.get("X-Error-Code") == "RepoNotFound":
                    return StoreError(
                        self._clean(f"{where}: the repo does not exist on {self.endpoint}"),
                        hint="create the dataset repo first, or open the store with create=True",
                    ), False
                if status == 404:
                    # Reads answer "not there" themselves; a 404 that gets here is not one we understand.
                    return StoreUnavailable(self._clean(f"{where}: unexpected {detail}")), False
                return StoreError(self._clean(f"{where} was rejected ({detail})")), False
            if isinstance(e, _httpx.TimeoutException):
                return StoreUnavailable(
                    self._clean(f"{where} timed out after {self.timeout:g}s"), hint="the Hub did not answer in time; retry later"
                ), True
            if isinstance(e, (_httpx.TransportError, ConnectionError)):
                return StoreUnavailable(
                    self._clean(f"{where} failed: {type(e).__name__}: {e}"),
                    hint=f"check the network and HF_ENDPOINT ({self.endpoint})",
                ), True
            if isinstance(e, json.JSONDecodeError):
                return StoreUnavailable(self._clean(f"{where}: the server's answer was not JSON")), True
        return None

    def _clean(self, text: str) -> str:
        text = " ".join(str(text).split())[:500]
        if self._token:
            text = text.replace(self._token, REDACTED)
        return redact(text)
