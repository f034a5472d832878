"""A run that does not report to MLflow turns transformers' MLflow integration off before TRL is imported
(TRL imports MLflow wherever it is installed); one that reports to it, or a switch the pod already set,
is left as it is. tests/e2e/test_trackers.py runs MLflow reporting end to end."""

from autoslm.engine.pod.trackers import skip_unreported_mlflow


def test_a_run_without_mlflow_turns_the_integration_off():
    env: dict[str, str] = {}
    skip_unreported_mlflow(["wandb"], env)
    assert env == {"DISABLE_MLFLOW_INTEGRATION": "TRUE"}


def test_a_run_reporting_to_mlflow_keeps_it_and_a_set_switch_is_kept():
    env: dict[str, str] = {}
    skip_unreported_mlflow(["mlflow"], env)
    assert env == {}
    env = {"DISABLE_MLFLOW_INTEGRATION": "false"}
    skip_unreported_mlflow([], env)
    assert env == {"DISABLE_MLFLOW_INTEGRATION": "false"}
