"""What worker_image/boot.py asks of autoslm while a bootstrap pod installs it: heartbeats, records, failure.

    python -m autoslm.engine.pod.boot beat "installing autoslm 0.1.0 [worker,gpu]: 40 s"
    python -m autoslm.engine.pod.boot fail "installing autoslm 0.1.0 failed (pip exit 1)" --log /tmp/autoslm-boot/pip.log
    python -m autoslm.engine.pod.boot fallback "could not install vllm==0.31.0 on this image (...): generating with transformers"
    python -m autoslm.engine.pod.boot install "vllm==0.31.0" --added nvidia-cudnn-frontend==1.19.1 --kept "torchaudio==2.11.1 (wanted 2.11.0)"

``beat`` writes a "setup" heartbeat and a "setup" event to the run's store, so `autoslm status` and
`watch` show the stage. ``fail`` records a non-retryable error (the same install fails the same way on
a new pod: relaunching would only spend money), then ends its own pod with the credentials the vendor
injects. ``fallback`` records a "generation_fallback" event: a GRPO run planned with colocated vLLM on
an image where vLLM could not be installed generates with transformers instead. ``install`` records
what an install added to the image (an "install" event: new nvidia-*/cuda-* distributions first) and
which held package it kept at the image's version against the installed package's pin. All run right
after autoslm's light dependencies are installed, before torch is imported, and need nothing but the
core install. ``fail`` exits 2, or 3 when it could not end the pod it runs in (boot.py then waits for
the controller rather than be restarted).

It must never print the environment, and never put more of pip's output into the store than its last
lines with secrets redacted.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

LOG_TAIL_LINES = 30


def log(msg: str) -> None:
    print(f"[autoslm] {msg}", flush=True)


def _artifacts(env: dict[str, str]):
    """(RunArtifacts, Heartbeat fields) for this pod's replica, or None outside a run."""
    from autoslm.layout import PodEnv, RunPaths
    from autoslm.store import RunArtifacts, open_store

    try:
        pod = PodEnv.from_env(env)
    except ValueError:
        return None  # the worker itself says what is wrong with it
    if pod is None:
        return None
    fields = {"run_id": pod.run_id, "seed": pod.seed, "phase": pod.phase, "attempt": pod.attempt}
    return RunArtifacts(open_store(pod.store_uri), RunPaths(pod.phase, pod.run_id, pod.seed)), fields


def beat(message: str, env: dict[str, str]) -> int:
    log(message)
    found = _artifacts(env)
    if found is None:
        return 0
    artifacts, fields = found
    from autoslm.layout import Event, Heartbeat

    try:
        artifacts.put_heartbeat(Heartbeat(stage="setup", message=message, **fields))
        artifacts.append_events([Event(kind="setup", data={"message": message})])
    except Exception as e:  # noqa: BLE001 - progress is a courtesy: the install goes on
        log(f"could not write a heartbeat ({type(e).__name__})")
    return 0


def fallback(message: str, env: dict[str, str]) -> int:
    log(message)
    found = _artifacts(env)
    if found is None:
        return 0
    artifacts, _ = found
    from autoslm.layout import Event

    try:
        artifacts.append_events(
            [Event(kind="generation_fallback", data={"wanted": "vllm", "got": "transformers", "reason": message})]
        )
    except Exception as e:  # noqa: BLE001 - the worker's own notes say it too
        log(f"could not write the event ({type(e).__name__})")
    return 0


def fail(message: str, log_file: str | None, env: dict[str, str]) -> int:
    from autoslm.secrets import redact

    detail = ""
    if log_file and Path(log_file).is_file():
        lines = Path(log_file).read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        detail = redact("\n".join(lines))
    found = _artifacts(env)
    if found is not None:
        artifacts, fields = found
        from autoslm.layout import Event, Heartbeat
        from autoslm.store.artifacts import ErrorRecord

        try:
            artifacts.put_heartbeat(Heartbeat(stage="error", error=message, retryable=False, **fields))
            artifacts.append_events([Event(kind="error", data={"message": message, "retryable": False})])
            artifacts.put_error(ErrorRecord(message, retryable=False, detail=detail))
            log("recorded the error in the run's store (not retryable)")
        except Exception as e:  # noqa: BLE001 - the controller's startup timeout is the backstop
            log(f"could not record the error in the store ({type(e).__name__}: {redact(str(e))[:200]})")
    from autoslm.engine.pod.selfterm import in_vendor_pod, try_terminate_own_pod

    ended = try_terminate_own_pod(env, log)
    return 3 if in_vendor_pod(env) and not ended else 2


def install(what: str, added: list[str], kept: list[str], env: dict[str, str]) -> int:
    found = _artifacts(env)
    if found is None:
        return 0
    artifacts, _ = found
    from autoslm.layout import Event

    try:
        artifacts.append_events([Event(kind="install", data={"what": what, "added": added, "kept": kept})])
    except Exception as e:  # noqa: BLE001 - the boot log says it too
        log(f"could not write the event ({type(e).__name__})")
    return 0


def main(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autoslm.engine.pod.boot", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    b = sub.add_parser("beat", help="write a setup heartbeat")
    b.add_argument("message")
    f = sub.add_parser("fail", help="record a non-retryable setup error and end this pod")
    f.add_argument("message")
    f.add_argument("--log", default=None, help="a log whose last lines go into the error's detail")
    fb = sub.add_parser("fallback", help="record that GRPO generates with transformers (no vLLM on this image)")
    fb.add_argument("message")
    i = sub.add_parser("install", help="record what an install added to the image and which held package it kept")
    i.add_argument("installed", help="what was installed, e.g. vllm==0.31.0")
    i.add_argument("--added", action="append", default=[], help="name==version, once per distribution")
    i.add_argument("--kept", action="append", default=[], help="a held package kept at the image's version")
    args = parser.parse_args(argv)
    env = dict(os.environ if environ is None else environ)
    if args.what == "beat":
        return beat(args.message, env)
    if args.what == "fallback":
        return fallback(args.message, env)
    if args.what == "install":
        return install(args.installed, args.added, args.kept, env)
    return fail(args.message, args.log, env)


if __name__ == "__main__":
    sys.exit(main())
