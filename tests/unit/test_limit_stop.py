"""A limit hands back what was learned: the worker's stop before limits.max_hours / limits.max_usd
(engine/pod/limits.py, the progress callback, the phases after it), on an injected clock, and the
controller's backstop (controller/handback.py) on a real local store.

    .venv/bin/python -m pytest tests/unit/test_limit_stop.py -q
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest

from autoslm.controller.handback import hand_back
from autoslm.controller.reconcile import HandBack
from autoslm.controller.state import EndReason, RunState
from autoslm.engine.pod import limits, watchdog
from autoslm.engine.pod.context import WorkerContext
from autoslm.layout import RunPaths
from autoslm.spec import validate_dict
from autoslm.store import RunArtifacts, open_store
from autoslm.store.adapters import check_adapter
from autoslm.store.artifacts import ErrorRecord, write_manifest


def test_the_nearer_limit_and_the_money_limit_as_a_time():
    assert limits.nearest_end(None, None, None, None) is None
    # $0.50 left at $1.80/h from t=100: spent at 100 + 1000 s, before the deadline at 5000.
    end = limits.nearest_end(5000.0, 0.5, 1.8, 100.0)
    assert end.limit == "max_usd" and end.at == pytest.approx(1100.0)
    assert limits.nearest_end(900.0, 0.5, 1.8, 100.0).limit == "max_hours"
    assert limits.nearest_end(5000.0, 0.5, None, 100.0).limit == "max_hours"  # no price: no money time
    assert limits.pod_budget_usd(3.0, 1.0, 2) == 1.0 and limits.pod_budget_usd(None, 1.0, 1) is None


def test_the_worker_reads_its_limits_from_its_environment(tmp_path):
    spec = validate_dict(
        {
            "name": "t",
            "model": "autoslm/tiny",
            "environment": {"id": "autoslm/arith"},
            "train": {"max_steps": 10},
            "limits": {"max_usd": 2.0},
        }
    )
    env = {
        "AUTOSLM_JOBSPEC": spec.to_json(),
        "AUTOSLM_RUN_ID": "r",
        "AUTOSLM_STORE": tmp_path.as_uri(),
        "AUTOSLM_DEADLINE": "10000",
        "AUTOSLM_SPENT_USD": "1.0",
        "AUTOSLM_PRICE_PER_HOUR": "3.6",
        "AUTOSLM_BILLED_FROM": "50",
        "AUTOSLM_WORKDIR": str(tmp_path),
    }
    ctx = WorkerContext.from_env(env)
    # $1 left at $3.6/h is 1000 s, counted from the bill's start (50), not the worker's (80).
    end = limits.run_end(ctx, spec, started_at=80.0)
    assert end.limit == "max_usd" and end.at == pytest.approx(1050.0)


def test_training_stops_when_one_more_step_and_the_save_would_pass_the_limit():
    now = [0.0]
    stop = limits.LimitStop(limits.LimitEnd(100.0, "max_hours"), store="local", clock=lambda: now[0])
    stop.begin(0.0, adapter_bytes=0)
    save = stop.save_s
    assert 0 < save < 20  # a local store: seconds
    for t in range(2, 60, 2):  # 2 s steps
        now[0] = float(t)
        assert stop.check(now[0]) is None
    # A step at 86 s leaves 14 s: the next step (2 s) and the save still fit while 86 + 2 + save < 100.
    t = 60.0
    while stop.check(t) is None:
        t += 2.0
    assert t + 2.0 + save >= 100.0 > t + save - 2.0, (t, save)
    assert stop.check(t).words.startswith("the time limit")


def test_a_slow_step_is_counted_and_the_final_evaluation_only_when_affordable():
    stop = limits.LimitStop(limits.LimitEnd(1000.0, "max_usd"), store="hf", clock=lambda: 0.0)
    stop.begin(0.0, adapter_bytes=40_000_000)
    assert stop.save_s > 60  # the Hub: commits and 160 MB at 10 MB/s
    stop.evaluated(100.0)  # within a quarter of the 1000 s: planned, so reserved
    assert stop.eval_planned() and stop.reserve_s() == pytest.approx(stop.save_s + 100.0)
    # 10 s steps, then 40 s ones: the slowest recent step is the next step's estimate.
    t = 0.0
    for _ in range(3):
        t += 10.0
        assert stop.check(t) is None
    while True:
        t += 40.0
        if stop.check(t) is not None:
            break
    assert t + 40.0 + stop.reserve_s() >= 1000.0 > t + stop.reserve_s(), (t, stop.reserve_s())
    # A planned final evaluation may use the step the stop gave up (40 s here), no more.
    assert stop.eval_fits(1000.0 - 100.0 - stop.save_s + 39.0) and not stop.eval_fits(1000.0 - 100.0 - stop.save_s + 41.0)
    stop.evaluated(400.0)  # too long for the time left: training keeps it, the final evaluation is dropped
    assert not stop.eval_planned() and stop.reserve_s() == pytest.approx(stop.save_s)
    assert stop.eval_fits(1000.0 - 400.0 - stop.save_s) and not stop.eval_fits(1000.0 - 400.0 - stop.save_s + 1)
    assert limits.LimitStop(None).check(1e12) is None  # no limit, no stop


def test_lm_eval_after_the_hand_back_is_reserved_when_its_estimate_is_affordable():
    """[eval] lm_eval runs after the hand-back: the stop leaves it its estimated time (and the time to
    stop it and write what it finished) when that is at most HARNESS_SHARE of the time training had."""
    end = limits.LimitEnd(1000.0, "max_hours")
    stop = limits.LimitStop(end, store="hf", final_eval=False, harness_s=200.0, clock=lambda: 0.0)
    stop.begin(0.0)
    assert stop.harness_planned()
    assert stop.reserve_s() == pytest.approx(stop.save_s + 200.0 + limits.harness_end_s("hf"))
    t = 0.0
    while stop.check(t) is None:
        t += 10.0
    assert t + 10.0 + stop.reserve_s() >= 1000.0 > t + stop.reserve_s()
    assert t < 1000.0 - 200.0  # training left the harness its time
    # Too long for the time left, or not known (a CPU, a GPU the catalog lacks): training keeps its steps,
    # and the limit may cut the harness (it keeps what finished).
    for harness_s in (300.0, None):
        unplanned = limits.LimitStop(end, store="hf", final_eval=False, harness_s=harness_s, clock=lambda: 0.0)
        unplanned.begin(0.0)
        assert not unplanned.harness_planned() and unplanned.reserve_s() == pytest.approx(unplanned.save_s)
    # The harness is stopped in time to write what it finished before the limit.
    assert limits.harness_cut_at(end, "local") == pytest.approx(1000.0 - limits.harness_end_s("local"))
    assert limits.harness_cut_at(None, "local") is None


class Recorder:
    def __init__(self):
        self.events, self.beats, self.limit = [], [], None
        self.uploader = SimpleNamespace(checkpoint=lambda *a, **k: None)

    def beat(self, stage=None, **fields):
        self.beats.append(fields)

    def event(self, kind, step=None, **data):
        self.events.append((kind, step, data))


def test_the_progress_callback_stops_training_with_a_checkpoint_before_the_limit():
    pytest.importorskip("transformers")
    from transformers import TrainerControl

    from autoslm.engine.pod.heartbeat import make_progress_callback

    now = [0.0]
    stop = limits.LimitStop(limits.LimitEnd(30.0, "max_hours"), store="local", clock=lambda: now[0])
    rec = Recorder()
    cb = make_progress_callback(rec, checkpoint_keep=1, limit_stop=stop, clock=lambda: now[0])
    args, state = (
        SimpleNamespace(output_dir="/nonexistent"),
        SimpleNamespace(global_step=0, max_steps=1000, num_input_tokens_seen=0),
    )
    cb.on_train_begin(args, state, TrainerControl())
    control = TrainerControl()
    while not control.should_training_stop and state.global_step < 1000:
        now[0] += 1.0
        state.global_step += 1
        control = cb.on_step_end(args, state, TrainerControl())
    assert control.should_training_stop and control.should_save
    assert 0 < state.global_step < 30 and cb.limit_hit.limit == "max_hours" and rec.limit == "max_hours"
    assert now[0] + 1.0 + stop.save_s >= 30.0
    assert any(kind == "limit_stop" for kind, _, _ in rec.events)


def test_after_a_limit_stop_the_final_evaluation_runs_only_when_it_fits():
    from autoslm.engine.pod import phases

    spec = validate_dict(
        {"name": "t", "model": "autoslm/tiny", "environment": {"id": "autoslm/arith"}, "train": {"max_steps": 10}}
    )
    stop = limits.LimitStop(limits.LimitEnd(100.0, "max_hours"), store="local")
    stop.evaluated(10.0)
    at_limit = phases.Trained(4, 1.0, 5.0, limit=stop.end)
    assert phases.final_eval_wanted(spec, phases.Trained(10, 1.0, 5.0), stop, 99.0) == (True, None)  # no limit stop
    assert phases.final_eval_wanted(spec, at_limit, stop, 50.0) == (True, None)
    wanted, why = phases.final_eval_wanted(spec, at_limit, stop, 95.0)
    assert not wanted and "time limit" in why
    assert "step 4/10" in phases.limit_words(stop.end, 4, 10)


def test_the_watchdogs_error_record_names_the_limit(tmp_path):
    art = RunArtifacts(open_store((tmp_path / "store").as_uri()), RunPaths("sft", "r1", 0))
    now = [0.0]
    env = {"HOME": str(tmp_path), "AUTOSLM_RUN_ID": "r1", "AUTOSLM_DEADLINE": "10"}
    dog = watchdog.start(env, None, art, lambda m: None, clock=lambda: now[0], every_s=0.01, end_process=False)
    now[0] = 10.0 + watchdog.DEADLINE_GRACE_S
    dog._thread.join(10)
    err = art.get_error()
    assert err is not None and not err.retryable and err.limit == "max_hours" and "time limit" in err.message
    # The record keeps its detail, and one without a limit reads as before.
    assert err.detail == "ended by the in-pod watchdog"
    art.put_error(ErrorRecord("boom", True, "trace"))
    assert art.get_error() == ErrorRecord("boom", True, "trace", None)


# -- the backstop: the controller hands back the newest checkpoint's adapter ------------------------------
def write_adapter(d: Path, value: float) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (d / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<f", value))


def test_the_backstop_hands_back_the_newest_checkpoints_adapter(tmp_path):
    store = open_store((tmp_path / "store").as_uri())
    art = RunArtifacts(store, RunPaths("sft", "r1", 0))
    action = HandBack(EndReason.DEADLINE, "time limit reached (limits.max_hours); last step 7/100")
    # Nothing saved yet: nothing to hand back, the run failed at its limit.
    st = hand_back(art, action, 7, 100)
    assert st.state is RunState.FAILED and st.reason == "deadline" and "no checkpoint" in st.error
    for step in (4, 6):
        ckpt = tmp_path / f"checkpoint-{step}"
        write_adapter(ckpt, float(step))
        (ckpt / "optimizer.pt").write_bytes(b"state")
        write_manifest(ckpt)
        art.put_checkpoint(step, ckpt, keep=2)
    st = hand_back(art, action, 7, 100)
    assert st.state is RunState.SUCCEEDED and st.reason == "deadline" and st.error is None
    out = art.fetch_adapter(tmp_path / "got")
    check_adapter(out)
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert struct.unpack("<f", (out / "adapter_model.safetensors").read_bytes()[-4:])[0] == 6.0  # the newest
    m = art.get_metrics()
    assert m["limit"] == {"name": "max_hours", "step": 6, "total_steps": 100, "by": "controller", "adapter_from": "checkpoint"}
    assert "checkpoint step 6" in m["stop_reason"] and "step 7/100" in m["stop_reason"] and art.is_done()


def test_the_backstop_keeps_the_adapter_the_worker_saved(tmp_path):
    store = open_store((tmp_path / "store").as_uri())
    art = RunArtifacts(store, RunPaths("sft", "r1", 0))
    write_adapter(tmp_path / "final", 9.0)
    art.put_adapter(tmp_path / "final")  # the worker's save landed; DONE did not
    art.put_metrics({"steps": 9, "total_steps": 100})
    st = hand_back(art, HandBack(EndReason.MONEY_LIMIT, "money limit reached"), 9, 100)
    assert st.state is RunState.SUCCEEDED and st.reason == "money_limit"
    m = art.get_metrics()
    assert m["limit"]["adapter_from"] == "worker" and m["limit"]["name"] == "max_usd" and m["steps"] == 9


def test_with_keep_best_the_backstop_hands_back_keep_bests_choice_not_the_newest_checkpoint(tmp_path):
    store = open_store((tmp_path / "store").as_uri())
    art = RunArtifacts(store, RunPaths("grpo", "r1", 0))
    write_adapter(tmp_path / "best", 0.5)  # keep_best chose the start: the newest checkpoint scored worse
    art.put_best(tmp_path / "best", {"step": 0, "when": "before", "metric": "score", "value": 0.52, "attempt": 1})
    for step in (10, 20):
        ckpt = tmp_path / f"checkpoint-{step}"
        write_adapter(ckpt, float(step))
        write_manifest(ckpt)
        art.put_checkpoint(step, ckpt, keep=2)
    action = HandBack(EndReason.DEADLINE, "time limit reached (limits.max_hours); last step 21/100")
    st = hand_back(art, action, 21, 100, keep_best=True)
    assert st.state is RunState.SUCCEEDED and st.reason == "deadline"
    out = art.fetch_adapter(tmp_path / "got")
    check_adapter(out)
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]  # no record
    assert struct.unpack("<f", (out / "adapter_model.safetensors").read_bytes()[-4:])[0] == 0.5  # keep_best's
    m = art.get_metrics()
    assert m["limit"] == {
        "name": "max_hours",
        "step": 0,
        "total_steps": 100,
        "by": "controller",
        "adapter_from": "best",
        "chosen_by": "keep_best",
        "metric": "score",
        "value": 0.52,
        "when": "before",
    }
    assert m["eval"]["after_step"] == 0 and m["validation"]["best"] == {"step": 0, "when": "before", "value": 0.52}
    assert "keep_best's choice, step 0's (score 0.52 at the run's start)" in m["stop_reason"], m["stop_reason"]
    # status says it: the limit's note, and the adapter as the best evaluation's
    from autoslm.controller.seed_metrics import SeedMetrics
    from autoslm.views.result import validation_lines

    lines = validation_lines(SeedMetrics.of(m))
    assert any("keep_best's choice, step 0's" in x for x in lines) and "adapter: step 0, the best evaluation by score" in lines


def test_eval_adapter_last_or_a_damaged_best_hands_back_the_newest_checkpoint(tmp_path):
    for case in ("last", "damaged"):
        art = RunArtifacts(open_store((tmp_path / case / "store").as_uri()), RunPaths("grpo", "r1", 0))
        write_adapter(tmp_path / case / "best", 0.5)
        art.put_best(tmp_path / case / "best", {"step": 0, "when": "before", "metric": "score", "value": 0.52, "attempt": 1})
        if case == "damaged":
            art.store.commit({art.paths.best + "/adapter_model.safetensors": b"cut"}, message="damage")
        ckpt = tmp_path / case / "checkpoint-20"
        write_adapter(ckpt, 20.0)
        write_manifest(ckpt)
        art.put_checkpoint(20, ckpt)
        st = hand_back(art, HandBack(EndReason.MONEY_LIMIT, "money limit reached"), 21, 100, keep_best=case == "damaged")
        assert st.state is RunState.SUCCEEDED
        out = art.fetch_adapter(tmp_path / case / "got")
        assert struct.unpack("<f", (out / "adapter_model.safetensors").read_bytes()[-4:])[0] == 20.0
        m = art.get_metrics()
        assert m["limit"]["adapter_from"] == "checkpoint" and m["limit"]["step"] == 20
        assert ("keep_best's adapter could not be used" in m["stop_reason"]) == (case == "damaged"), m["stop_reason"]
