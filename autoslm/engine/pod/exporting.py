"""An export's pod: a run's adapter merged and written as safetensors or GGUF, into this run's store.

An export on a rented GPU is a run whose JobSpec has ``[export]`` (written by `autoslm export --on`):
the provider starts the worker as for training, the runner sees ``spec.export`` and comes here instead.
So every guard of a run applies unchanged: the watchdog and the supervisor end the pod at the run's
``limits``, `autoslm cancel` and `autoslm gc` end it.

What the worker does: fetch the adapter from the store it was trained into, run the same export as
`autoslm export` does on a laptop (engine/export/: every check first, then the merge and the
conversion into a staging folder), beating a heartbeat at each step, then put the files under this
run's ``export/`` with its metrics and DONE (and a copy of the adapter under its ``adapter/``: what a
succeeded run hands back). A refusal (an architecture the converter does not know,
too little disk) is a non-retryable error naming it. `autoslm download` fetches the files.
"""

from __future__ import annotations

import shutil
import time

from autoslm.errors import FatalWorkerError


def export_on_pod(ctx, spec, artifacts, uploader, reporter, log) -> None:
    """The export of ``spec.export``, its files in this run's store; returns when DONE is written."""
    from autoslm.engine.export.plan import Refused, make_plan
    from autoslm.engine.export.run import Failed, export
    from autoslm.store import open_store
    from autoslm.store.adapters import AdapterDamaged, check_adapter

    ex = spec.export
    t0 = time.time()
    reporter.beat("setup", message=f"fetching the adapter of run {ex.source_run}")
    adapter = ctx.workdir / "adapter"
    open_store(ex.store).download(ex.adapter_path, adapter)
    try:
        check_adapter(adapter)
    except AdapterDamaged as e:
        raise FatalWorkerError(f"the adapter to export ({ex.store} {ex.adapter_path}): {e.path.name}: {e.problem}") from None
    # What the run hands back, as any run does (a succeeded run has an adapter): the one it exports.
    uploader.required(lambda: artifacts.put_adapter(adapter), "adapter", timeout=300)
    out = ctx.workdir / "export"
    req = {
        "run_id": ex.source_run,
        "model": spec.model,
        "trust_remote_code": spec.trust_remote_code,
        "adapter": str(adapter),
        "format": ex.format,
        "quant": ex.quant,
        "dtype": ex.dtype,
        "dest": str(out),
        "free_bytes": shutil.disk_usage(ctx.workdir).free,
        "thinking": spec.thinking,
        "sampling": {"temperature": spec.train.temperature} if spec.train.method == "grpo" else {},
    }

    def say(msg: str) -> None:
        log(f"[autoslm] export: {msg}")
        reporter.beat("training", activity="exporting", message=msg.strip())

    try:
        files = export(make_plan(req, ctx.home, say), ctx.home, say)
    except (Refused, Failed) as e:
        raise FatalWorkerError(f"export of run {ex.source_run}: {e}") from None
    say(f"uploading {', '.join(f.name for f in files)}")
    uploader.required(lambda: artifacts.put_export(out), "export", timeout=3600)
    metrics = {
        "export": {
            "source_run": ex.source_run,
            "step": ex.step,
            "format": ex.format,
            "quant": ex.quant,
            "files": [f.name for f in files],
            "bytes": sum(f.stat().st_size for f in files),
            "seconds": round(time.time() - t0, 1),
        }
    }
    uploader.required(lambda: artifacts.put_metrics(metrics), "metrics", timeout=120)
    reporter.beat("done", message=f"exported {ex.format}{' ' + ex.quant if ex.quant else ''}")
    uploader.required(artifacts.mark_done, "DONE", timeout=120)
