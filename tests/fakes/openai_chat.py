"""A fake OpenAI-compatible ``/chat/completions`` endpoint on 127.0.0.1 (stdlib only).

It scores deterministically (default: "SCORE: 1" when the user message contains GOOD, "SCORE: 0" for
BAD, "SCORE: 0.5" otherwise), and can, on demand, fail the next requests with a status, hang them,
or answer with a given text. It records every request body, the Authorization headers it saw, and the
largest number of requests it served at once.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def default_scorer(messages: list[dict]) -> str:
    text = next((m.get("content", "") for m in reversed(messages) if m.get("role") == "user"), "")
    if "GOOD" in text:
        return "The response is right.\nSCORE: 1"
    if "BAD" in text:
        return "The response is wrong.\nSCORE: 0"
    return "SCORE: 0.5"


class FakeChatServer:
    def __init__(self, *, api_key: str | None = None, scorer: Callable[[list[dict]], str] = default_scorer, delay_s: float = 0.0):
        self.api_key = api_key
        self.scorer = scorer
        self.delay_s = delay_s
        self.requests: list[dict] = []
        self.auth_headers: list[str | None] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._gather = 0  # hold requests until this many are in flight together (``gather``)
        self._gathered = threading.Condition()
        self._plan: list[tuple[str, object]] = []  # queued behaviours for the next requests
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- behaviour for the next requests ------------------------------------------------------------

    def fail_next(self, n: int, status: int = 503, retry_after: float | None = None) -> None:
        with self._lock:
            self._plan += [("fail", (status, retry_after))] * n

    def hang_next(self, n: int, seconds: float) -> None:
        with self._lock:
            self._plan += [("hang", seconds)] * n

    def gather(self, n: int) -> None:
        """Hold each request until ``n`` are in flight together (once they were, none is held): a client
        that sends ``n`` at once passes at any machine load, one that sends fewer waits into its timeout."""
        self._gather = n

    def reply_next(self, n: int, text: str) -> None:
        with self._lock:
            self._plan += [("reply", text)] * n

    # -- lifecycle ---------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        assert self._server is not None, "start() the server first"
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> "FakeChatServer":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def do_POST(self):
                fake._handle(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- request handling ----------------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            action = self._plan.pop(0) if self._plan else ("ok", None)
            self.auth_headers.append(h.headers.get("Authorization"))
        with self._gathered:
            self._gathered.notify_all()
            if self._gather:
                self._gathered.wait_for(lambda: self.max_in_flight >= self._gather, timeout=60)
        try:
            answer = self._answer(h, raw, action)
        finally:
            # Out of flight before the answer is sent: the client may send its next request the moment it
            # has this one's answer, and a sequential client must never be seen with two in flight.
            with self._lock:
                self.in_flight -= 1
        try:
            self._send(h, *answer)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout): nothing to answer

    def _answer(self, h: BaseHTTPRequestHandler, raw: bytes, action: tuple[str, object]) -> tuple:
        """(status, payload, headers) for one request, after its planned behaviour's wait."""
        if not h.path.endswith("/chat/completions"):
            return 404, {"error": {"message": "not found"}}, {}
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            return 400, {"error": {"message": "bad json"}}, {}
        with self._lock:
            self.requests.append(body)
        if self.api_key is not None and h.headers.get("Authorization") != f"Bearer {self.api_key}":
            return 401, {"error": {"message": "invalid api key"}}, {}
        kind, arg = action
        if kind == "fail":
            status, retry_after = arg
            headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
            return status, {"error": {"message": f"fake failure {status}"}}, headers
        if kind == "hang":
            time.sleep(arg)
            return 200, self._completion(body, "SCORE: 1"), {}
        if self.delay_s:
            time.sleep(self.delay_s)
        text = arg if kind == "reply" else self.scorer(body.get("messages", []))
        return 200, self._completion(body, text), {}

    @staticmethod
    def _completion(body: dict, text: str) -> dict:
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "model": body.get("model", ""),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, payload: dict, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)
