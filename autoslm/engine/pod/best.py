"""keep_best across attempts: the best evaluation so far, kept in the store (``RunPaths.best``).

An attempt knows only the weights it evaluated itself; a relaunched one resumes from a checkpoint and
has lost the rest (the adapter it started from, a better one before the preemption). So each new best
evaluation before the end goes to the store, its adapter and its record (step, evaluation, metric
value, attempt), through the uploader and ahead of any later checkpoint; an attempt reads it back before
its own evaluations, and keep_best then chooses among every evaluation of the run. A record that is
partial or damaged is set aside with a note (the "best_unusable" event): the attempt goes on with its
own evaluations, as if there were none.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from autoslm.engine.pod.validation import Best, StoredAdapter, earlier_best
from autoslm.errors import StoreUnavailable
from autoslm.store.adapters import SAFETENSORS


class StoreKeeper:
    """keep_best's keeper for a run's worker (``Validation``'s ``keeper``): it recalls the best evaluation
    earlier attempts recorded in the store, and records each new one there through the uploader. ``job``
    is the worker's (engine/pod/phases.Job): its model and uploader are read when they are used."""

    def __init__(self, job):
        self.job = job

    def recall(self) -> tuple[Best | None, str | None]:
        job = self.job
        dest = job.ctx.workdir / "best-earlier"
        earlier, note = job.ranks.on_each_node(
            lambda: read(job.artifacts, dest, job.validation.metric, job.model),
            lambda found: found[0] is not None and job.artifacts.fetch_best(dest),  # each pod's own copy
        )
        if earlier is not None and isinstance(earlier.weights, StoredAdapter):
            earlier = dataclasses.replace(earlier, weights=StoredAdapter(dest))  # this pod's folder
        if note is not None:
            job.reporter.event("best_unusable", note=note)
        elif earlier is not None:
            job.reporter.event(
                "best_recalled",
                step=earlier.step,
                when=earlier.when,
                metric=job.validation.metric,
                value=earlier.value,
                attempt=earlier.attempt,
            )
        return earlier, note

    def record(self, best: Best, model) -> None:
        offer(self.job, best, model)


def read(artifacts, dest: Path, metric: str, model) -> tuple[Best | None, str | None]:
    """(the best an earlier attempt recorded, or None; a note when its record cannot be used). A store
    that cannot tell raises: the attempt fails and is retried, as for its checkpoint."""
    try:
        found = artifacts.fetch_best(dest)
        if found is None:
            return None, None
        record, folder = found
        best = earlier_best(record, metric, folder)
        check_fits(model, folder)
        return best, None
    except StoreUnavailable:
        raise
    except Exception as e:  # noqa: BLE001 - whatever is wrong with it, the run goes on without it
        return None, (
            f"the best evaluation an earlier attempt recorded cannot be used ({type(e).__name__}: {e}): "
            "keep_best chooses among this attempt's evaluations only"
        )


def check_fits(model, folder: Path) -> None:
    """The recorded adapter has the tensors, by name and shape, of the adapter this model trains."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    want = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(model).items()}
    got = {k: tuple(v.shape) for k, v in load_file(str(folder / SAFETENSORS)).items()}
    if want != got:
        differ = sorted(set(want) ^ set(got)) or sorted(k for k in want if want[k] != got[k])
        raise ValueError(f"its adapter does not fit this model ({len(differ)} tensors differ, e.g. {differ[0]})")


def offer(job, best: Best, model) -> None:
    """Write the new best's adapter and hand it to the uploader (rank 0). A failure here costs only what
    a later attempt could have recalled: it is said, never raised into training."""
    if not job.ranks.is_main:
        return
    from autoslm.engine.distributed import save_trained_adapter

    folder = job.ctx.workdir / "best-out"
    record = {
        "step": best.step,
        "when": best.when,
        "metric": job.validation.metric,
        "value": best.value,
        "result": best.result,
        "attempt": job.ctx.attempt,
    }
    try:
        shutil.rmtree(folder, ignore_errors=True)
        save_trained_adapter(model, folder)
        job.uploader.best(best.step, folder, record)  # snapshots the folder before it returns
    except Exception as e:  # noqa: BLE001
        job.reporter.event("best_not_recorded", step=best.step, reason=f"{type(e).__name__}: {e}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
