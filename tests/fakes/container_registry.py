"""A fake container registry on 127.0.0.1: the OCI distribution API's manifest HEAD, behind the
anonymous Bearer-token dance real registries (ghcr.io, Docker Hub) ask for.

    with FakeContainerRegistry(published={"autoslm/worker:0.1.0"}) as reg:
        env = reg.env()        # AUTOSLM_REGISTRY_URL pointing here

``HEAD /v2/<repo>/manifests/<tag>`` without a token answers 401 with a ``WWW-Authenticate: Bearer
realm=...,service=...,scope=...`` challenge; ``GET /token`` hands out an anonymous token; with it, the
HEAD answers 200 for a published ``repo:tag`` and 404 otherwise. ``requests`` records (method, path).
Fidelity gaps: no manifest bodies, digests or rate limits; every repository is public.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

TOKEN = "fake-anonymous-pull-token"


class FakeContainerRegistry:
    def __init__(self, published: set[str] | None = None):
        self.published = set(published or ())
        self.requests: list[tuple[str, str]] = []
        self._server: ThreadingHTTPServer | None = None

    def __enter__(self) -> "FakeContainerRegistry":
        reg = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _send(self, code: int, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_GET(self):
                reg.requests.append(("GET", self.path))
                if urlsplit(self.path).path == "/token":
                    return self._send(200, {"Content-Type": "application/json"}, json.dumps({"token": TOKEN}).encode())
                return self._send(404)

            def do_HEAD(self):
                reg.requests.append(("HEAD", self.path))
                path = urlsplit(self.path).path
                if not (path.startswith("/v2/") and "/manifests/" in path):
                    return self._send(404)
                repo, _, ref = path[len("/v2/") :].partition("/manifests/")
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    realm = f"{reg.url}/token"
                    return self._send(
                        401, {"WWW-Authenticate": f'Bearer realm="{realm}",service="fake",scope="repository:{repo}:pull"'}
                    )
                return self._send(
                    200 if f"{repo}:{ref}" in reg.published else 404, {"Content-Type": "application/vnd.oci.image.index.v1+json"}
                )

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def env(self) -> dict[str, str]:
        return {"AUTOSLM_REGISTRY_URL": self.url}
