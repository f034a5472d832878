"""Inside the worker: find where each tracker TRL reports to keeps the run, and announce it as a "tracker" event.

TRL's own callbacks (WandbCallback, MLflowCallback...) start the tracker's run in on_train_begin;
this callback runs after them and only reads what they set up. It never fails training: a tracker
it cannot read is announced without a URL. Where a tracker keeps the run on the worker's disk (W&B
offline, an MLflow file store, trackio without a Space, TensorBoard), the URL is a file:// one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse


def skip_unreported_mlflow(report_to, environ=os.environ) -> None:
    """TRL imports MLflow wherever it is installed (its profiling module, at import), which costs a worker
    about half a second of CPU at every start; a run that does not report to MLflow turns off transformers'
    MLflow integration (its documented switch) before TRL is imported. A run that reports to it keeps it."""
    if "mlflow" not in report_to:
        environ.setdefault("DISABLE_MLFLOW_INTEGRATION", "TRUE")


def tracker_url(name: str, args) -> str | None:
    if name == "wandb":
        run = getattr(sys.modules.get("wandb"), "run", None)
        if run is None:
            return None
        if getattr(run, "url", None):
            return run.url
        files = getattr(run, "dir", None)  # offline (WANDB_MODE=offline): the run's folder, for `wandb sync`
        return Path(files).parent.resolve().as_uri() if files else None
    if name == "mlflow":
        mlflow = sys.modules.get("mlflow")
        run = mlflow.active_run() if mlflow is not None else None
        if run is None:
            return None
        uri = mlflow.get_tracking_uri()
        if uri.startswith("file:") or "://" not in uri:  # a file store: the run's own folder in it
            root = Path(unquote(urlparse(uri).path)) if uri.startswith("file:") else Path(uri)
            return (root / run.info.experiment_id / run.info.run_id).resolve().as_uri()
        return f"{uri.rstrip('/')}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
    if name == "trackio":
        space = os.environ.get("TRACKIO_SPACE_ID")
        if space:
            return f"https://huggingface.co/spaces/{space}"
        trackio = sys.modules.get("trackio")
        run = trackio.context_vars.current_run.get() if trackio is not None else None
        if run is None:
            return None
        from trackio.sqlite_storage import SQLiteStorage  # local only: the project's database file

        return SQLiteStorage.get_project_db_path(run.project).resolve().as_uri()
    if name == "tensorboard":
        # transformers' TensorBoardCallback writes under TENSORBOARD_LOGGING_DIR, else <output_dir>/runs.
        logdir = os.environ.get("TENSORBOARD_LOGGING_DIR") or str(Path(args.output_dir) / "runs")
        return Path(logdir).expanduser().resolve().as_uri()  # on the worker's disk: `tensorboard --logdir` there
    return None


def make_tracker_callback(reporter, report_to: list[str]):
    from transformers import TrainerCallback

    class TrackerAnnounce(TrainerCallback):
        announced = False

        def on_train_begin(self, args, state, control, **kw):
            if self.announced or not state.is_world_process_zero:
                return
            self.announced = True
            for name in report_to:
                try:
                    url = tracker_url(name, args)
                except Exception:  # noqa: BLE001 - a tracker we cannot read must not stop training
                    url = None
                reporter.event("tracker", name=name, url=url or "")

        def on_train_end(self, args, state, control, **kw):
            # W&B leaves its run open for the caller to finish; its writer process would be killed with
            # the pod (which ends once DONE is written) before it flushes and closes the run. Finish
            # it while the worker still waits. (MLflow's and trackio's callbacks end their own runs.)
            if "wandb" in report_to and state.is_world_process_zero:
                wandb = sys.modules.get("wandb")
                try:
                    if wandb is not None and wandb.run is not None:
                        wandb.finish()
                except Exception:  # noqa: BLE001 - a tracker must not fail a trained run
                    pass

    return TrackerAnnounce()
