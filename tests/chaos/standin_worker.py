"""A light stand-in for the worker (``python -m autoslm.engine``), for tests where training is not the point.

The fake clouds run it instead of the real worker (``FakeCloud(worker_command=...)``). It reads the same
environment, writes the same artifact layout and heartbeats to the same store, resumes from its last
checkpoint, writes an adapter, metrics and DONE, and runs the real in-pod watchdog and the real
self-termination. A "step" is a sleep (CHAOS_STEP_S), so a run takes seconds and no torch is imported.

CHAOS_MODE (through the fake's ``extra_env``): ``train`` (default), ``crash`` (fails at setup with a
retryable error, every time it starts), ``no-adapter`` (writes DONE without an adapter), ``hang``
(one training heartbeat, then a step that never ends), ``stuck-setup`` (a prefetch that never finishes:
"setup" heartbeats forever), ``stay`` (trains and finishes, but never ends its own pod), ``uploader``
(trains as ``train`` does, but its heartbeats and checkpoints go through the worker's own uploader,
built as the worker builds it: the JobSpec's commit budget and heartbeat timeout).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def main() -> int:
    env = dict(os.environ)
    from autoslm.engine.pod import watchdog
    from autoslm.engine.pod.selfterm import terminate_own_pod
    from autoslm.layout import Heartbeat, RunPaths
    from autoslm.spec import JobSpec
    from autoslm.store import RunArtifacts, open_store
    from autoslm.store.artifacts import ErrorRecord

    spec = JobSpec.from_json(env["AUTOSLM_JOBSPEC"])
    run_id, seed, attempt = env["AUTOSLM_RUN_ID"], int(env.get("AUTOSLM_SEED", "0")), int(env.get("AUTOSLM_ATTEMPT", "1"))
    store = open_store(env["AUTOSLM_STORE"])
    paths = RunPaths(spec.phase, run_id, seed)
    art = RunArtifacts(store, paths)
    mode = env.get("CHAOS_MODE", "train")
    step_s = float(env.get("CHAOS_STEP_S", "0.1"))
    stopping = []
    signal.signal(signal.SIGTERM, lambda *a: stopping.append(True))

    uploader = None
    if mode == "uploader":
        import tempfile
        from pathlib import Path

        from autoslm.engine.pod import uploader as uploads

        work = Path(tempfile.mkdtemp(prefix="standin-"))
        uploader = uploads.for_run(art, spec, staging_dir=work / "staging", log=lambda msg: print(msg, flush=True))

    def beat(stage: str, **kw) -> None:
        hb = Heartbeat(run_id=run_id, seed=seed, phase=spec.phase, stage=stage, attempt=attempt, **kw)
        if uploader is not None and stage not in ("error", "done"):
            uploader.heartbeat(hb)  # coalesced: the store gets the newest when the budget allows
            return
        if uploader is not None:
            uploader.close(60)  # the last word goes after everything queued before it
        art.put_heartbeat(hb)

    def save(step: int) -> None:
        if uploader is None:
            store.commit({ckpt_path: json.dumps({"step": step}).encode()}, message=f"checkpoint {step}")
            return
        d = work / f"checkpoint-{step}"
        d.mkdir()
        (d / "standin_checkpoint.json").write_text(json.dumps({"step": step}))
        uploader.checkpoint(step, d, keep=2)

    def log(msg: str) -> None:
        print(msg, flush=True)

    watchdog.start(env, spec, art, log, every_s=0.2)
    beat("setup")
    try:
        watchdog.require_price(env, spec)  # as the runner does: max_usd with no price is refused
    except Exception as e:  # noqa: BLE001 - FatalWorkerError, said as the runner says it
        beat("error", error=str(e), retryable=False)
        art.put_error(ErrorRecord(str(e), False))
        return 2
    if art.is_done():
        beat("done", message="DONE was already there")
        return _end(terminate_own_pod, env, log, 0)
    if mode == "crash":
        time.sleep(0.1)
        beat("error", error="chaos: the worker crashes at setup", retryable=True)
        art.put_error(ErrorRecord("chaos: the worker crashes at setup", True))
        return 1
    if mode == "stuck-setup":
        while True:
            time.sleep(0.3)
            beat("setup", message="downloading the model: 10%")
    ckpt_path = f"{paths.prefix}/standin_checkpoint.json"
    raw = store.read_bytes(ckpt_path)
    step = resumed = json.loads(raw)["step"] if raw else 0
    total = spec.train.max_steps or 20
    save_every = spec.train.save_every or 5
    beat("training", step=step, total_steps=total, metrics={"resumed_from": float(step)})
    if mode == "hang":
        while True:  # a step that never ends (and shrugs off SIGTERM): only the pod's end stops it
            time.sleep(1.0)
    while step < total:
        if stopping:
            beat("error", step=step, total_steps=total, error="stopped by SIGTERM", retryable=True)
            return 143
        time.sleep(step_s)
        step += 1
        beat("training", step=step, total_steps=total, loss=1.0 / step, metrics={"resumed_from": float(resumed)})
        if step % save_every == 0 or step == total:
            save(step)
    if uploader is not None:
        uploader.close(60)
    if mode != "no-adapter":
        store.commit({f"{paths.adapter}/adapter_config.json": b"{}"}, message="adapter")
    art.put_metrics({"run_id": run_id, "seed": seed, "steps": step, "total_steps": total, "attempt": attempt})
    beat("done", step=step, total_steps=total)
    art.mark_done()
    if mode == "stay":
        while True:  # like a worker whose self-termination failed: the pod stays until someone ends it
            time.sleep(1.0)
    return _end(terminate_own_pod, env, log, 0)


def _end(terminate_own_pod, env, log, code: int) -> int:
    try:
        what = terminate_own_pod(env)
        if what:
            log(what)
    except Exception as e:  # noqa: BLE001 - the controller's teardown is the backstop
        log(f"could not end own pod: {e}")
    return code


if __name__ == "__main__":
    sys.exit(main())
