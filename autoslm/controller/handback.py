"""What a run ended at its time or money limit hands back, when the worker could not hand it back itself.

The worker stops training before a limit and saves its adapter (engine/pod/limits.py). When the
controller or the in-pod watchdog ends the run instead (the worker was hung, slow to save, or the
limit came before training did), ``reconcile`` decides ``HandBack`` and the supervisor calls
``hand_back``: the adapter the worker saved, if that reached the store, else the adapter of the newest
complete checkpoint (its manifest checked) is put in the run's ``adapter/``, metrics.json says which
step it is from and why, and DONE is written. The run then succeeded, its end reason naming the limit,
and ``status``, ``download``, ``chat`` and the report treat it as any finished run. With nothing to
hand back it failed, as before.

It must never: hand back a damaged adapter (``check_adapter`` first), or a checkpoint's optimizer state.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from autoslm.controller.reconcile import HandBack, SetState
from autoslm.controller.state import EndReason, RunState
from autoslm.errors import StoreError
from autoslm.layout import LIMIT_HOURS, LIMIT_USD
from autoslm.store.adapters import AdapterDamaged, check_adapter
from autoslm.store.artifacts import RunArtifacts

# What of a checkpoint is the adapter (what peft's save_pretrained writes at its top level); the rest
# (optimizer, scheduler, RNG, trainer state) is for resuming, not for using.
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin", "README.md")
_LIMIT_NAME = {EndReason.DEADLINE: LIMIT_HOURS, EndReason.MONEY_LIMIT: LIMIT_USD}
_LIMIT_WORDS = {
    EndReason.DEADLINE: "the time limit (limits.max_hours)",
    EndReason.MONEY_LIMIT: "the money limit (limits.max_usd)",
}


def hand_back(artifacts: RunArtifacts, action: HandBack, step: int, total_steps: int) -> SetState:
    """Put what the run learned in its place and say how it ended. ``step``/``total_steps``: where the
    run was when the limit ended it."""
    words = _LIMIT_WORDS.get(action.reason, action.reason.words)
    with tempfile.TemporaryDirectory(prefix="autoslm-handback-") as tmp:
        try:
            found = _saved_adapter(artifacts, Path(tmp)) or _checkpoint_adapter(artifacts, Path(tmp))
            if found is None:
                return SetState(RunState.FAILED, f"{action.error}; no checkpoint was saved to hand back", action.reason)
            adapter_dir, from_step, source = found
            if source == "checkpoint":
                artifacts.put_adapter(adapter_dir)
            note = f"{words} ended the run at step {step}/{total_steps}; the adapter handed back is " + (
                f"checkpoint step {from_step}'s" if source == "checkpoint" else "the one the worker saved"
            )
            metrics = artifacts.get_metrics() or {}
            metrics.update(
                steps=metrics.get("steps", from_step),
                total_steps=metrics.get("total_steps", total_steps),
                stop_reason=note,
                limit={
                    "name": _LIMIT_NAME.get(action.reason),
                    "step": from_step,
                    "total_steps": total_steps,
                    "by": "controller",
                    "adapter_from": source,
                },
            )
            metrics.setdefault("eval", {}).setdefault("after_step", from_step)
            artifacts.put_metrics(metrics)
            artifacts.mark_done()
        except StoreError as e:
            return SetState(
                RunState.FAILED, f"{action.error}; the store failed while handing back the last checkpoint: {e}", action.reason
            )
    return SetState(RunState.SUCCEEDED, None, action.reason)


def _saved_adapter(artifacts: RunArtifacts, tmp: Path) -> tuple[Path, int | None, str] | None:
    """The worker's own adapter, when its upload landed before the end (DONE did not): whole and readable."""
    if not artifacts.has_adapter():
        return None
    dest = artifacts.fetch_adapter(tmp / "saved")
    try:
        check_adapter(dest)
    except AdapterDamaged:
        return None
    metrics = artifacts.get_metrics() or {}
    return dest, metrics.get("steps"), "worker"


def _checkpoint_adapter(artifacts: RunArtifacts, tmp: Path) -> tuple[Path, int, str] | None:
    """The newest complete checkpoint's adapter files, or None when no checkpoint holds a readable one."""
    got = artifacts.fetch_latest_checkpoint(tmp / "checkpoints")
    if got is None:
        return None
    step, ckpt = got
    out = tmp / "adapter"
    out.mkdir()
    for name in ADAPTER_FILES:
        if (ckpt / name).is_file():
            shutil.copy2(ckpt / name, out / name)
    try:
        check_adapter(out)
    except AdapterDamaged:
        return None
    return out, step, "checkpoint"
