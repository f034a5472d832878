"""Experiment trackers (``[train] report_to``): which environment variables each one needs on the pod.

The JobSpec names the trackers; their keys and endpoints stay in the user's environment and are
passed to the pod by name (never written in a JobSpec). The secret ones are listed in
``autoslm.secrets.SECRET_ENV_VARS`` so that ``redact`` scrubs their values from everything written.
"""

from __future__ import annotations

import os

# tracker -> variables passed through to the pod when set here (keys, endpoints, project names).
TRACKER_ENV: dict[str, tuple[str, ...]] = {
    "wandb": ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_ENTITY", "WANDB_PROJECT", "WANDB_MODE", "WANDB_RUN_GROUP"),
    "mlflow": (
        "MLFLOW_TRACKING_URI",
        "MLFLOW_TRACKING_TOKEN",
        "MLFLOW_TRACKING_USERNAME",
        "MLFLOW_TRACKING_PASSWORD",
        "MLFLOW_EXPERIMENT_NAME",
        "MLFLOW_ALLOW_FILE_STORE",
    ),  # MLflow 3 refuses a file store without it
    "trackio": ("HF_TOKEN", "TRACKIO_SPACE_ID", "TRACKIO_PROJECT", "TRACKIO_DATASET_ID"),
    "tensorboard": ("TENSORBOARD_LOGGING_DIR",),
}


def pod_env(report_to: list[str], environ: dict[str, str] | None = None) -> dict[str, str]:
    """The tracker variables to give a pod: each one the named trackers need that is set here."""
    env = os.environ if environ is None else environ
    return {name: env[name] for t in report_to for name in TRACKER_ENV.get(t, ()) if env.get(name)}
