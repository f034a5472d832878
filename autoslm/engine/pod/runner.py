"""The worker, top to bottom: setup -> train (its phases: engine/pod/phases/, which end by handing the
run back: adapter, metrics.json, DONE) -> lm-eval after the hand-back, with ``[eval] lm_eval``
(engine/pod/lm_eval_phase.py) -> clean up. A serve's worker (a ``ServeSpec``, from `autoslm serve`)
serves instead of training (engine/pod/serving.py), and an export's (``spec.export``, from `autoslm
export --on`) exports (engine/pod/exporting.py).

Started as ``python -m autoslm.engine`` by a provider. Everything it needs comes from its environment
(see ``context.py``) and the JobSpec; nothing happens at import time and nothing is global.

Exit codes: 0 done (or already done; also when training stopped before the run's time or money limit
and the adapter was handed back), 1 a retryable error (the controller may relaunch), 2 an error a
restart cannot fix (bad spec, missing data), 143 stopped by SIGTERM (preempted).
Every error is written to ``error_<phase>.txt`` and an error heartbeat before the worker exits.

With ``compute.nodes = K > 1`` this worker runs on each of K pods (engine/nodes.py says which it is) and
is its pod's launcher. Node 0's talks to the store as one pod's does; the others only read it (DONE),
and write to it only the error of a rank of their own that failed for a reason of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import traceback

from autoslm.engine.distributed import NullUploader, Ranks, should_launch
from autoslm.engine.pod.context import WorkerContext
from autoslm.errors import AutoslmError, FatalWorkerError
from autoslm.layout import WORKER_EXIT_DONE, WORKER_EXIT_FATAL, WORKER_EXIT_RETRYABLE, WORKER_EXIT_SIGTERM
from autoslm.secrets import redact
from autoslm.store import RunArtifacts, open_store
from autoslm.store.artifacts import ErrorRecord

EXIT_DONE, EXIT_RETRYABLE, EXIT_FATAL, EXIT_SIGTERM = (
    WORKER_EXIT_DONE,
    WORKER_EXIT_RETRYABLE,
    WORKER_EXIT_FATAL,
    WORKER_EXIT_SIGTERM,
)


class Preempted(BaseException):
    """SIGTERM arrived: the pod is being taken away. BaseException so training code cannot swallow it."""


def log(msg: str) -> None:
    print(redact(msg), flush=True)


def run_worker(environ: dict[str, str] | None = None) -> int:
    env = dict(os.environ if environ is None else environ)
    try:
        ctx = WorkerContext.from_env(env)
        ranks = Ranks.from_env(env)  # one of several training processes? (see engine/distributed.py)
    except FatalWorkerError as e:
        log(f"[autoslm] error: {e}")  # no store known: the log is all there is
        return EXIT_FATAL
    phase, spec, spec_error = _parse_spec(ctx.spec_json)
    if spec is not None and spec.kind == "train":
        from autoslm.engine.pod.trackers import skip_unreported_mlflow

        skip_unreported_mlflow(spec.train.report_to)  # before anything imports TRL
    node, node_error = _node(env, spec, ranks)
    store = open_store(ctx.store_uri)
    artifacts = RunArtifacts(store, ctx.paths(phase))
    from autoslm.engine.pod import uploader as uploads
    from autoslm.engine.pod.heartbeat import Reporter

    if ranks.is_main:  # only rank 0 talks to the store (another node's launcher: its own rank's error only)
        uploader = uploads.for_run(artifacts, spec, staging_dir=ctx.workdir / "staging", log=log)
    else:
        uploader = NullUploader()
    if ranks.distributed:
        from autoslm.engine.distributed import die_with_launcher

        die_with_launcher()
    reporter = Reporter(
        uploader if node.primary else NullUploader(),
        run_id=ctx.run_id,
        seed=ctx.seed,
        phase=phase,
        attempt=ctx.attempt,
        log=log if ranks.is_main else (lambda msg: None),
    )
    previous = signal.signal(signal.SIGTERM, _raise_preempted)
    from autoslm.engine.pod import watchdog

    watchdog.start(env, spec, artifacts, log)  # deadline, max_usd and a crash loop end the pod even if training hangs
    code, end_pod = EXIT_RETRYABLE, False
    try:
        if spec_error is not None or node_error is not None:
            raise spec_error or node_error
        watchdog.require_price(env, spec)  # a max_usd with no price to count it by: refuse, never train unguarded
        if spec.kind == "serve":  # `autoslm serve`: vLLM's server for an adapter, within the run's limits
            from autoslm.engine.pod.serving import serve

            serve(ctx, spec, artifacts, uploader, reporter, env, log)
        elif spec.export is not None:  # `autoslm export --on`: merge and convert, the files into the store
            from autoslm.engine.pod.exporting import export_on_pod

            export_on_pod(ctx, spec, artifacts, uploader, reporter, log)
        elif should_launch(spec, ranks):
            _launch_ranks(ctx, spec, artifacts, uploader, reporter, node)
        else:
            _train(ctx, spec, artifacts, uploader, reporter, ranks)
        code, end_pod = EXIT_DONE, True
    except Preempted:
        if _done_already(artifacts):  # a group's launcher ended by the controller after rank 0 handed back
            log("[autoslm] SIGTERM after the run was handed back (DONE): stopping")
        else:
            log("[autoslm] SIGTERM: stopping (the run can resume from its last checkpoint)")
            reporter.beat("error", error="stopped by SIGTERM (preempted or cancelled)", retryable=True)
        code = EXIT_SIGTERM
    except BaseException as e:  # noqa: BLE001 - every failure must reach the store before we exit
        retryable = _record_failure(e, env, ranks, artifacts, uploader, reporter)
        code = EXIT_RETRYABLE if retryable else EXIT_FATAL
        end_pod = not retryable
    finally:
        signal.signal(signal.SIGTERM, previous)
        if not uploader.close(timeout=120):
            log("[autoslm] warning: some heartbeats/events were not uploaded before exit")
        if not ranks.distributed:  # the ranks share their directory; their launcher removes it
            shutil.rmtree(ctx.workdir, ignore_errors=True)
        ranks.leave()
    # One of several pods that succeeded leaves the ending to node 0, which ends the group (RunPod: its
    # whole cluster) once its own uploads and lm-eval are done, or to the controller; a failure ends it from any pod.
    if end_pod and not ranks.distributed and (node.primary or code != EXIT_DONE):
        _try_terminate_own_pod(env)
    return code


def _done_already(artifacts) -> bool:
    """Whether the run is DONE in the store: a launcher whose ranks handed the run back may be ended before
    it exits (the controller ends a group of pods on DONE), and must not leave an error heartbeat after it."""
    try:
        return artifacts.is_done()
    except Exception:  # noqa: BLE001 - cannot tell: say the stop, as before
        return False


def _node(env: dict[str, str], spec, ranks: Ranks):
    """(this pod's place in its replica, or the error its variables give): read by a pod's worker, not
    by the ranks it starts (they know their rank from torch's launcher)."""
    from autoslm.engine.nodes import Node

    if spec is None or ranks.distributed or spec.kind == "serve":
        return Node(), None
    try:
        return Node.from_env(env, spec), None
    except FatalWorkerError as e:
        return Node(), e


def _record_failure(e: BaseException, env: dict[str, str], ranks: Ranks, artifacts, uploader, reporter) -> bool:
    """Say a failure everywhere it is read (the log, the launcher, the heartbeat, events, the store's
    error record); returns whether another attempt may succeed."""
    from autoslm.engine.pod.failures import is_retryable
    from autoslm.engine.rank_launcher import PeerNodeFailed

    retryable = is_retryable(e)  # missing data, an unknown model, bad credentials: not retryable
    message = redact(f"{type(e).__name__}: {e}") if not isinstance(e, AutoslmError) else redact(str(e))
    detail = redact(traceback.format_exc())
    where = f" on {ranks}" if ranks.distributed else ""
    log(f"[autoslm] error ({'retryable' if retryable else 'not retryable'}){where}: {message}")
    follower = False
    if ranks.distributed:  # the launcher names the first rank that failed, with this message
        from autoslm.engine.rank_launcher import is_follower, record_failure

        follower = is_follower(e)
        record_failure(env, message, retryable, follower=follower)
    reporter.beat("error", error=message, retryable=retryable, gpu=_gpu_diagnostics())
    reporter.event("error", message=message, retryable=retryable)
    # A rank that only followed another's failure (a peer's closed socket), or a pod whose ranks all did:
    # the launcher of the rank that failed first writes the run's error record, naming it. Written here
    # too, rank 0's lost peer could land after it (on several pods, whichever pod writes last wins).
    if isinstance(e, PeerNodeFailed) or follower:
        return retryable
    try:
        uploader.required(lambda: artifacts.put_error(ErrorRecord(message, retryable, detail)), "error", timeout=120)
    except Exception as write_err:  # noqa: BLE001
        log(f"[autoslm] could not write the error to the store: {redact(str(write_err))}")
    return retryable


def _raise_preempted(signum, frame):
    raise Preempted()


def _parse_spec(spec_json: str):
    """(phase, spec or None, error or None): a bad spec must still be reported under the right phase."""
    from pydantic import ValidationError

    from autoslm.layout import phase_of
    from autoslm.spec import spec_from_json

    try:
        spec = spec_from_json(spec_json)
        return spec.phase, spec, None
    except ValidationError as e:
        try:
            phase = phase_of(json.loads(spec_json))
        except ValueError:
            phase = "sft"
        first = e.errors()[0]
        where = ".".join(map(str, first["loc"]))
        return str(phase), None, FatalWorkerError(f"invalid JobSpec: {where}: {first['msg']}")


def _launch_ranks(ctx: WorkerContext, spec, artifacts: RunArtifacts, uploader, reporter, node) -> None:
    """compute.gpu_count > 1 or compute.nodes > 1: start this pod's ranks of the worker and wait for them
    (engine/rank_launcher.py)."""
    from autoslm.engine.distributed import world_size
    from autoslm.engine.rank_launcher import cuda_device_count, describe, launch_ranks

    n = spec.compute.gpu_count if node.several else world_size(spec)
    reporter.beat("setup", message=f"starting {describe(n, cuda_device_count(), node)}")
    from autoslm.engine.pod.phases import is_done

    if is_done(artifacts):
        reporter.event("already_done")
        reporter.beat("done", message="DONE was already there: nothing to do")
        return
    # Only a heartbeat goes before the ranks start: this uploader reads events.jsonl when it first writes
    # an event, and that must come after rank 0's events (an error, at the end).
    if node.primary:
        uploader.required(lambda: None, "launch heartbeat", timeout=60)
    try:
        launch_ranks(ctx, spec, log, Preempted, node)
    except BaseException:
        try:  # the error heartbeat keeps the step rank 0 reached
            hb = artifacts.get_heartbeat()
            if hb is not None:
                reporter.step, reporter.total_steps = hb.step, hb.total_steps
        except Exception:  # noqa: BLE001 - the error itself matters more
            pass
        raise


def _train(ctx: WorkerContext, spec, artifacts: RunArtifacts, uploader, reporter, ranks: Ranks = Ranks()) -> None:
    """One attempt at training, as its phases (engine/pod/phases/)."""
    from autoslm.engine.gc_pause import collector_paused, thaw
    from autoslm.engine.pod import phases
    from autoslm.engine.unused_imports import import_stack_without_unused

    job = phases.Job(ctx, spec, artifacts, uploader, reporter, ranks)
    with collector_paused():  # the start's imports and builds: a second of CPU less (engine/gc_pause.py)
        import_stack_without_unused()  # and a little more: scikit-learn, SciPy, torch's compiler left out (engine/unused_imports.py)
        if not phases.begin(job):  # DONE already there
            return
        from autoslm.engine.pod.lm_eval_phase import check_tasks

        check_tasks(spec)  # before any training: an unknown lm-eval task ends the run now
        phases.load_data(job)
        phases.load_model(job)
        phases.build_trainer(job)
    try:
        phases.evaluate_before(job)
        trained = phases.train(job)
    finally:
        thaw()  # what the start made is collectable again before anything after training lets it go
    handed_back = phases.evaluate_after(job, trained)  # with keep_best, the best evaluation's adapter
    adapter_dir = phases.save(job)
    from autoslm.engine.pod import lm_eval_phase

    # The run is handed back (adapter, metrics, DONE) before anything optional runs: lm-eval follows it.
    follows = lm_eval_phase.follows(job)
    metrics = phases.report(job, trained, handed_back, adapter_dir, lm_eval_follows=follows)
    if follows:
        lm_eval_phase.run_after_hand_back(job, adapter_dir, metrics, stopped=Preempted)


def _gpu_diagnostics() -> dict | None:
    try:
        from autoslm.engine.train.gpu import gpu_diagnostics

        return gpu_diagnostics()
    except Exception:  # noqa: BLE001 - diagnostics must never mask the real error
        return None


def _try_terminate_own_pod(env: dict[str, str]) -> None:
    """On a rented pod, terminate it with the pod-scoped ids the provider injected (never the user's key)."""
    from autoslm.engine.pod.selfterm import try_terminate_own_pod

    try_terminate_own_pod(env, log)
