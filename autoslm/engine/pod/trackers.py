"""Inside the worker: find the run URL of each tracker TRL reports to, and announce it as a "tracker" event.

TRL's own callbacks (WandbCallback, MLflowCallback...) start the tracker's run in on_train_begin;
this callback runs after them and only reads what they set up. It never fails training: a tracker
it cannot read is announced without a URL.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def tracker_url(name: str, args) -> str | None:
    if name == "wandb":
        run = getattr(sys.modules.get("wandb"), "run", None)
        return getattr(run, "url", None) if run is not None else None
    if name == "mlflow":
        mlflow = sys.modules.get("mlflow")
        run = mlflow.active_run() if mlflow is not None else None
        if run is None:
            return None
        return f"{mlflow.get_tracking_uri().rstrip('/')}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
    if name == "trackio":
        space = os.environ.get("TRACKIO_SPACE_ID")
        return f"https://huggingface.co/spaces/{space}" if space else None
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

    return TrackerAnnounce()
