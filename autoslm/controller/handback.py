"""What a run ended at its time or money limit hands back, when the worker could not hand it back itself.

The worker stops training before a limit and saves its adapter (engine/pod/limits.py). When the
controller or the in-pod watchdog ends the run instead (the worker was hung, slow to save, or the
limit came before training did), ``reconcile`` decides ``HandBack`` and the supervisor calls
``hand_back``: the adapter the worker saved, if that reached the store; else, where the run hands back
keep_best's choice (``recipes.evaluation.hands_back_best``), the adapter keep_best kept in ``best/``
(engine/pod/best.py: its record checked); else the adapter of the newest complete checkpoint (its
manifest checked). It is put in the run's ``adapter/``, metrics.json says which step it is from, why,
and (``limit.chosen_by``) that keep_best chose it, and DONE is written. The run then succeeded, its end reason naming the limit,
and ``status``, ``download``, ``chat`` and the report treat it as any finished run. With nothing to
hand back it failed, as before.

It must never: hand back a damaged adapter (``check_adapter`` first), or a checkpoint's optimizer state.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from autoslm.controller.reconcile import HandBack, SetState
from autoslm.controller.state import EndReason, RunState
from autoslm.errors import StoreError
from autoslm.layout import LIMIT_HOURS, LIMIT_USD
from autoslm.store.adapters import AdapterDamaged, check_adapter
from autoslm.store.artifacts import BestDamaged, RunArtifacts

# What of a checkpoint is the adapter (what peft's save_pretrained writes at its top level); the rest
# (optimizer, scheduler, RNG, trainer state) is for resuming, not for using.
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin", "README.md")
_LIMIT_NAME = {EndReason.DEADLINE: LIMIT_HOURS, EndReason.MONEY_LIMIT: LIMIT_USD}
_LIMIT_WORDS = {
    EndReason.DEADLINE: "the time limit (limits.max_hours)",
    EndReason.MONEY_LIMIT: "the money limit (limits.max_usd)",
}


def hand_back(artifacts: RunArtifacts, action: HandBack, step: int, total_steps: int, keep_best: bool = False) -> SetState:
    """Put what the run learned in its place and say how it ended. ``step``/``total_steps``: where the
    run was when the limit ended it; ``keep_best``: the run hands back keep_best's choice."""
    words = _LIMIT_WORDS.get(action.reason, action.reason.words)
    with tempfile.TemporaryDirectory(prefix="autoslm-handback-") as tmp:
        try:
            found = _saved_adapter(artifacts, Path(tmp))
            if found is None and keep_best:
                found = _best_adapter(artifacts, Path(tmp))
            if found is None or found.source == "unusable":
                unusable = found.note if found is not None else None
                found = _checkpoint_adapter(artifacts, Path(tmp))
                if found is not None and unusable:
                    found.note = unusable
            if found is None:
                return SetState(RunState.FAILED, f"{action.error}; no checkpoint was saved to hand back", action.reason)
            if found.source != "worker":
                artifacts.put_adapter(found.folder)
            artifacts.put_metrics(_metrics(artifacts.get_metrics() or {}, found, action, words, step, total_steps))
            artifacts.mark_done()
        except StoreError as e:
            return SetState(
                RunState.FAILED, f"{action.error}; the store failed while handing back the last checkpoint: {e}", action.reason
            )
    return SetState(RunState.SUCCEEDED, None, action.reason)


@dataclass
class Found:
    """An adapter to hand back: its folder, the step it is from, where it came from ("worker", "best",
    "checkpoint"; "unusable": keep_best's record, set aside), keep_best's record, a note on the choice."""

    folder: Path | None
    step: int | None
    source: str
    best: dict | None = None
    note: str | None = None


def _metrics(metrics: dict, found: Found, action: HandBack, words: str, step: int, total_steps: int) -> dict:
    """metrics.json after a hand-back: which adapter, from which step, and why."""
    which = {
        "worker": "the one the worker saved",
        "checkpoint": f"checkpoint step {found.step}'s",
    }.get(found.source)
    limit = {
        "name": _LIMIT_NAME.get(action.reason),
        "step": found.step,
        "total_steps": total_steps,
        "by": "controller",
        "adapter_from": found.source,
    }
    if found.source == "best":
        b = found.best
        start = " at the run's start" if b["when"] == "before" else ""
        which = f"keep_best's choice, step {found.step}'s ({b['metric']} {b['value']}{start})"
        limit.update(chosen_by="keep_best", metric=b["metric"], value=b["value"], when=b["when"])
        val = metrics.get("validation") if isinstance(metrics.get("validation"), dict) else {}
        best = {"step": found.step, "when": b["when"], "value": b["value"]}
        metrics["validation"] = {**val, "metric": b["metric"], "keep_best": True, "adapter": "best", "best": best}
    note = f"{words} ended the run at step {step}/{total_steps}; the adapter handed back is {which}"
    if found.note:
        note += f" ({found.note})"
    metrics.update(
        steps=metrics.get("steps", found.step),
        total_steps=metrics.get("total_steps", total_steps),
        stop_reason=note,
        limit=limit,
    )
    ev = metrics.setdefault("eval", {})
    if found.source == "best":
        ev["after_step"] = found.step  # the adapter handed back is this step's, whatever was evaluated later
    else:
        ev.setdefault("after_step", found.step)
    return metrics


def _saved_adapter(artifacts: RunArtifacts, tmp: Path) -> Found | None:
    """The worker's own adapter, when its upload landed before the end (DONE did not): whole and readable."""
    if not artifacts.has_adapter():
        return None
    dest = artifacts.fetch_adapter(tmp / "saved")
    try:
        check_adapter(dest)
    except AdapterDamaged:
        return None
    metrics = artifacts.get_metrics() or {}
    return Found(dest, metrics.get("steps"), "worker")


def _best_adapter(artifacts: RunArtifacts, tmp: Path) -> Found | None:
    """The adapter keep_best kept (``best/``, its record checked), or None when it kept none; a record
    that cannot be trusted is "unusable", with a note, and the newest checkpoint is handed back instead."""
    try:
        got = artifacts.fetch_best(tmp / "best")
    except BestDamaged as e:
        return Found(None, None, "unusable", note=f"keep_best's adapter could not be used: {e}")
    if got is None:
        return None
    record, folder = got
    step, metric, value = record.get("step"), record.get("metric"), record.get("value")
    if not isinstance(step, int) or not isinstance(metric, str) or not isinstance(value, (int, float)):
        return Found(None, None, "unusable", note="keep_best's adapter could not be used: its record is unreadable")
    out = _adapter_files(folder, tmp / "best-adapter")
    return Found(out, step, "best", best={"metric": metric, "value": value, "when": record.get("when"), "step": step})


def _checkpoint_adapter(artifacts: RunArtifacts, tmp: Path) -> Found | None:
    """The newest complete checkpoint's adapter files, or None when no checkpoint holds a readable one."""
    got = artifacts.fetch_latest_checkpoint(tmp / "checkpoints")
    if got is None:
        return None
    step, ckpt = got
    out = _adapter_files(ckpt, tmp / "adapter")
    try:
        check_adapter(out)
    except AdapterDamaged:
        return None
    return Found(out, step, "checkpoint")


def _adapter_files(folder: Path, out: Path) -> Path:
    """The adapter's own files of ``folder`` (not a checkpoint's state to resume from, nor keep_best's record)."""
    out.mkdir()
    for name in ADAPTER_FILES:
        if (folder / name).is_file():
            shutil.copy2(folder / name, out / name)
    return out
