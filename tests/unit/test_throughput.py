"""Tokens per second in the step events, for SFT and GRPO alike, and how `watch` says them.

GRPO logged no throughput (TRL's GRPO turns off the Trainer's own token count), so `watch` showed
`tokens/s -` for every GRPO run. The progress callback now adds the trained and the generated tokens
per second of training time to each training log.

    .venv/bin/python -m pytest tests/unit/test_throughput.py -q
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from autoslm.views.runview import throughput


class Recorder:
    def __init__(self):
        self.events, self.beats = [], []

    def beat(self, stage=None, **fields):
        self.beats.append(fields)

    def event(self, kind, step=None, **data):
        self.events.append((kind, step, data))


def callback(clock):
    pytest.importorskip("transformers")
    from autoslm.engine.pod.heartbeat import make_progress_callback

    rec = Recorder()
    rec.uploader = None
    return rec, make_progress_callback(rec, checkpoint_keep=1, clock=clock)


def test_grpo_logs_carry_trained_and_generated_tokens_per_second():
    now = [100.0]
    rec, cb = callback(lambda: now[0])
    # 2 prompts x 4 completions per step on one process: TRL's per-device batch counts completions.
    args = SimpleNamespace(per_device_train_batch_size=4, gradient_accumulation_steps=2, world_size=1)
    state = SimpleNamespace(global_step=0, max_steps=10, num_input_tokens_seen=0)
    cb.on_train_begin(args, state, None)
    # Two steps, then a log: TRL counted prompt + completion tokens of 16 sequences; they averaged 12
    # completion tokens; 4 seconds went by.
    state.global_step, state.num_input_tokens_seen, now[0] = 2, 16 * 40, 104.0
    cb.on_log(args, state, None, logs={"loss": 0.1, "reward": 0.5, "completions/mean_length": 12.0})
    kind, step, data = rec.events[-1]
    assert kind == "step" and step == 2
    assert data["trained_tokens_per_s"] == pytest.approx(16 * 40 / 4)
    assert data["generated_tokens_per_s"] == pytest.approx(2 * 8 * 12 / 4)
    # One more step at a longer mean length: the rates are over the whole time since training began.
    state.global_step, state.num_input_tokens_seen, now[0] = 3, 16 * 40 + 8 * 50, 108.0
    cb.on_log(args, state, None, logs={"loss": 0.1, "reward": 0.6, "completions/mean_length": 20.0})
    data = rec.events[-1][2]
    assert data["generated_tokens_per_s"] == pytest.approx((2 * 8 * 12 + 8 * 20) / 8)
    assert data["trained_tokens_per_s"] == pytest.approx((16 * 40 + 8 * 50) / 8)
    assert rec.beats[-1]["tokens_per_s"] == pytest.approx((16 * 40 + 8 * 50) / 8)
    # The end-of-training summary is not a step's log: no rates made up for it.
    cb.on_log(args, state, None, logs={"train_runtime": 8.0, "train_loss": 0.1})
    assert "trained_tokens_per_s" not in rec.events[-1][2]


def test_sft_logs_carry_trained_tokens_only():
    now = [0.0]
    rec, cb = callback(lambda: now[0])
    args = SimpleNamespace(per_device_train_batch_size=8, gradient_accumulation_steps=1, world_size=1)
    state = SimpleNamespace(global_step=10, max_steps=20, num_input_tokens_seen=5000)  # resumed at step 10
    cb.on_train_begin(args, state, None)
    state.global_step, state.num_input_tokens_seen, now[0] = 12, 5000 + 900, 3.0
    cb.on_log(args, state, None, logs={"loss": 1.0, "learning_rate": 1e-3})
    data = rec.events[-1][2]
    assert data["trained_tokens_per_s"] == pytest.approx(300.0) and "generated_tokens_per_s" not in data


def test_watch_says_which_tokens_it_counts():
    assert throughput([]) == "-"
    assert throughput([{"tokens_per_s": 120.0}]) == "120 trained"  # events written before the rates had names
    rows = [
        {"trained_tokens_per_s": 900.0, "generated_tokens_per_s": 10.0},
        {"trained_tokens_per_s": 1234.4, "generated_tokens_per_s": 456.0},
    ]
    assert throughput(rows) == "1,234 trained, 456 generated"
