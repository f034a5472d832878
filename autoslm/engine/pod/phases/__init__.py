"""The worker's training, phase by phase: begin -> data -> load -> trainer -> before-eval -> train ->
after-eval -> save -> report. ``runner._train`` calls them in that order; each reads and fills one
``Job`` (job.py), the attempt's shared state. Training that stops before the run's time or money limit
(engine/pod/limits.py) goes through the same after-eval, save and report: the run hands back what it
learned, and metrics.json and the last heartbeat name the limit.

The phases, by what they are for:
- prepare.py: begin, data, load: the worker_start event, the environment and held-out examples, the
  model and its adapter, the checkpoint to resume from;
- training.py: trainer, before-eval, train: the TRL trainer with autoslm's callbacks, the evaluation of
  the model training starts from, training itself;
- hand_back.py: after-eval, save, report: the adapter the run hands back, metrics.json, DONE. With
  ``[eval] lm_eval`` the harness runs after the report, outside these phases
  (engine/pod/lm_eval_phase.py): nothing optional runs before the run is handed back.

Each phase does one thing the worker's log and heartbeats name. What a phase decides (the distributed
strategy, how the "before" evaluation is had, whether training stopped short, what metrics.json says)
is a small pure function beside it, tested on its own (tests/unit/test_worker_phases.py). Nothing here
runs at import time; torch, transformers and TRL are imported inside the phases that use them.
"""

from autoslm.engine.pod.phases.hand_back import (
    evaluate_after,
    extra_metrics,
    final_eval_wanted,
    limit_words,
    report,
    run_metrics,
    save,
)
from autoslm.engine.pod.phases.job import HandedBack, Job, Trained
from autoslm.engine.pod.phases.prepare import (
    begin,
    continues_adapter,
    distributed_info,
    fetch_init_adapter,
    generation_budget,
    is_done,
    load_data,
    load_model,
)
from autoslm.engine.pod.phases.training import (
    before_eval_source,
    build_trainer,
    evaluate_before,
    finished_checkpoint,
    last_loss,
    method_trainer,
    train,
    train_meta,
)

__all__ = [
    "Job",
    "Trained",
    "HandedBack",
    "begin",
    "distributed_info",
    "is_done",
    "load_data",
    "generation_budget",
    "load_model",
    "continues_adapter",
    "fetch_init_adapter",
    "build_trainer",
    "method_trainer",
    "evaluate_before",
    "before_eval_source",
    "train_meta",
    "train",
    "finished_checkpoint",
    "last_loss",
    "evaluate_after",
    "final_eval_wanted",
    "limit_words",
    "save",
    "run_metrics",
    "report",
    "extra_metrics",
]
