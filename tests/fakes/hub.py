"""A fake Hugging Face Hub on 127.0.0.1 that the real ``huggingface_hub`` client talks to.

For tests and benchmarks: the real client (HfApi, create_commit, hf_hub_download, snapshot_download)
and autoslm's HfStore upload to and download from this server, so the whole Hub path runs here with
only the far end replaced. It must never listen beyond 127.0.0.1, never write anything to disk (repos
live in memory) and never keep a token anywhere but in memory (``authorizations`` is for asserting
that a token *was sent*).

Run it by hand with ``python -m tests.fakes.hub --port 8123`` (prints the endpoint to use as
``HF_ENDPOINT``). In tests use the ``fake_hub`` fixture (import it into the test module or a
conftest: ``from tests.fakes.hub import fake_hub``) or ``with FakeHub(token=...) as hub:``.

What it speaks (huggingface_hub 2.4's wire format, read from the client's source):

- ``POST /api/repos/create``; ``GET /api/{type}s/{repo}[/revision/{rev}]`` (repo info, siblings);
  ``GET /api/whoami-v2``; ``POST /api/validate-yaml`` (a model card's metadata: must parse as a YAML
  mapping; the real Hub also checks each field against its schema).
- ``POST /api/{type}s/{repo}/preupload/{rev}`` answering "regular" or "lfs" per file, with the oid of
  the file already there (so the client skips unchanged files, as against the real Hub).
- ``POST /{type}s/{repo}.git/info/lfs/objects/batch`` (basic transfer) and the PUT/verify hrefs it
  hands out, which point back at this server.
- ``POST /api/{type}s/{repo}/commit/{rev}``: NDJSON lines ``header``, ``file`` (base64), ``lfsFile``,
  ``deletedFile``, ``deletedFolder``; answers ``commitOid``/``commitUrl``. Deleting a path that is not
  there fails the commit with 404 EntryNotFound ("A file with this name doesn't exist"), as the Hub
  does; a ``parentCommit`` that is not the head answers 412.
- ``GET /api/{type}s/{repo}/tree/{rev}[/{path}]?recursive=`` paged with a ``Link: rel="next"``
  header; ``POST .../paths-info/{rev}``.
- ``HEAD|GET /{type}s/{repo}/resolve/{rev}/{path}`` with X-Repo-Commit, ETag, Content-Length,
  Accept-Ranges (single ranges honoured); 404s carry X-Error-Code EntryNotFound | RepoNotFound |
  RevisionNotFound. Without a token a private repo answers 401 + RepoNotFound, as the Hub does; a
  wrong token answers 401 "Invalid credentials in Authorization header".

Fault injection: ``fail_next(n, status, retry_after=, match=)``, ``hang_next(n, seconds=, match=,
apply=)`` (hold the request past the client's timeout, then drop it, or apply it and lose the
answer), ``delay_commits(seconds)``, ``corrupt(repo, path)``. Records: ``commits(repo)`` (time and
paths of every client commit), ``files(repo)``, ``requests``, ``authorizations``.

Fidelity gaps (what the real Hub does that this does not):
- No xet. The client must take the plain LFS path: ``HF_HUB_DISABLE_XET=1`` before huggingface_hub is
  imported. ``FakeHub.start()`` sets that variable for child processes and, because the library reads
  it once at import, sets the library's copy of it in this process too. A client that still tries
  xet gets a 501 from the xet-token route that says so.
- No multipart LFS (no ``chunk_size`` in batch answers), no redirects to a CDN (files are served
  directly, so no X-Linked-Etag/X-Linked-Size), no ``expand=True`` metadata (lastCommit, security).
- Upload mode: "lfs" for files >= ``lfs_threshold`` (10 MiB), files whose sample holds a NUL byte,
  and the usual .gitattributes extensions; the Hub's exact rules differ in detail.
- No rate limiting of its own (use ``fail_next(status=429)``), no pull requests or branches other
  than those created by commits to "main", no gated repos, no .gitignore handling, no repo deletion
  or renaming, no commit-history API. Tree pagination uses a plain offset as the cursor.
- Tokens: any request is accepted when the hub has no token; otherwise exactly ``Bearer <token>``
  is accepted for everything (no read-only tokens, no per-repo permissions).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

try:  # the fixture is optional: the server also runs from the benchmark and by hand
    import pytest
except ImportError:  # pragma: no cover
    pytest = None

# A token-shaped value so that autoslm.secrets.redact recognises it wherever it might leak.
FAKE_HUB_TOKEN = "hf_FakeHubTokenForTests0123456789abcd"

DEFAULT_LFS_EXTENSIONS = (
    ".bin",
    ".safetensors",
    ".pt",
    ".pth",
    ".ckpt",
    ".h5",
    ".pkl",
    ".pickle",
    ".npy",
    ".npz",
    ".onnx",
    ".msgpack",
    ".parquet",
    ".arrow",
    ".gz",
    ".zip",
    ".tar",
    ".zst",
    ".model",
    ".joblib",
)
GITATTRIBUTES = "".join(f"*{ext} filter=lfs diff=lfs merge=lfs -text\n" for ext in DEFAULT_LFS_EXTENSIONS).encode()

_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
_URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}


def _git_blob_oid(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def _lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}Z"


@dataclass
class Blob:
    content: bytes
    lfs: bool
    sha256: str
    git_oid: str  # the git blob id: of the content for a regular file, of the pointer for an LFS file

    @classmethod
    def make(cls, content: bytes, lfs: bool) -> "Blob":
        sha = hashlib.sha256(content).hexdigest()
        oid = _git_blob_oid(_lfs_pointer(sha, len(content)) if lfs else content)
        return cls(content, lfs, sha, oid)

    @property
    def size(self) -> int:
        return len(self.content)

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_oid


@dataclass
class FakeCommit:
    oid: str
    parent: str | None
    message: str
    time: float  # time.time() when applied
    monotonic: float  # time.monotonic() when applied: what budget assertions should use
    added: list[str]
    deleted: list[str]  # paths as sent: a folder ends in "/"
    by_client: bool  # False for the repo's initial commit
    files: dict[str, Blob] = field(repr=False, default_factory=dict)


@dataclass
class FakeRepo:
    repo_type: str
    repo_id: str
    private: bool
    created: float
    history: list[FakeCommit] = field(default_factory=list)
    branches: dict[str, str] = field(default_factory=dict)
    lfs_objects: dict[str, bytes] = field(default_factory=dict, repr=False)

    def find(self, revision: str) -> FakeCommit | None:
        oid = self.branches.get(revision, revision)
        if len(oid) < 7:
            return None
        for c in reversed(self.history):
            if c.oid.startswith(oid):
                return c
        return None


@dataclass
class RequestRecord:
    time: float
    method: str
    path: str  # decoded path, no query
    status: int | None  # None when the connection was dropped without an answer
    authorized: bool  # whether an Authorization header came with it
    range: str | None = None  # the Range header, if any (what part of a file was asked for)


@dataclass
class _Fault:
    kind: str  # "fail" | "hang"
    remaining: int
    match: str | Callable[[str, str], bool] | None
    status: int = 500
    retry_after: int | None = None
    error_code: str | None = None
    message: str | None = None
    seconds: float | None = None
    apply: bool = False

    def matches(self, method: str, path: str) -> bool:
        if self.match is None:
            return True
        if callable(self.match):
            return bool(self.match(method, path))
        return self.match in f"{method} {path}"


class _Reply(Exception):
    """Raised inside a route to answer with an error."""

    def __init__(
        self, status: int, message: str, *, code: str | None = None, headers: dict | None = None, extra: dict | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}
        self.extra = extra or {}


class FakeHub:
    def __init__(
        self,
        token: str | None = None,
        *,
        lfs_threshold: int = 10 * 1024 * 1024,
        lfs_extensions: tuple[str, ...] = DEFAULT_LFS_EXTENSIONS,
        page_size: int = 1000,
        hang_seconds: float = 10.0,
        port: int = 0,
    ):
        self.token = token
        self.lfs_threshold = lfs_threshold
        self.lfs_extensions = tuple(lfs_extensions)
        self.page_size = page_size
        self.hang_seconds = hang_seconds
        self.requests: list[RequestRecord] = []
        self.authorizations: list[str] = []  # raw Authorization header values, in memory only
        self._port = port
        self._repos: dict[tuple[str, str], FakeRepo] = {}
        self._faults: list[_Fault] = []
        self._commit_delay = 0.0
        self._lock = threading.RLock()
        self._release = threading.Event()  # set on stop(): lets hung requests end at once
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._counter = 0

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> "FakeHub":
        use_plain_lfs()
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", self._port), Handler)
        self._server.daemon_threads = True
        self._release.clear()
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-hub", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "FakeHub":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "FakeHub is not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    url = endpoint

    def env(self) -> dict[str, str]:
        """Environment for a child process (a worker) that should use this hub."""
        env = {"HF_ENDPOINT": self.endpoint, "HF_HUB_DISABLE_XET": "1"}
        if self.token:
            env["HF_TOKEN"] = self.token
        return env

    # -- fault injection --------------------------------------------------------------------------
    def fail_next(
        self,
        n: int = 1,
        status: int = 500,
        *,
        retry_after: int | None = None,
        match: str | Callable[[str, str], bool] | None = None,
        error_code: str | None = None,
        message: str | None = None,
    ) -> None:
        """Answer the next ``n`` requests that match (a substring of "METHOD /path", or a predicate)
        with ``status``. A 429 carries ``Retry-After: retry_after`` when given."""
        with self._lock:
            self._faults.append(_Fault("fail", n, match, status, retry_after, error_code, message))

    def hang_next(
        self,
        n: int = 1,
        *,
        seconds: float | None = None,
        match: str | Callable[[str, str], bool] | None = None,
        apply: bool = False,
    ) -> None:
        """Hold the next ``n`` matching requests for ``seconds`` (default ``hang_seconds``), longer
        than the client's timeout. Then drop the connection unanswered; with ``apply=True`` the
        request is carried out first (a commit that happened but whose answer was lost)."""
        with self._lock:
            self._faults.append(_Fault("hang", n, match, seconds=seconds, apply=apply))

    def delay_commits(self, seconds: float) -> None:
        """Make every commit POST take this long before it is applied (0 to stop)."""
        self._commit_delay = float(seconds)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
        self._commit_delay = 0.0

    def _take_fault(self, method: str, path: str) -> _Fault | None:
        with self._lock:
            for f in self._faults:
                if f.matches(method, path):
                    f.remaining -= 1
                    if f.remaining <= 0:
                        self._faults.remove(f)
                    return f
        return None

    # -- inspection and direct manipulation ---------------------------------------------------------
    def create_repo(self, repo_id: str, repo_type: str = "dataset", private: bool = True) -> FakeRepo:
        with self._lock:
            key = (repo_type, repo_id)
            if key not in self._repos:
                repo = FakeRepo(repo_type, repo_id, private, time.time())
                self._apply_commit(
                    repo, "initial commit", [("add", ".gitattributes", Blob.make(GITATTRIBUTES, False))], by_client=False
                )
                self._repos[key] = repo
            return self._repos[key]

    def repo(self, repo_id: str, repo_type: str = "dataset") -> FakeRepo | None:
        with self._lock:
            return self._repos.get((repo_type, repo_id))

    def commits(self, repo_id: str, repo_type: str = "dataset") -> list[FakeCommit]:
        """Every commit a client made to the repo, oldest first (the repo's initial commit excluded)."""
        repo = self.repo(repo_id, repo_type)
        return [c for c in repo.history if c.by_client] if repo else []

    def files(self, repo_id: str, repo_type: str = "dataset", revision: str = "main") -> dict[str, bytes]:
        repo = self.repo(repo_id, repo_type)
        if repo is None:
            return {}
        commit = repo.find(revision)
        return {p: b.content for p, b in commit.files.items()} if commit else {}

    def corrupt(self, repo_id: str, path: str, repo_type: str = "dataset", data: bytes | None = None) -> None:
        """Change the stored bytes of a file in place (same path, no new commit): storage gone bad."""
        with self._lock:
            repo = self.repo(repo_id, repo_type)
            assert repo is not None, f"no repo {repo_id}"
            head = repo.find("main")
            blob = head.files[path]
            if data is None:
                data = bytes(b ^ 0xFF for b in blob.content[:64]) + blob.content[64:] if blob.content else b"x"
            for commit in repo.history:
                if commit.files.get(path) is blob:
                    commit.files[path] = Blob(data, blob.lfs, blob.sha256, blob.git_oid)
            if blob.lfs:
                repo.lfs_objects[blob.sha256] = data

    # -- the repository model -----------------------------------------------------------------------
    def _new_oid(self, *parts: str) -> str:
        self._counter += 1
        return hashlib.sha1("\0".join((*parts, str(self._counter), str(time.time()))).encode()).hexdigest()

    def _apply_commit(
        self, repo: FakeRepo, message: str, ops: list[tuple[str, str, Blob | None]], *, by_client: bool = True
    ) -> FakeCommit:
        """Apply ("add" | "deletedFile" | "deletedFolder", path, blob) operations, in order, as one commit."""
        head = repo.find("main") if repo.branches else None
        files = dict(head.files) if head else {}
        added, deleted = [], []
        for op, path, blob in ops:
            if op == "add":
                files[path] = blob
                added.append(path)
            elif op == "deletedFile":
                files.pop(path, None)
                deleted.append(path)
            else:
                prefix = path.rstrip("/") + "/"
                for p in [p for p in files if p.startswith(prefix)]:
                    del files[p]
                deleted.append(prefix)
        commit = FakeCommit(
            oid=self._new_oid(repo.repo_id, message),
            parent=head.oid if head else None,
            message=message,
            time=time.time(),
            monotonic=time.monotonic(),
            added=added,
            deleted=deleted,
            by_client=by_client,
            files=files,
        )
        repo.history.append(commit)
        repo.branches["main"] = commit.oid
        return commit

    def _upload_mode(self, path: str, size: int, sample: bytes) -> str:
        if size == 0:
            return "regular"
        if size >= self.lfs_threshold or path.lower().endswith(self.lfs_extensions) or b"\0" in sample:
            return "lfs"
        return "regular"


def use_plain_lfs() -> None:
    """Make huggingface_hub use the plain LFS upload path (this fake has no xet).

    The library reads HF_HUB_DISABLE_XET once, when it is imported; child processes get the variable,
    and a library already imported here gets the same setting it would have read at import.
    """
    os.environ["HF_HUB_DISABLE_XET"] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_DISABLE_XET = True


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.1"  # keep-alive, like the Hub: the client pools connections
    disable_nagle_algorithm = True  # headers and body go out in separate writes: no 40 ms stalls
    server_version = "FakeHub/1.0"

    def log_message(self, format, *args):  # noqa: A002 - quiet: tests read hub.requests instead
        pass

    # -- plumbing -------------------------------------------------------------------------------
    def do_GET(self):
        self._handle("GET")

    def do_HEAD(self):
        self._handle("HEAD")

    def do_POST(self):
        self._handle("POST")

    def do_PUT(self):
        self._handle("PUT")

    def do_DELETE(self):
        self._handle("DELETE")

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0] or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self, method: str) -> None:
        hub = self.hub
        split = urlsplit(self.path)
        self._segments = [unquote(s) for s in split.path.split("/")[1:]]
        self._query = parse_qs(split.query)
        self._raw_path = split.path
        path = "/" + "/".join(self._segments)
        body = self._read_body()
        auth = self.headers.get("Authorization")
        if auth:
            hub.authorizations.append(auth)
        record = RequestRecord(time.time(), method, path, None, bool(auth), self.headers.get("Range"))
        hub.requests.append(record)
        self._method = method
        fault = hub._take_fault(method, path)
        if fault is not None and fault.kind == "hang":
            hub._release.wait(fault.seconds if fault.seconds is not None else hub.hang_seconds)
            if fault.apply:
                try:
                    self._route(method, body)
                except _Reply:
                    pass
                except Exception:  # noqa: BLE001 - the answer is lost anyway
                    pass
            self.close_connection = True
            return
        try:
            if fault is not None:
                headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
                raise _Reply(fault.status, fault.message or f"injected {fault.status}", code=fault.error_code, headers=headers)
            status, payload, headers = self._route(method, body)
        except _Reply as r:
            headers = dict(r.headers)
            if r.code:
                headers["X-Error-Code"] = r.code
            headers["X-Error-Message"] = r.message
            status, payload = r.status, {"error": r.message, **r.extra}
        except Exception as e:  # noqa: BLE001 - a bug in the fake answers 500 rather than hanging
            status, payload, headers = 500, {"error": f"fake hub error: {type(e).__name__}: {e}"}, {}
        record.status = status
        self._send(status, payload, headers)

    def _send(self, status: int, payload, headers: dict) -> None:
        if isinstance(payload, (dict, list)):
            data = json.dumps(payload).encode()
            headers.setdefault("Content-Type", "application/json; charset=utf-8")
        else:
            data = payload or b""
            headers.setdefault("Content-Type", "application/octet-stream")
        try:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            if "Content-Length" not in headers:
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self._method != "HEAD":
                self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # -- auth ---------------------------------------------------------------------------------------
    def _check_auth(self, repo: FakeRepo | None, *, write: bool) -> None:
        token = self.hub.token
        header = self.headers.get("Authorization")
        if token is None:
            return
        if header is not None and header != f"Bearer {token}":
            raise _Reply(401, "Invalid credentials in Authorization header")
        if header is None and (write or (repo is not None and repo.private)):
            # The Hub hides private repos from anonymous callers: 401 + RepoNotFound.
            raise _Reply(401, "Repository not found", code="RepoNotFound")

    def _repo(self, repo_type: str, owner: str, name: str, *, write: bool = False) -> FakeRepo:
        repo = self.hub.repo(f"{owner}/{name}", repo_type)
        self._check_auth(repo, write=write)
        if repo is None:
            raise _Reply(404, "Repository not found", code="RepoNotFound")
        return repo

    def _commit_at(self, repo: FakeRepo, revision: str) -> FakeCommit:
        commit = repo.find(revision)
        if commit is None:
            raise _Reply(404, f"Invalid rev id: {revision}", code="RevisionNotFound")
        return commit

    # -- routing --------------------------------------------------------------------------------------
    def _route(self, method: str, body: bytes):
        s = self._segments
        if s[:3] == ["api", "repos", "create"] and method == "POST":
            return self._create_repo(body)
        if s[:2] == ["api", "validate-yaml"] and method == "POST":
            return self._validate_yaml(body)
        if s[:2] == ["api", "whoami-v2"]:
            self._check_auth(None, write=True)
            return 200, {"type": "user", "name": "fake-user", "fullname": "Fake User", "orgs": []}, {}
        if len(s) >= 4 and s[0] == "api" and s[1] in _TYPES:
            repo_type, owner, name, rest = _TYPES[s[1]], s[2], s[3], s[4:]
            if not rest and method == "GET":
                return self._repo_info(repo_type, owner, name, "main")
            if rest[:1] == ["revision"] and method == "GET":
                return self._repo_info(repo_type, owner, name, "/".join(rest[1:]))
            if rest[:1] == ["preupload"] and method == "POST":
                return self._preupload(repo_type, owner, name, "/".join(rest[1:]), body)
            if rest[:1] == ["commit"] and method == "POST":
                return self._commit(repo_type, owner, name, "/".join(rest[1:]), body)
            if rest[:1] == ["tree"] and method == "GET":
                rev = rest[1] if len(rest) > 1 else "main"
                return self._tree(repo_type, owner, name, rev, "/".join(rest[2:]))
            if rest[:1] == ["paths-info"] and method == "POST":
                return self._paths_info(repo_type, owner, name, "/".join(rest[1:]), body)
            if rest[:1] and rest[0].startswith("xet-"):
                raise _Reply(501, "this fake Hub has no xet storage: set HF_HUB_DISABLE_XET=1 before importing huggingface_hub")
        if s[:1] == ["_fake_lfs"] and len(s) == 5 and method == "PUT":
            return self._lfs_put(_TYPES[s[1]], s[2], s[3], s[4], body)
        if s[:1] == ["_fake_lfs_verify"] and len(s) == 4 and method == "POST":
            return self._lfs_verify(_TYPES[s[1]], s[2], s[3], body)
        # Git and resolve routes: /{datasets|spaces}/owner/name... or /owner/name... for models.
        repo_type, rest = ("model", s)
        if s and s[0] in ("datasets", "spaces"):
            repo_type, rest = _TYPES[s[0]], s[1:]
        if len(rest) >= 6 and rest[1].endswith(".git") and rest[2:6] == ["info", "lfs", "objects", "batch"]:
            return self._lfs_batch(repo_type, rest[0], rest[1][: -len(".git")], body)
        if len(rest) >= 5 and rest[2] == "resolve" and method in ("GET", "HEAD"):
            return self._resolve(repo_type, rest[0], rest[1], rest[3], "/".join(rest[4:]))
        raise _Reply(404, f"no route for {method} {self._raw_path}")

    # -- endpoints ----------------------------------------------------------------------------------
    def _validate_yaml(self, body: bytes):
        """The model card's metadata block: YAML that parses to a mapping, with list-valued tags/datasets."""
        import yaml

        content = json.loads(body or b"{}").get("content") or ""
        m = re.match(r"^---\n(.*?)\n---\n", content, re.S)
        if not m:
            return 200, {"errors": [], "warnings": [{"message": "empty or missing yaml metadata in repo card"}]}, {}
        try:
            meta = yaml.safe_load(m.group(1))
        except yaml.YAMLError as e:
            return 400, {"errors": [{"message": f"invalid YAML: {e}"}], "warnings": []}, {}
        errors = [] if isinstance(meta, dict) else [{"message": "metadata must be a YAML mapping"}]
        for key in ("tags", "datasets"):
            if isinstance(meta, dict) and key in meta and not isinstance(meta[key], (list, str)):
                errors.append({"message": f'"{key}" must be a list of strings'})
        return (400 if errors else 200), {"errors": errors, "warnings": []}, {}

    def _create_repo(self, body: bytes):
        self._check_auth(None, write=True)
        payload = json.loads(body or b"{}")
        name, org = payload.get("name"), payload.get("organization") or "fake-user"
        repo_type = payload.get("type") or "model"
        private = payload.get("visibility") == "private" or payload.get("private") is True
        repo_id = f"{org}/{name}"
        url = f"{self.hub.endpoint}/{_URL_PREFIX[repo_type]}{repo_id}"
        with self.hub._lock:
            if self.hub.repo(repo_id, repo_type) is not None:
                # The Hub names the existing repo's url in its 409; the client reads it.
                raise _Reply(409, f"You already created this {repo_type} repo", extra={"url": url})
            repo = self.hub.create_repo(repo_id, repo_type, private)
        return 200, {"url": url, "name": repo_id, "id": repo.history[0].oid[:24]}, {}

    def _repo_info(self, repo_type, owner, name, revision):
        repo = self._repo(repo_type, owner, name)
        commit = self._commit_at(repo, revision)
        blobs = self._query.get("blobs", ["false"])[0].lower() == "true"
        siblings = []
        for p in sorted(commit.files):
            sib = {"rfilename": p}
            if blobs:
                b = commit.files[p]
                sib.update(size=b.size, blobId=b.git_oid)
                if b.lfs:
                    sib["lfs"] = {"size": b.size, "sha256": b.sha256, "pointerSize": len(_lfs_pointer(b.sha256, b.size))}
            siblings.append(sib)
        return (
            200,
            {
                "_id": repo.history[0].oid[:24],
                "id": repo.repo_id,
                "author": owner,
                "sha": commit.oid,
                "private": repo.private,
                "disabled": False,
                "gated": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "createdAt": _iso(repo.created),
                "lastModified": _iso(commit.time),
                "siblings": siblings,
            },
            {},
        )

    def _preupload(self, repo_type, owner, name, revision, body):
        repo = self._repo(repo_type, owner, name, write=True)
        commit = self._commit_at(repo, revision)
        files = []
        for f in json.loads(body)["files"]:
            sample = base64.b64decode(f.get("sample") or "")
            mode = self.hub._upload_mode(f["path"], int(f["size"]), sample)
            existing = commit.files.get(f["path"])
            oid = None
            if existing is not None:
                oid = existing.sha256 if mode == "lfs" else existing.git_oid
            files.append({"path": f["path"], "uploadMode": mode, "shouldIgnore": False, "oid": oid})
        return 200, {"files": files, "commitOid": commit.oid}, {}

    def _lfs_batch(self, repo_type, owner, name, body):
        repo = self._repo(repo_type, owner, name, write=True)
        req = json.loads(body)
        if req.get("operation") != "upload":
            raise _Reply(400, "this fake Hub only takes LFS uploads through the batch API")
        if "basic" not in (req.get("transfers") or ["basic"]):
            raise _Reply(400, "this fake Hub only offers the basic LFS transfer")
        base = f"{self.hub.endpoint}"
        type_seg = {"model": "models", "dataset": "datasets", "space": "spaces"}[repo_type]
        objects = []
        for o in req.get("objects", []):
            oid, size = o["oid"], int(o["size"])
            if oid in repo.lfs_objects:
                objects.append({"oid": oid, "size": size})  # already there: no actions, nothing to upload
                continue
            objects.append(
                {
                    "oid": oid,
                    "size": size,
                    "authenticated": True,
                    "actions": {
                        "upload": {"href": f"{base}/_fake_lfs/{type_seg}/{owner}/{name}/{oid}", "header": {}},
                        "verify": {"href": f"{base}/_fake_lfs_verify/{type_seg}/{owner}/{name}", "header": {}},
                    },
                }
            )
        return (
            200,
            {"transfer": "basic", "objects": objects, "hash_algo": "sha256"},
            {"Content-Type": "application/vnd.git-lfs+json"},
        )

    def _lfs_put(self, repo_type, owner, name, oid, body):
        repo = self.hub.repo(f"{owner}/{name}", repo_type)  # a pre-signed URL: no auth, as on the Hub
        if repo is None:
            raise _Reply(404, "Repository not found", code="RepoNotFound")
        if hashlib.sha256(body).hexdigest() != oid:
            raise _Reply(400, "sha256 of the uploaded content does not match the oid")
        with self.hub._lock:
            repo.lfs_objects[oid] = body
        return 200, b"", {}

    def _lfs_verify(self, repo_type, owner, name, body):
        repo = self._repo(repo_type, owner, name, write=True)
        req = json.loads(body)
        data = repo.lfs_objects.get(req["oid"])
        if data is None or len(data) != int(req["size"]):
            raise _Reply(404, "LFS object not found or of the wrong size")
        return 200, {"success": True}, {}

    def _commit(self, repo_type, owner, name, revision, body):
        hub = self.hub
        repo = self._repo(repo_type, owner, name, write=True)
        if revision != "main":
            raise _Reply(404, f"Invalid rev id: {revision}", code="RevisionNotFound")
        if hub._commit_delay:
            hub._release.wait(hub._commit_delay)
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        header = next((ln["value"] for ln in lines if ln.get("key") == "header"), None)
        if header is None or not header.get("summary"):
            raise _Reply(400, "commit header with a summary is required")
        with hub._lock:
            head = repo.find("main")
            parent = header.get("parentCommit")
            if parent and not head.oid.startswith(parent):
                raise _Reply(412, "A commit has happened since. Please refresh and try again.")
            files = dict(head.files)
            ordered = []
            for ln in lines:
                key, value = ln.get("key"), ln.get("value") or {}
                path = value.get("path", "")
                if key == "header":
                    continue
                if key == "file":
                    if value.get("encoding", "base64") != "base64":
                        raise _Reply(400, "unsupported file encoding")
                    blob = Blob.make(base64.b64decode(value["content"]), False)
                    files[path] = blob
                    ordered.append(("add", path, blob))
                elif key == "lfsFile":
                    data = repo.lfs_objects.get(value["oid"])
                    if data is None:
                        raise _Reply(
                            400,
                            "Your push was rejected because an LFS pointer pointed to a file that "
                            f"does not exist. Offending file: - {path}",
                        )
                    blob = Blob(data, True, value["oid"], _git_blob_oid(_lfs_pointer(value["oid"], len(data))))
                    files[path] = blob
                    ordered.append(("add", path, blob))
                elif key == "deletedFile":
                    if path not in files:
                        raise _Reply(404, "A file with this name doesn't exist", code="EntryNotFound")
                    del files[path]
                    ordered.append(("deletedFile", path, None))
                elif key == "deletedFolder":
                    prefix = path.rstrip("/") + "/"
                    doomed = [p for p in files if p.startswith(prefix)]
                    if not doomed:
                        raise _Reply(404, "A folder with this name doesn't exist", code="EntryNotFound")
                    for p in doomed:
                        del files[p]
                    ordered.append(("deletedFolder", prefix, None))
                else:
                    raise _Reply(400, f"unknown commit operation {key!r}")
            commit = hub._apply_commit(repo, header["summary"], ordered)
        url = f"{hub.endpoint}/{_URL_PREFIX[repo_type]}{repo.repo_id}/commit/{commit.oid}"
        return 200, {"success": True, "commitOid": commit.oid, "commitUrl": url, "hookOutput": "", "pullRequestUrl": None}, {}

    def _entry(self, commit: FakeCommit, path: str, is_dir: bool) -> dict:
        if is_dir:
            return {
                "type": "directory",
                "oid": hashlib.sha1(f"{commit.oid}:{path}".encode()).hexdigest(),
                "size": 0,
                "path": path,
            }
        b = commit.files[path]
        entry = {"type": "file", "oid": b.git_oid, "size": b.size, "path": path}
        if b.lfs:
            entry["lfs"] = {"oid": b.sha256, "size": b.size, "pointerSize": len(_lfs_pointer(b.sha256, b.size))}
        return entry

    def _tree(self, repo_type, owner, name, revision, path):
        repo = self._repo(repo_type, owner, name)
        commit = self._commit_at(repo, revision)
        recursive = self._query.get("recursive", ["false"])[0].lower() in ("true", "1")
        prefix = path.strip("/")
        under = [p for p in commit.files if not prefix or p.startswith(prefix + "/")]
        if prefix and not under:
            raise _Reply(404, f'{prefix} does not exist on "{revision}"', code="EntryNotFound")
        base_len = len(prefix) + 1 if prefix else 0
        files, dirs = set(), set()
        for p in under:
            rel_parts = p[base_len:].split("/")
            if recursive:
                files.add(p)
                for i in range(1, len(rel_parts)):
                    dirs.add(p[:base_len] + "/".join(rel_parts[:i]))
            elif len(rel_parts) == 1:
                files.add(p)
            else:
                dirs.add(p[:base_len] + rel_parts[0])
        entries = [self._entry(commit, d, True) for d in sorted(dirs)] + [self._entry(commit, f, False) for f in sorted(files)]
        cursor = int(self._query.get("cursor", ["0"])[0])
        page = entries[cursor : cursor + self.hub.page_size]
        headers = {}
        if cursor + self.hub.page_size < len(entries):
            q = {k: v[0] for k, v in self._query.items()}
            q["cursor"] = str(cursor + self.hub.page_size)
            headers["Link"] = f'<{self.hub.endpoint}{self._raw_path}?{urlencode(q)}>; rel="next"'
        return 200, page, headers

    def _paths_info(self, repo_type, owner, name, revision, body):
        repo = self._repo(repo_type, owner, name)
        commit = self._commit_at(repo, revision)
        form = parse_qs(body.decode())
        out = []
        for p in form.get("paths", []):
            p = p.strip("/")
            if p in commit.files:
                out.append(self._entry(commit, p, False))
            elif any(f.startswith(p + "/") for f in commit.files):
                out.append(self._entry(commit, p, True))
        return 200, out, {}

    def _resolve(self, repo_type, owner, name, revision, path):
        repo = self._repo(repo_type, owner, name)
        commit = self._commit_at(repo, revision)
        blob = commit.files.get(path)
        if blob is None:
            raise _Reply(404, "Entry not found", code="EntryNotFound", headers={"X-Repo-Commit": commit.oid})
        data = blob.content
        headers = {"X-Repo-Commit": commit.oid, "ETag": f'"{blob.etag}"', "Accept-Ranges": "bytes"}
        status = 200
        rng = self.headers.get("Range")
        m = re.fullmatch(r"bytes=(\d*)-(\d*)", rng.strip()) if rng else None
        if m and (m.group(1) or m.group(2)):
            size = len(data)
            if m.group(1):
                start, end = int(m.group(1)), int(m.group(2)) if m.group(2) else size - 1
            else:
                start, end = max(size - int(m.group(2)), 0), size - 1
            if start >= size:
                raise _Reply(416, "Requested range not satisfiable", headers={"Content-Range": f"bytes */{size}"})
            end = min(end, size - 1)
            data, status = data[start : end + 1], 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        return status, data, headers


if pytest is not None:

    @pytest.fixture
    def fake_hub():
        """A started FakeHub that wants ``FAKE_HUB_TOKEN``; stopped after the test."""
        with FakeHub(token=FAKE_HUB_TOKEN) as hub:
            yield hub


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Serve a fake Hugging Face Hub on 127.0.0.1 (in memory).")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--token", default=None, help="require this token (default: accept any)")
    args = parser.parse_args(argv)
    with FakeHub(token=args.token, port=args.port) as hub:
        print(f"HF_ENDPOINT={hub.endpoint} HF_HUB_DISABLE_XET=1", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
