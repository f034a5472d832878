"""Progress reporting from inside training: heartbeats, events, checkpoints, the stop before a limit.

``Reporter`` turns worker moments into Heartbeat/Event records and hands them to the background
uploader; it never blocks training on the network. ``ProgressCallback`` is the TrainerCallback that
feeds it from TRL's trainers (SFT and GRPO alike).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from autoslm.layout import Event, Heartbeat


class Reporter:
    def __init__(self, uploader, *, run_id: str, seed: int, phase: str, attempt: int, log=print, clock=time.time):
        self.uploader = uploader
        self.run_id, self.seed, self.phase, self.attempt = run_id, seed, phase, attempt
        self.stage = "setup"
        self.step = 0
        self.total_steps = 0
        self.last: dict = {}
        self.log = log
        self.clock = clock
        self.limit: str | None = None  # once training stopped before a limit, every later beat names it

    def beat(self, stage: str | None = None, **fields) -> Heartbeat:
        if stage:
            self.stage = stage
        self.step = fields.pop("step", self.step)
        self.total_steps = fields.pop("total_steps", self.total_steps)
        fields.setdefault("time", self.clock())
        if self.limit is not None and stage != "error":
            fields.setdefault("limit", self.limit)
        hb = Heartbeat(
            run_id=self.run_id,
            seed=self.seed,
            phase=self.phase,
            stage=self.stage,
            step=self.step,
            total_steps=self.total_steps,
            attempt=self.attempt,
            **fields,
        )
        self.uploader.heartbeat(hb)
        return hb

    def evaluating(self, when: str, stage: str = "training"):
        """``evaluate``'s ``progress``: a heartbeat at the start of a held-out evaluation and after each
        of its batches. An evaluation of a large split outlasts the controller's heartbeat timeout, so
        it beats as training does; its stage is "training" (or "saving" for the one after training),
        which the controller counts as a sign of life, and ``activity`` says what it is doing."""

        def beat(done: int, total: int) -> None:
            self.beat(stage, activity="evaluating", progress=(done, total), message=f"evaluating ({when}): {done}/{total}")

        return beat

    def event(self, kind: str, step: int | None = None, **data) -> None:
        self.uploader.event(Event(kind=kind, step=self.step if step is None else step, data=data))
        if kind not in ("step",):
            self.log(f"[autoslm] {kind}" + (f" {data}" if data else ""))


# Throughput in the step events, per second of training wall time since this attempt's training began:
# "trained" counts the tokens the policy's forward and backward passes took (SFT: the batches' non-padding
# tokens; GRPO: each completion with its prompt, as TRL counts num_input_tokens_seen), "generated" the
# completion tokens the model wrote (GRPO; multi-turn: its own turns only). Step events carry both keys.
TRAINED_TPS, GENERATED_TPS = "trained_tokens_per_s", "generated_tokens_per_s"


def completions_per_step(args) -> int:
    """GRPO's completions per optimizer step: TRL's per-device batch counts completions."""
    return (
        int(args.per_device_train_batch_size) * int(args.gradient_accumulation_steps) * int(getattr(args, "world_size", 1) or 1)
    )


def token_rates(trained: int, generated: float | None, elapsed: float) -> dict[str, float]:
    """The step event's throughput keys (only those there is something to say about)."""
    out = {}
    if trained > 0 and elapsed > 0:
        out[TRAINED_TPS] = round(trained / elapsed, 1)
    if generated is not None and elapsed > 0:
        out[GENERATED_TPS] = round(generated / elapsed, 1)
    return out


def _clean(logs: dict) -> dict[str, float]:
    out = {}
    for k, v in logs.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[k] = float(v)
    return out


def make_progress_callback(reporter: Reporter, *, checkpoint_keep: int, limit_stop=None, clock=time.time, ranks=None):
    """A TrainerCallback (built lazily so importing this module needs no transformers). ``limit_stop``
    (engine/pod/limits.py) decides after each step whether training stops before the run's time or
    money limit, with a checkpoint, leaving the time to save the adapter. ``ranks``
    (engine/distributed.py) makes several training processes stop at the same step and finish
    writing a checkpoint before rank 0 hands it to the uploader."""
    from transformers import TrainerCallback

    from autoslm.engine.pod.limits import trainable_bytes

    class ProgressCallback(TrainerCallback):
        def __init__(self):
            self.train_start: float | None = None
            self.tokens_at_start = 0
            self.generated = 0.0  # completion tokens written since training began (GRPO)
            self.logged_step = 0
            self.limit_hit = None  # the limits.LimitEnd training stopped before
            self.last_loss: float | None = None

        def on_train_begin(self, args, state, control, **kw):
            self.train_start = clock()
            self.tokens_at_start = state.num_input_tokens_seen or 0
            self.logged_step = state.global_step
            if limit_stop is not None:
                limit_stop.begin(self.train_start, trainable_bytes(kw.get("model")))
            reporter.beat("training", step=state.global_step, total_steps=state.max_steps)
            reporter.event("train_begin", step=state.global_step, max_steps=state.max_steps)

        def on_log(self, args, state, control, logs=None, **kw):
            logs = _clean(logs or {})
            if "loss" in logs:
                self.last_loss = logs["loss"]
            now = clock()
            elapsed = max(now - (now if self.train_start is None else self.train_start), 1e-6)
            tokens = (state.num_input_tokens_seen or 0) - self.tokens_at_start
            tps = tokens / elapsed if tokens else None
            generated = None
            if "completions/mean_length" in logs:  # GRPO: the mean over the steps since the last log
                steps = max(0, state.global_step - self.logged_step)
                self.generated += logs["completions/mean_length"] * completions_per_step(args) * steps
                generated = self.generated
            self.logged_step = state.global_step
            if "loss" in logs or "reward" in logs:  # a training log, not an evaluation's or the run summary
                logs.update(token_rates(tokens, generated, elapsed))
            reporter.last = logs
            reporter.beat(
                "training",
                step=state.global_step,
                total_steps=state.max_steps,
                loss=logs.get("loss"),
                learning_rate=logs.get("learning_rate"),
                tokens_per_s=tps,
                metrics=logs,
            )
            reporter.event("step", step=state.global_step, **logs)

        def on_step_end(self, args, state, control, **kw):
            if limit_stop is not None and self.limit_hit is None:
                self.limit_hit = _stop_before_limit(limit_stop, reporter, state, control, clock(), ranks)
            return control

        def on_save(self, args, state, control, **kw):
            step = state.global_step
            ckpt = Path(args.output_dir) / f"checkpoint-{step}"
            # The last checkpoint: max_steps reached, a limit, or a callback ending training ([eval] stop_at).
            final = step >= state.max_steps or self.limit_hit is not None or bool(control.should_training_stop)
            if ranks is not None:
                ranks.barrier()  # each rank writes its own RNG state into the checkpoint: wait for all
                from autoslm.engine.distributed import gather_rng_states

                gather_rng_states(ranks, ckpt)  # several pods: the others' states join rank 0's copy
            reporter.uploader.checkpoint(step, ckpt, keep=checkpoint_keep, final=final)
            reporter.event("checkpoint", step=step, final=final)

    return ProgressCallback()


def _stop_before_limit(limit_stop, reporter: Reporter, state, control, now: float, ranks=None):
    """After a step: when one more would leave too little time to save before the run's limit, stop
    here with a checkpoint (the controller's fallback) and say so; returns the limit, or None."""
    hit = limit_stop.check(now)
    stop = hit is not None
    if ranks is not None and limit_stop.end is not None:
        stop = ranks.any(stop)  # every rank must stop at the same step, or the others wait forever
    if not stop or state.global_step >= state.max_steps:
        return None
    hit = hit or limit_stop.end
    control.should_training_stop = True
    control.should_save = True
    reporter.limit = hit.limit
    reporter.event(
        "limit_stop",
        step=state.global_step,
        limit=hit.limit,
        max_steps=state.max_steps,
        seconds_left=round(hit.at - now, 1),
        reserve_s=round(limit_stop.reserve_s(), 1),
    )
    reporter.beat(
        "training",
        step=state.global_step,
        total_steps=state.max_steps,
        message=f"stopping before {hit.words} at step {state.global_step}/{state.max_steps}",
    )
    return hit
