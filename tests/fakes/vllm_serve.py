"""A stand-in for vLLM's OpenAI server, for the stacks without vLLM (the laptop's): a real process that
takes `vllm serve`'s arguments and answers the same HTTP API on its --host/--port.

    python -m tests.fakes.vllm_serve BASE --enable-lora --lora-modules NAME=ADAPTER --max-lora-rank R --port P ...

A serve's pod starts it in place of vLLM when ``AUTOSLM_SERVE_SERVER`` names it (engine/pod/serving.py).
It checks that each LoRA module's folder holds an adapter_config.json, lists the base model and the
modules at /v1/models, and answers /v1/chat/completions for a listed model with a fixed text that
names the model (a 404 for any other, as vLLM does). It generates nothing: tests of the real server
run in the vLLM stack (tests/colocated/test_serve_vllm.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--lora-modules", nargs="*", default=[])
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    args, _ = p.parse_known_args(argv)
    loras = dict(m.split("=", 1) for m in args.lora_modules)
    for name, folder in loras.items():
        if not (Path(folder) / "adapter_config.json").is_file():
            print(f"stand-in server: LoRA module {name}: no adapter_config.json in {folder}", flush=True)
            return 2
    base = args.served_model_name or args.model
    models = [base, *loras]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, status: int, body: dict) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):
            if self.path == "/v1/models":
                return self._send(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in models]})
            self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path != "/v1/chat/completions":
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            if body.get("model") not in models:
                return self._send(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
            text = f"stand-in answer from {body['model']}"
            self._send(
                200,
                {
                    "id": "chatcmpl-standin",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body["model"],
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                },
            )

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"stand-in server: {', '.join(models)} on {args.host}:{args.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
