"""Validation during training (``[eval]``): held-out evaluations at the start, every N steps and at the
end; the early stop when the metric reaches ``stop_at``; the best evaluation's adapter kept
(``keep_best``) and handed back instead of the last one.

The rules (what counts as better, what reaching means, pass@k) are recipes/evaluation.py's; this file
holds the state of one attempt: the evaluations so far, the best one and a copy of its trainable
weights (LoRA: megabytes, kept in host memory), and the reason training stopped. The best may also be
an earlier attempt's, read back from the store (``earlier_best``), so a relaunched run still chooses
among all its evaluations. It never reads or writes the store itself: the ``Keeper`` it is built with
recalls the earlier attempts' best and records each new one (engine/pod/best.py's ``StoreKeeper``), and
the runner's report phase puts what ``summary`` says into metrics.json.

A best evaluation's adapter is one ``Weights``, whichever attempt made it: a host-memory ``Snapshot`` of
this attempt's, or a ``StoredAdapter`` folder an earlier attempt recorded. Both ``put_into(model)``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from autoslm.recipes.evaluation import at_least_as_good, keeps_best, reached

EARLY_STOP = "autoslm_early_stop.json"  # in a checkpoint where stop_at ended training: what was reached


def stopped_at(ckpt: Path) -> dict | None:
    """The early stop a checkpoint records, or None."""
    try:
        return json.loads((ckpt / EARLY_STOP).read_text())
    except (OSError, ValueError):
        return None


class Weights(Protocol):
    """A kept adapter's weights, put back into the model that trains it (so its save() writes them)."""

    def put_into(self, model) -> None: ...


@dataclass(frozen=True)
class Snapshot:
    """A host-memory copy of the trainable weights (the LoRA adapter's): name -> CPU tensor."""

    tensors: dict

    @classmethod
    def of(cls, model) -> "Snapshot":
        return cls({n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad})

    def put_into(self, model) -> None:
        import torch

        params = dict(model.named_parameters())
        missing = [n for n in self.tensors if n not in params]
        if missing:
            raise RuntimeError(f"the kept adapter does not fit the model: {len(missing)} parameters missing, e.g. {missing[0]}")
        with torch.no_grad():
            for name, value in self.tensors.items():
                params[name].copy_(value.to(params[name].device, params[name].dtype))


@dataclass(frozen=True)
class StoredAdapter:
    """An earlier attempt's adapter, read back from the store: the folder of its adapter files."""

    folder: Path

    def put_into(self, model) -> None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        from autoslm.store.adapters import SAFETENSORS

        set_peft_model_state_dict(model, load_file(str(self.folder / SAFETENSORS)))


@dataclass
class Best:
    step: int
    when: str  # "before", "during" or "after"
    value: float
    result: dict
    weights: Weights | None = None  # the adapter evaluated (None: not kept)
    attempt: int | None = None  # the earlier attempt that made this evaluation (None: this one)


class Keeper(Protocol):
    """Where keep_best's candidates outlive an attempt."""

    def recall(self) -> "tuple[Best | None, str | None]":
        """(the best evaluation earlier attempts recorded, or None; why it cannot be used, or None)."""

    def record(self, best: Best, model) -> None:
        """Keep a new best evaluation (before the end) for a later attempt; never raises into training."""


class NoKeeper:
    """An attempt alone: nothing recalled, nothing recorded."""

    def recall(self) -> "tuple[Best | None, str | None]":
        return None, None

    def record(self, best: Best, model) -> None:
        return None


def earlier_best(record: dict, metric: str, adapter: Path) -> Best:
    """The best evaluation an earlier attempt recorded (``RunArtifacts.fetch_best``), as a candidate for
    this one. Raises ValueError naming what is wrong with a record that cannot be trusted."""
    if not isinstance(record, dict):
        raise ValueError("the record is not a JSON object")
    step, when, value, result, attempt = (record.get(k) for k in ("step", "when", "value", "result", "attempt"))
    if record.get("metric") != metric:
        raise ValueError(f"it was chosen by {record.get('metric')!r}, and this run reads {metric!r}")
    if not (isinstance(step, int) and step >= 0 and when in ("before", "during", "after") and isinstance(attempt, int)):
        raise ValueError(f"its step, evaluation or attempt is unreadable ({step!r}, {when!r}, {attempt!r})")
    if not isinstance(result, dict) or result.get(metric) != value or not at_least_as_good(metric, value, None):
        raise ValueError(f"its {metric} ({value!r}) is not its evaluation's")
    return Best(step, when, float(value), dict(result), StoredAdapter(Path(adapter)), attempt=attempt)


@dataclass
class Validation:
    """One attempt's evaluations and the decisions taken from them."""

    metric: str
    every: int = 0
    stop_at: float | None = None
    keep_best: bool = False
    hand_back: str = "best"  # or "last"
    history: list[dict] = field(default_factory=list)
    best: Best | None = None
    stopped: dict | None = None  # {"step", "metric", "value", "stop_at"} once stop_at was reached
    agree: Callable[[bool], bool] = lambda flag: flag  # several ranks: stop only all together (Ranks.any)
    keeper: Keeper = field(default_factory=NoKeeper)  # recalls earlier attempts' best, records each new one
    earlier_unusable: str | None = None  # why the best an earlier attempt recorded was set aside

    @classmethod
    def from_spec(cls, spec, ranks=None, keeper: Keeper | None = None) -> "Validation":
        ev = spec.eval
        return cls(
            metric=ev.metric,
            every=ev.every,
            stop_at=ev.stop_at,
            keep_best=keeps_best(ev, spec.train),
            hand_back=ev.adapter,
            agree=ranks.any if ranks is not None and ranks.distributed else (lambda f: f),
            keeper=keeper or NoKeeper(),
        )

    def due(self, step: int, max_steps: int) -> bool:
        """An evaluation during training at this step? (The last step's is the "after" evaluation.)"""
        return bool(self.every) and step % self.every == 0 and step < max_steps

    def consider(self, step: int, when: str, result: dict | None, model: Any = None, candidate: bool = True) -> None:
        """Record one evaluation: the best so far (with a copy of the weights evaluated, when kept) and
        whether the metric reached stop_at. ``candidate = False``: history only (a resumed attempt's
        "before", made by an earlier attempt on weights this one no longer has)."""
        if not result:
            return
        value = result.get(self.metric)
        self.history.append({"step": step, "when": when, **{k: v for k, v in result.items() if k != "n"}})
        if candidate and self.keep_best and at_least_as_good(self.metric, value, self.best.value if self.best else None):
            self.best = Best(step, when, float(value), dict(result), Snapshot.of(model) if model is not None else None)
            # The "after" evaluation's adapter is handed back by this attempt itself: no later one needs it.
            if model is not None and when != "after":
                self.keeper.record(self.best, model)
        if self.stopped is None and self.agree(reached(self.metric, value, self.stop_at)):
            self.stopped = {"step": step, "metric": self.metric, "value": value, "stop_at": self.stop_at}

    def recall_earlier(self) -> Best | None:
        """Under keep_best, before this attempt's own evaluations: the best evaluation earlier attempts
        recorded (the keeper's) becomes the first candidate; one that cannot be used is set aside with a
        note (metrics.json and the run's note say it). Returns the one recalled, or None."""
        if not self.keep_best:
            return None
        earlier, note = self.keeper.recall()
        if note is not None:
            self.earlier_unusable = note
            return None
        if earlier is not None:
            self.recall(earlier)
        return earlier

    def recall(self, earlier: Best) -> None:
        """Take an earlier attempt's best evaluation as the best so far, unless this attempt already has
        one at least as good: on a tie the evaluation this attempt can hand back itself stays."""
        if self.keep_best and (self.best is None or not at_least_as_good(self.metric, self.best.value, earlier.value)):
            self.best = earlier

    def chosen(self, final_step: int) -> Best | None:
        """The kept evaluation to hand back instead of the last state, or None (hand back the last)."""
        best = self.best
        if not self.keep_best or self.hand_back != "best" or best is None or best.weights is None:
            return None
        return None if best.step == final_step else best  # at the final step, the best is the last state

    def stop_reason(self) -> str | None:
        s = self.stopped
        if s is None:
            return None
        cmp = "<=" if self.metric == "loss" else ">="
        return f"eval.stop_at reached at step {s['step']}: {s['metric']} {s['value']} {cmp} {s['stop_at']}"

    def out_of_reach(self) -> dict | None:
        """The best evaluation of the history that beats every candidate: one this attempt cannot hand back
        (a resumed attempt's start, made on weights it no longer has), or None."""
        if self.best is None:  # nothing this attempt evaluated to compare with
            return None
        out = None
        for e in self.history:
            value = e.get(self.metric)
            if not at_least_as_good(self.metric, self.best.value, value) and (
                out is None or not at_least_as_good(self.metric, out[self.metric], value)
            ):
                out = e
        return out

    def _not_the_runs_best(self, chosen: Best | None, final_step: int) -> str:
        """The note when the adapter handed back is not the best evaluation of the run, or may not be: say
        which it is and what beat it, never "the best"."""
        kept, m = chosen or self.best, self.metric
        if chosen is not None:
            handed = (
                f"the adapter handed back is step {chosen.step}'s ({m} {chosen.value}), the best of this attempt's evaluations"
            )
        elif self.hand_back == "best" and kept is not None and kept.step == final_step:
            handed = f"the adapter handed back is the last one, step {final_step} ({m} {kept.value}), the best of this attempt's evaluations"
        else:
            handed = f"the adapter handed back is the last one, step {final_step}"
        beat = self.out_of_reach()
        if beat is not None:
            where = "the run's start" if beat["when"] == "before" else f"the run's evaluation at step {beat['step']}"
            handed += f"; {where} scored {m} {beat[m]}, better, and this attempt cannot hand back that adapter"
        return f"{self.earlier_unusable}; {handed}" if self.earlier_unusable else f"not the best evaluation of the run: {handed}"

    def choice_note(self, chosen: Best | None, final_step: int) -> str | None:
        """What the run says about the adapter it hands back."""
        if self.keep_best and (self.earlier_unusable or self.out_of_reach() is not None):
            return self._not_the_runs_best(chosen, final_step)
        if chosen is None:
            if self.keep_best and self.best is not None and self.hand_back == "last" and self.best.step != final_step:
                return (
                    f'eval.adapter = "last": the last adapter (step {final_step}) is handed back; the best '
                    f"evaluation was at step {self.best.step} ({self.metric} {self.best.value}){_earlier(self.best)}"
                )
            return None
        if chosen.when == "before":
            return (
                f"no evaluation after the start beat it ({self.metric} {chosen.value} at the start): the run "
                f"hands back the adapter it started from (step {chosen.step}), not the last one (step {final_step})"
                + _earlier(chosen)
            )
        return (
            f"keep_best: the adapter of the best evaluation, step {chosen.step} ({self.metric} {chosen.value}), "
            f"is handed back, not the last one (step {final_step}){_earlier(chosen)}"
        )

    def summary(self, chosen: Best | None, final_step: int) -> dict:
        """metrics.json's "validation": the metric, every evaluation, the best, the early stop."""
        out = {
            "metric": self.metric,
            "keep_best": self.keep_best,
            "evaluations": self._evaluations(),
            "adapter": "best" if chosen is not None else "last",
        }
        if self.best is not None:
            out["best"] = {"step": self.best.step, "when": self.best.when, "value": self.best.value, **earlier_attempt(self.best)}
        if self.earlier_unusable:  # the best is this attempt's only: the run's may be in a record set aside
            out["earlier_best_unusable"] = self.earlier_unusable
        if self.keep_best and (beat := self.out_of_reach()) is not None:
            out["better_out_of_reach"] = {"step": beat["step"], "when": beat["when"], "value": beat[self.metric]}
        if self.stopped is not None:
            out["stopped"] = {**self.stopped, "reason": self.stop_reason()}
        note = self.choice_note(chosen, final_step)
        if note:
            out["note"] = note
        return out

    def _evaluations(self) -> list[dict]:
        """This attempt's evaluations, and the earlier attempt's that is still the best (the others of that
        attempt are in the run's events only)."""
        b = self.best
        if b is None or b.attempt is None or any(e["step"] == b.step and e["when"] == b.when for e in self.history):
            return self.history
        kept = {"step": b.step, "when": b.when, **{k: v for k, v in b.result.items() if k != "n"}, "attempt": b.attempt}
        return sorted([*self.history, kept], key=lambda e: e["step"])

    def callback(self, run_eval: Callable[[Any], dict | None], reporter):
        """The TrainerCallback that evaluates every N steps and stops training once stop_at is reached,
        with a checkpoint saved at that step that says so (``EARLY_STOP``: an attempt resuming from it
        ends there too). It must come before the callback that uploads checkpoints."""
        from transformers import TrainerCallback

        validation = self

        class ValidationCallback(TrainerCallback):
            def on_save(self, args, state, control, **kw):
                if validation.stopped is not None and validation.stopped["step"] == state.global_step:
                    ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                    (ckpt / EARLY_STOP).write_text(json.dumps(validation.stopped))

            def on_step_end(self, args, state, control, model=None, **kw):
                if not validation.due(state.global_step, state.max_steps):
                    return control
                result = run_eval(model)
                reporter.event("eval", step=state.global_step, when="during", **(result or {}))
                validation.consider(state.global_step, "during", result, model)
                if validation.stopped is not None:
                    reporter.event("early_stop", step=state.global_step, reason=validation.stop_reason())
                    control.should_training_stop = True
                    control.should_save = True
                return control

        return ValidationCallback()


def earlier_attempt(best: Best) -> dict:
    """What metrics.json and the events add about a best evaluation an earlier attempt made."""
    return {} if best.attempt is None else {"attempt": best.attempt, "earlier_attempt": True}


def _earlier(best: Best) -> str:
    return "" if best.attempt is None else f"; attempt {best.attempt} made that evaluation, before the run was relaunched"
