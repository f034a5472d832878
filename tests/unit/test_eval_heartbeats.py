"""A held-out evaluation beats as training does, so a long one keeps its pod.

An evaluation of a large split (GSM8K's 1319 problems with four sampled answers each, or a 4-bit 14B
model without vLLM) takes longer than the controller's heartbeat and startup windows; the worker
heartbeats at its start and after each batch, and the controller reads those beats as signs of life.

    .venv/bin/python -m pytest tests/unit/test_eval_heartbeats.py -q
"""

from __future__ import annotations

import pytest

from autoslm.controller.reconcile import Limits, Seen, SetState, reconcile
from autoslm.controller.registry import ReplicaRecord
from autoslm.layout import Heartbeat
from autoslm.providers.base import PodStatus

pytestmark = pytest.mark.worker  # also runs on the worker image's pins (make test-image)

CALL_S = 600.0  # each generation call takes ten minutes on the test's clock


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


class Beats:
    """The uploader's side the reporter talks to, keeping every heartbeat it is handed."""

    def __init__(self):
        self.beats: list[Heartbeat] = []

    def heartbeat(self, hb: Heartbeat) -> None:
        self.beats.append(hb)

    def event(self, ev) -> None:
        pass


def test_a_long_evaluation_beats_per_batch_and_its_pod_is_kept():
    pytest.importorskip("transformers")
    from autoslm.engine.pod.heartbeat import Reporter
    from autoslm.engine.rollout.evaluate import GENERATOR_CHUNK, evaluate
    from autoslm.engine.train.tiny import build_model, build_tokenizer
    from autoslm.envs.arith import ArithEnv

    tok = build_tokenizer()
    model = build_model(tok)
    env = ArithEnv({"n_train": 1, "n_eval": 600, "max_operand": 99})
    examples = env.eval_examples()
    pod_start = 1_000_000.0
    clock = Clock(pod_start + 1800)  # the model is loaded and the trainer built half an hour after the pod started
    uploader = Beats()
    reporter = Reporter(uploader, run_id="r", seed=0, phase="grpo", attempt=1, log=lambda *a: None, clock=clock)
    reporter.beat("loading")
    answer = tok.encode("7", add_special_tokens=False) + [tok.eos_token_id]

    def generator(contexts, max_new_tokens):  # a GenerateFn, as colocated vLLM is: one answer to all, slowly
        clock.t += CALL_S
        return [(list(answer), [0.0] * len(answer)) for _ in contexts]

    start = clock.t
    sampling = {"temperature": 1.0, "top_p": 1.0, "seed": 0, "samples": 4, "generator": generator, "ks": (1, 4)}
    result = evaluate(
        model, tok, env, examples, False, 8, generator=generator, sampling=sampling, progress=reporter.evaluating("before")
    )
    assert result["n"] == 600 and result["score"] is not None and result["pass@4"] is not None

    calls = -(-600 // GENERATOR_CHUNK) + -(-600 * 4 // GENERATOR_CHUNK)
    assert clock.t - start == calls * CALL_S > 2 * 3600  # over two hours of evaluation
    beats = [hb for hb in uploader.beats if hb.activity == "evaluating"]
    assert beats[0].progress == (0, 600 * 6) and beats[-1].progress == (600 * 6, 600 * 6)  # loss rows, greedy, 4 sampled
    assert all(hb.stage == "training" and hb.message.startswith("evaluating (before):") for hb in beats)
    times = [hb.time for hb in uploader.beats]
    assert max(b - a for a, b in zip(times, times[1:])) <= CALL_S

    # The controller looks every minute: the startup window (45 min from the pod's start) and then the
    # heartbeat window (15 min) both hold, and the first beat of the evaluation marks the run running.
    replica = ReplicaRecord("r", 0, "provisioning", provider="local", pod_id="p", attempt=1, pod_started_at=pod_start)
    limits = Limits(deadline=pod_start + 10 * 3600, max_usd=None, max_restarts=0, heartbeat_timeout_s=900, startup_timeout_s=2700)
    now = start
    while now <= clock.t + 60:
        last = max((hb for hb in uploader.beats if hb.time <= now), key=lambda hb: hb.time)
        seen = Seen(pod=PodStatus("running"), heartbeat_time=last.time, heartbeat_stage=last.stage, heartbeat_attempt=1)
        actions = reconcile(replica, seen, limits, now)
        assert all(isinstance(a, SetState) and a.state == "running" for a in actions), (now - start, actions)
        replica.state = "running" if actions else replica.state
        now += 60
    assert replica.state == "running"
