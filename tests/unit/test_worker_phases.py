"""The worker's phases (engine/pod/phases/): each decision a phase makes, on its own."""

from __future__ import annotations

import json
import types

import pytest

from autoslm.engine.distributed import Ranks
from autoslm.engine.pod import phases
from autoslm.engine.pod.context import WorkerContext
from autoslm.errors import StoreUnavailable
from autoslm.spec import parse_spec

pytestmark = pytest.mark.worker  # also runs on the worker image's pins (make test-image)

SFT = """
name = "t"
model = "autoslm/tiny"
[environment]
id = "autoslm/arith"
[train]
max_steps = 10
"""
GRPO = SFT.replace("max_steps = 10", 'method = "grpo"\nmax_steps = 10\nmax_completion_tokens = 24\ninit_from_adapter = "sft-run"')


def test_runner_train_reads_as_its_phases():
    import inspect

    from autoslm.engine.pod import runner

    lines = inspect.getsource(runner._train).splitlines()
    assert len(lines) < 60
    order = [
        "begin",
        "load_data",
        "load_model",
        "build_trainer",
        "evaluate_before",
        "train(",
        "evaluate_after",
        "save(",
        "report(",
    ]
    at = [next(i for i, line in enumerate(lines) if f"phases.{name}" in line) for name in order]
    assert at == sorted(at)
    # What the user paid for is in the store first: lm-eval runs only after the report's hand-back.
    harness = [i for i, line in enumerate(lines) if "lm_eval_phase.run_" in line]
    assert harness and min(harness) > at[-1], lines


def test_distributed_info_says_when_cpu_processes_fall_back_to_ddp():
    spec = parse_spec(SFT + '[compute]\ngpu_count = 2\nstrategy = "fsdp"\n')
    assert phases.distributed_info(spec, Ranks(), cuda=False) == ({}, None)
    info, strategy = phases.distributed_info(spec, Ranks(0, 2, 0), cuda=False, backend="gloo")
    assert strategy == "ddp" and info["world_size"] == 2 and info["backend"] == "gloo" and "needs CUDA" in info["note"]
    info, strategy = phases.distributed_info(spec, Ranks(0, 2, 0), cuda=True, backend="nccl")
    assert strategy == "fsdp" and "note" not in info


class _Flaky:
    def __init__(self, failures: int, answer: bool = True):
        self.failures, self.answer, self.calls = failures, answer, 0

    def is_done(self):
        self.calls += 1
        if self.calls <= self.failures:
            raise StoreUnavailable("store down")
        return self.answer


def test_is_done_retries_a_store_that_cannot_tell_and_never_guesses():
    waits = []
    assert phases.is_done(_Flaky(2), sleep=waits.append) is True and waits == [1.0, 2.0]
    with pytest.raises(StoreUnavailable):
        phases.is_done(_Flaky(5), tries=3, sleep=waits.append)


def test_generation_budget_and_adapter_continuation():
    sft, grpo = parse_spec(SFT), parse_spec(GRPO)
    assert phases.generation_budget(sft) == 16 and phases.generation_budget(grpo) == 24
    assert phases.continues_adapter(grpo, resume=None)
    assert not phases.continues_adapter(grpo, resume=(5, "ckpt"))  # the checkpoint already holds it
    assert not phases.continues_adapter(sft, resume=None)


def test_before_eval_source():
    assert phases.before_eval_source({"eval_before": {"score": 0.5}}, synced=True) == "previous"
    assert phases.before_eval_source(None, synced=True, at_start=False) == "none"
    assert phases.before_eval_source({"spec": {}}, synced=True) == "prepared"
    assert phases.before_eval_source(None, synced=False) == "now"


def test_finished_checkpoint_and_its_last_loss(tmp_path):
    state = {"global_step": 10, "max_steps": 10, "log_history": [{"loss": 2.0}, {"loss": 1.5}, {"eval": 1}]}
    (tmp_path / "trainer_state.json").write_text(json.dumps(state))
    assert phases.finished_checkpoint(tmp_path) and phases.last_loss(tmp_path) == 1.5
    (tmp_path / "trainer_state.json").write_text(json.dumps({**state, "global_step": 4}))
    assert not phases.finished_checkpoint(tmp_path)
    assert not phases.finished_checkpoint(tmp_path / "missing") and phases.last_loss(tmp_path / "missing") is None


def test_run_metrics(tmp_path):
    ctx = WorkerContext("{}", "r-1", 3, "file:///x", None, 2, tmp_path, tmp_path)
    job = phases.Job(ctx, parse_spec(SFT), artifacts=None, uploader=None, reporter=None, ranks=Ranks(), t_start=100.0)
    job.max_steps, job.setup_s, job.resume, job.eval_before = 10, 4.0, (5, tmp_path), {"score": 0.1}
    m = phases.run_metrics(job, phases.Trained(10, 0.51234, 20.0), phases.HandedBack({"score": 0.5}, 10), tokens=4000, now=130.0)
    assert (m["steps"], m["total_steps"], m["wall_time_s"], m["train_time_s"], m["tokens_per_s"]) == (10, 10, 30.0, 20.0, 200.0)
    assert m["final_loss"] == 0.5123 and m["eval"] == {"before": {"score": 0.1}, "after": {"score": 0.5}, "after_step": 10}
    assert (m["attempt"], m["resumed_from_step"], m["world_size"]) == (2, 5, 1) and "strategy" not in m
    assert "validation" not in m and "stop_reason" not in m  # no [eval] decisions: nothing to say


def test_a_resumed_attempts_token_rate_counts_only_the_tokens_it_trained(tmp_path):
    ctx = WorkerContext("{}", "r-1", 3, "file:///x", None, 2, tmp_path, tmp_path)
    job = phases.Job(ctx, parse_spec(SFT), artifacts=None, uploader=None, reporter=None, ranks=Ranks(), t_start=100.0)
    job.max_steps, job.setup_s, job.resume, job.eval_before = 10, 4.0, (5, tmp_path), {"score": 0.1}
    job.progress = types.SimpleNamespace(tokens_at_start=3000, generated=0.0)  # the checkpoint's count
    m = phases.run_metrics(job, phases.Trained(10, 0.5, 20.0), phases.HandedBack({"score": 0.5}, 10), tokens=4000, now=130.0)
    assert (m["tokens"], m["tokens_per_s"]) == (4000, 50.0)  # all attempts' tokens; this one's 1000 in its 20 s


def test_run_metrics_name_the_kept_adapter_and_the_early_stop(tmp_path):
    from autoslm.engine.pod.validation import Validation

    ctx = WorkerContext("{}", "r-1", 3, "file:///x", None, 1, tmp_path, tmp_path)
    job = phases.Job(ctx, parse_spec(GRPO), artifacts=None, uploader=None, reporter=None, ranks=Ranks(), t_start=0.0)
    job.validation = Validation(metric="score", every=5, stop_at=0.6, keep_best=True)
    job.validation.consider(0, "before", {"score": 0.5}, _Model())
    job.validation.consider(5, "during", {"score": 0.7}, _Model())
    job.eval_before = {"score": 0.5}
    m = phases.run_metrics(job, phases.Trained(5, 0.1, 1.0), phases.HandedBack({"score": 0.7}, 5), tokens=0, now=2.0)
    assert m["eval"]["after_step"] == 5 and m["validation"]["best"]["step"] == 5
    assert m["stop_reason"] == "eval.stop_at reached at step 5: score 0.7 >= 0.6"


class _Model:
    def named_parameters(self):
        import torch

        return [("lora", torch.nn.Parameter(torch.zeros(1)))]
