"""What the fake RunPod and fake Vast servers share: an HTTP server on 127.0.0.1 with fault injection,
and "pods" that are real local processes running the pod's command.

``FakeCloud`` serves the vendor API on an ephemeral port (stdlib ``ThreadingHTTPServer``), records
every request (method, path, query -- never headers or bodies in that log), checks the Bearer key,
and can, on demand, answer the next requests with an error status (``fail_next``) or hold them
without answering (``hang_next``), optionally after acting on them (a create whose answer is lost).

``PodProcess`` starts a pod's command as a process group, with ``python`` replaced by this
interpreter, the pod's environment plus what the vendor injects, and the output in a log file; it is
killed as a group. ``worker_command`` replaces every pod's command (a light stand-in worker for tests
where training is not the point). Pods never inherit the test process's environment: only PATH, a private HOME and
TMPDIR, PYTHONPATH pointing at this checkout, the fake's ``extra_env`` and the pod's own env.

Fidelity gaps shared by both fakes: no image is pulled and the image's ENTRYPOINT
(worker_image/boot.sh, which prefetches the model) is not run -- the command runs directly (a
bootstrap pod's command is boot.sh itself, so that one runs);
there is no GPU, and the fake says so to its pods (``AUTOSLM_CPU_POD=1``, engine/train/gpu.py's
``ENV_CPU_POD``: the worker trains on the CPU where a real rented pod without CUDA fails as a faulty
host; ``cpu_pods=False`` leaves it out, a pod as a real vendor's would be); the vendor-injected
variables include AUTOSLM_RUNPOD_URL / AUTOSLM_VAST_URL pointing back at the fake, which the real
vendors do not set (the default base URL is right there).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    token: str | None
    body: Any

    def q(self, name: str, default: str | None = None) -> str | None:
        values = self.query.get(name)
        return values[0] if values else default


@dataclass
class Response:
    status: int
    body: Any = None  # JSON-able, or None for an empty body
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"
    # Sent chunk by chunk as it yields them, in place of ``body``'s JSON, until it ends (then the connection
    # closes): a stream of server-sent events.
    stream: Callable[[], Iterator[bytes]] | None = None


@dataclass
class _Fault:
    kind: str  # "fail" | "hang"
    remaining: int
    status: int = 500
    retry_after: float | str | None = None
    method: str | None = None
    path: str | None = None  # a prefix of the request path
    seconds: float | None = None
    apply: bool | str = False  # hang only: True: act on the request, then withhold the answer; "late": hold, then act
    body: Any = None
    land_after_s: float | None = None  # fail only: answer the error now, and act on the request this much later
    held: int = 0  # hang only: requests this fault holds right now
    body_has: str | None = None  # only a request whose JSON body contains this text (a home's pod names)

    def matches(self, req: Request) -> bool:
        return (
            (self.method is None or self.method == req.method)
            and (self.path is None or req.path.startswith(self.path))
            and (self.body_has is None or self.body_has in json.dumps(req.body))
        )


class PodProcess:
    """A pod's command running as a local process group, output to ``log_path``."""

    def __init__(self, command: list[str], env: dict[str, str], log_path: Path, *, cwd: Path, python: str = sys.executable):
        argv = list(command)
        if argv and argv[0] in ("python", "python3"):
            argv[0] = python
        self.argv = argv
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cwd.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        self.started_at = time.time()
        self.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=str(cwd),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so kill() takes its children too
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def kill(self, grace_s: float = 0.0) -> None:
        """SIGTERM the group, wait up to ``grace_s``, then SIGKILL it; reaps the process."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=grace_s if grace_s > 0 else 5)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # stragglers the worker started
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


class FakeCloud:
    """Base of FakeRunPod / FakeVast. Subclasses implement ``handle`` and ``error_body`` in the vendor's shapes."""

    vendor = "fake"

    def __init__(
        self,
        *,
        api_key: str = "fake-account-key-0123456789",
        workdir: str | Path | None = None,
        extra_env: dict[str, str] | None = None,
        python: str = sys.executable,
        hang_s: float = 10.0,
        terminate_grace_s: float = 2.0,
        worker_command: list[str] | None = None,
        cpu_pods: bool = True,
    ):
        self.api_key = api_key
        self.cpu_pods = cpu_pods  # tell each pod it has no GPU (the truth here): its worker trains on the CPU
        self._own_tmp = None
        if workdir is None:
            self._own_tmp = tempfile.TemporaryDirectory(prefix=f"fake-{self.vendor}-")
            workdir = self._own_tmp.name
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.extra_env = dict(extra_env or {})
        self.python = python
        self.hang_s = hang_s
        self.terminate_grace_s = terminate_grace_s
        # Run this instead of each pod's own command (a light stand-in worker, where training is not the point).
        self.worker_command = list(worker_command) if worker_command else None
        self.requests: list[tuple[str, str, str]] = []  # (method, path, raw query)
        self.launch_calls: list[dict] = []  # every create request body, in order (refused ones too)
        self.lock = threading.RLock()
        self._faults: list[_Fault] = []
        self._closing = threading.Event()
        # Holds in progress wait on this; ``release_holds``'s generation: a hold ends when it changes.
        self._holds = threading.Condition()
        self._released = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> "FakeCloud":
        handler = _make_handler(self)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        # A short poll interval: shutdown() waits for one, and every test tears a fake down.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name=f"fake-{self.vendor}", daemon=True
        )
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the fake first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        """Stop serving, release hung requests, kill every pod process."""
        self._closing.set()
        with self._holds:
            self._holds.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.kill_all()
        if self._own_tmp is not None:
            self._own_tmp.cleanup()
            self._own_tmp = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def kill_all(self) -> None:  # subclasses kill their pods
        pass

    # -- test API: faults --------------------------------------------------------------------------

    def fail_next(
        self,
        n: int = 1,
        status: int = 500,
        retry_after: float | str | None = None,
        *,
        method: str | None = None,
        path: str | None = None,
        body: Any = None,
        land_after_s: float | None = None,
        body_has: str | None = None,
    ) -> None:
        """Answer the next ``n`` matching requests with ``status`` (vendor error shape) and an optional Retry-After.

        ``land_after_s``: the request takes effect that much later all the same (a create that answered
        500 while the vendor's queue still held it). ``body_has``: only a request whose JSON body has it."""
        with self.lock:
            self._faults.append(
                _Fault(
                    "fail",
                    n,
                    status=status,
                    retry_after=retry_after,
                    method=method,
                    path=path,
                    body=body,
                    land_after_s=land_after_s,
                    body_has=body_has,
                )
            )

    def hang_next(
        self,
        n: int = 1,
        seconds: float | None = None,
        *,
        method: str | None = None,
        path: str | None = None,
        apply: bool = False,
        body_has: str | None = None,
    ) -> _Fault:
        """Hold the next ``n`` matching requests for ``seconds`` (default ``hang_s``) without answering.

        With ``apply=True`` the request takes effect first (a pod is created) and only the answer is
        lost: what a client sees when its create times out on a slow vendor. With ``apply="late"`` it
        takes effect only after the hold, whether or not the client is still there to hear the answer
        (a create still in flight at the vendor while its client was killed). Returns the fault, which
        ``wait_held`` takes to wait for its own requests (a module's fake serves other tests' too).
        """
        fault = _Fault("hang", n, method=method, path=path, seconds=seconds, apply=apply, body_has=body_has)
        with self.lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self.lock:
            self._faults.clear()

    def faults_left(self) -> int:
        """How many injected faults no request has met yet (0: every one was served, e.g. a hang is holding)."""
        with self.lock:
            return sum(f.remaining for f in self._faults)

    def env(self) -> dict[str, str]:
        """What to put in a CLI's environment to make it use this fake (subclasses fill in the names)."""
        raise NotImplementedError

    # -- test API: pods (subclasses) ---------------------------------------------------------------

    def start_pod_process(
        self,
        pod_id: str,
        command: list[str],
        pod_env: dict[str, str],
        injected: dict[str, str],
        *,
        wrap: Callable[[list[str]], list[str]] | None = None,
    ) -> PodProcess:
        """Run a pod's command: only a minimal base, ``extra_env``, the pod's env and what the vendor injects.
        ``wrap``: what the command runs inside (the argv it is given is the one the pod would run)."""
        home = self.workdir / "pods" / pod_id
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home / "home"),
            "TMPDIR": str(home / "tmp"),
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(REPO_ROOT),
            "PYTHONUNBUFFERED": "1",
        }
        (home / "home").mkdir(parents=True, exist_ok=True)
        (home / "tmp").mkdir(parents=True, exist_ok=True)
        if self.cpu_pods:
            env["AUTOSLM_CPU_POD"] = "1"
        env.update(self.extra_env)
        env.update(pod_env)
        env.update(injected)
        if not self.worker_command and "autoslm-boot" in command and "PATH" not in self.extra_env:
            # A bootstrap pod pip-installs into the first python on its PATH: without a stand-in base
            # image (tests/fakes/base_image.py) that would be this machine's own environment.
            command = ["sh", "-c", "echo 'fake cloud: a bootstrap pod needs a base image on PATH (extra_env)'; exit 2"]
        argv = self.worker_command or command
        return PodProcess(wrap(argv) if wrap else argv, env, home / "pod.log", cwd=home / "work", python=self.python)

    # -- request plumbing --------------------------------------------------------------------------

    def error_body(self, status: int, message: str) -> Any:
        return {"error": message}

    def handle(self, req: Request) -> Response:
        raise NotImplementedError

    def dispatch(self, req: Request) -> tuple[Response, tuple[float, _Fault] | float]:
        """(response, seconds to hold it). Faults first, as a gateway in front of the vendor would."""
        with self.lock:
            fault = next((f for f in self._faults if f.remaining > 0 and f.matches(req)), None)
            if fault is not None:
                fault.remaining -= 1
                self._faults = [f for f in self._faults if f.remaining > 0]
        if fault is not None and fault.kind == "fail":
            if fault.land_after_s is not None:

                def land(req=req, after=fault.land_after_s):
                    if not self._closing.wait(after):
                        self.handle(req)

                threading.Thread(target=land, daemon=True).start()
            headers = {}
            if fault.retry_after is not None:
                headers["Retry-After"] = str(fault.retry_after)
            body = fault.body if fault.body is not None else self.error_body(fault.status, reason_phrase(fault.status))
            return Response(fault.status, body, headers), 0.0
        if fault is not None and fault.kind == "hang":
            hold = fault.seconds if fault.seconds is not None else self.hang_s
            if fault.apply == "late":
                self.hold(hold, fault)
                return self.handle(req), 0.0
            if fault.apply:
                return self.handle(req), (hold, fault)
            return Response(504, self.error_body(504, "gateway timeout")), (hold, fault)
        return self.handle(req), 0.0

    def hold(self, seconds: float, fault: _Fault | None = None) -> None:
        """Hold one request (of ``fault``) for ``seconds``, or until ``release_holds`` or the server closes."""
        with self._holds:
            released = self._released
            if fault is not None:
                fault.held += 1
            self._holds.notify_all()
            try:
                self._holds.wait_for(lambda: self._released != released or self._closing.is_set(), timeout=seconds)
            finally:
                if fault is not None:
                    fault.held -= 1

    def wait_held(self, fault: _Fault, timeout: float = 60.0) -> None:
        """Wait until ``fault`` (``hang_next``'s) holds a request: a test acts at that moment ("while the
        create is held")."""
        with self._holds:
            if not self._holds.wait_for(lambda: fault.held > 0, timeout=timeout):
                raise AssertionError(f"the hang on {fault.method} {fault.path} held no request within {timeout:g}s")

    def release_holds(self) -> None:
        """End every hold now in progress: each held request goes on (is answered, or takes effect)."""
        with self._holds:
            self._released += 1
            self._holds.notify_all()


def reason_phrase(status: int) -> str:
    return {
        400: "Bad Request",
        401: "Unauthorized",
        403: "Forbidden",
        404: "Not Found",
        409: "Conflict",
        429: "Too Many Requests",
        500: "Internal Server Error",
        502: "Bad Gateway",
        503: "Service Unavailable",
        504: "Gateway Timeout",
    }.get(status, "Error")


def _make_handler(cloud: FakeCloud) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = f"fake-{cloud.vendor}"

        def log_message(self, fmt, *args):  # keep pytest output clean
            pass

        def _serve(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = {"__invalid_json__": True}
            auth = self.headers.get("Authorization") or ""
            token = auth[7:].strip() if auth.lower().startswith("bearer ") else None
            req = Request(self.command, parts.path, parse_qs(parts.query), token, body)
            with cloud.lock:
                cloud.requests.append((req.method, req.path, parts.query))
            try:
                resp, hold = cloud.dispatch(req)
            except Exception as e:  # noqa: BLE001 - a bug in the fake must show up as a 500, not a hang
                resp, hold = Response(500, cloud.error_body(500, f"fake server error: {type(e).__name__}: {e}")), 0.0
            if hold:
                cloud.hold(*hold)
            try:
                if resp.stream is not None:
                    self._stream(resp)
                    return
                payload = b"" if resp.body is None else json.dumps(resp.body).encode()
                self.send_response(resp.status)
                if resp.body is not None:
                    self.send_header("Content-Type", resp.content_type)
                self.send_header("Content-Length", str(len(payload)))
                for k, v in resp.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                if payload:
                    self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (its timeout): exactly what a hang is for

        def _stream(self, resp: Response) -> None:
            self.send_response(resp.status)
            self.send_header("Content-Type", resp.content_type)
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            self.close_connection = True  # the stream's end is the connection's
            for chunk in resp.stream():
                self.wfile.write(chunk)
                self.wfile.flush()

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve

    return Handler


LABEL_RULE = "63 characters or less, of [A-Za-z0-9_.-], beginning and ending alphanumeric"


def label_ok(text: str) -> bool:
    """Kubernetes' label rule, which Hugging Face Jobs may enforce and autoslm keeps for every name and label a
    vendor stores (the fakes of the others hold their pod names to it too, to prove that promise)."""
    return len(text) <= 63 and re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?", text) is not None


def written_json(path: Path) -> Any:
    """The JSON a child process writes to ``path``, once whole; None before. A child's ``open(path, "w")``
    makes the file before it writes it: a look in between finds it empty (or half written)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll until ``predicate()`` is truthy; return its value, or raise AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)
