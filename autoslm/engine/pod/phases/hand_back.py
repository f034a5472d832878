"""The worker's last phases (engine/pod/phases/): after-eval (the evaluation of the last adapter, and
with keep_best the choice of the one handed back), save (the adapter written) and report (adapter,
metrics.json, the last event and heartbeat, then DONE). A run its time or money limit stopped short
goes through them too, and says so. With ``[eval] lm_eval`` the report hands the run back first: its
metrics.json says the harness follows, and its "done" heartbeat names it (``layout.HARNESS_ACTIVITY``)
so that the controller leaves the pod to it (engine/pod/lm_eval_phase.py runs it after DONE)."""

from __future__ import annotations

import time
from pathlib import Path

from autoslm.engine.pod.phases.job import HandedBack, Job, Trained


def limit_words(limit, final_step: int, max_steps: int) -> str:
    """What the run says when a limit stopped its training short (status, metrics.json, the report)."""
    return f"{limit.words}: training stopped at step {final_step}/{max_steps} to save and hand back the adapter in time"


def final_eval_wanted(spec, trained: Trained, limit_stop, now: float) -> tuple[bool, str | None]:
    """(evaluate the last adapter?, why not in words): [eval] at_end, and at a limit stop only when the
    last evaluation's time fits before the limit with the save."""
    if not spec.eval.at_end:
        return False, None
    if trained.limit is None or limit_stop is None or limit_stop.eval_fits(now):
        return True, None
    return False, f"the final evaluation was skipped: no time left before {trained.limit.words}"


# ---------------------------------------------------------------------------------------------------
# after-eval, save, report


def evaluate_after(job: Job, trained: Trained) -> HandedBack:
    """The held-out evaluation of the last adapter, then the adapter to hand back: the last, or with
    keep_best the best evaluation's (its weights put back into the model, so save() writes them)."""
    from autoslm.engine.pod.validation import earlier_attempt

    step, validation, reporter = trained.final_step, job.validation, job.reporter
    reporter.beat("saving", step=step)
    result = None
    # Rank 0 decides for every rank (a split evaluation needs them all in it).
    wanted, skipped = job.ranks.on_main(lambda: final_eval_wanted(job.spec, trained, job.limit_stop, time.time()))
    if wanted:
        result = job.run_eval(job.trainer.model, "after")
        reporter.event("eval", when="after", **(result or {}))
        validation.consider(step, "after", result, job.trainer.model)
    elif skipped:
        reporter.event("eval_skipped", when="after", reason=skipped)
    chosen = validation.chosen(step)
    note = "; ".join(n for n in (validation.choice_note(chosen, step), skipped) if n) or None
    if chosen is None:
        return HandedBack(result, step, note)
    chosen.weights.put_into(job.trainer.model)  # this attempt's snapshot, or an earlier attempt's stored adapter
    reporter.event(
        "adapter_kept",
        step=chosen.step,
        when=chosen.when,
        metric=validation.metric,
        value=chosen.value,
        last_step=step,
        note=note,
        **earlier_attempt(chosen),
    )
    return HandedBack(chosen.result, chosen.step, note, last=result)


def save(job: Job) -> Path:
    """The trained adapter, written into the work directory (rank 0; every rank under FSDP)."""
    from autoslm.engine.distributed import save_adapter

    adapter_dir = job.ctx.workdir / "adapter"
    save_adapter(job.trainer, adapter_dir, job.ranks, job.strategy or "ddp")
    return adapter_dir


def run_metrics(job: Job, trained: Trained, after: HandedBack, tokens: int, now: float) -> dict:
    """metrics.json: what the run did, how long each part took, and the held-out scores: ``eval.before``
    of the adapter the run started from, ``eval.after`` of the one it hands back (``after_step``: the
    step it is from; ``eval.last`` the last state's when keep_best handed back another), and with
    [eval] the evaluations, the best and why training stopped."""
    ctx, spec, resume = job.ctx, job.spec, job.resume
    train_s = trained.train_s
    generated = getattr(job.progress, "generated", 0.0)  # GRPO: completion tokens written (heartbeat.py)
    # A resumed attempt's rate: the tokens it trained itself over the time it trained (``tokens`` counts
    # every attempt's, ``train_s`` this attempt's only).
    trained_here = tokens - getattr(job.progress, "tokens_at_start", 0)
    out = {
        "run_id": ctx.run_id,
        "seed": ctx.seed,
        "phase": spec.phase,
        "model": spec.model,
        "steps": trained.final_step,
        "total_steps": job.max_steps,
        "wall_time_s": round(now - job.t_start, 2),
        "setup_time_s": round(job.setup_s, 2),
        "train_time_s": round(train_s, 2),
        "tokens": tokens,
        "tokens_per_s": round(trained_here / train_s, 1) if train_s > 0 and trained_here > 0 else None,  # trained tokens
        **({"generated_tokens_per_s": round(generated / train_s, 1)} if generated and train_s > 0 else {}),
        "final_loss": None if trained.loss is None else round(float(trained.loss), 4),
        "eval": {"before": job.eval_before, "after": after.result, "after_step": after.step},
        "attempt": ctx.attempt,
        "resumed_from_step": (resume[0] if resume else 0) or None,
        "world_size": job.ranks.world_size,
        **({"strategy": job.strategy} if job.strategy else {}),
    }
    validation = job.validation
    if validation is not None and (validation.history or validation.keep_best):
        out["validation"] = validation.summary(validation.chosen(trained.final_step), trained.final_step)
        if after.note:
            out["eval"]["note"] = after.note
        if after.step != trained.final_step:  # what training itself ended with, for checks of learning
            out["eval"].update(last=after.last, last_step=trained.final_step)
    if validation is not None and validation.stopped is not None:
        out["stop_reason"] = validation.stop_reason()
    if trained.limit is not None:  # the run ends naming the limit, with this adapter
        out["limit"] = {"name": trained.limit.limit, "step": trained.final_step, "total_steps": job.max_steps, "by": "worker"}
        out["stop_reason"] = limit_words(trained.limit, trained.final_step, job.max_steps)
    return out


def report(job: Job, trained: Trained, after: HandedBack, adapter_dir: Path, *, lm_eval_follows: bool = False) -> dict:
    """Adapter and metrics into the store, the last event and heartbeat, then DONE; returns metrics.json.
    ``lm_eval_follows``: lm-eval runs after this hand-back (metrics.json and the heartbeat say so)."""
    trainer, uploader, reporter, artifacts = job.trainer, job.uploader, job.reporter, job.artifacts
    metrics = run_metrics(job, trained, after, int(trainer.state.num_input_tokens_seen or 0), time.time())
    metrics.update(extra_metrics(trainer))
    follows: dict = {}
    if lm_eval_follows:
        from autoslm.engine.pod.lm_eval_phase import running_block
        from autoslm.layout import HARNESS_ACTIVITY
        from autoslm.recipes.harness import task_label

        metrics["lm_eval"] = running_block(job.spec)
        tasks = ", ".join(map(task_label, job.spec.eval.lm_eval))
        follows = {"activity": HARNESS_ACTIVITY, "message": f"lm-eval on {tasks} follows the hand-back"}
    if job.judge is not None:
        metrics["judge"] = job.judge.client.stats.to_dict()
        job.judge.client.close()
    uploader.required(lambda: artifacts.put_adapter(adapter_dir), "adapter", timeout=600)
    uploader.required(lambda: artifacts.put_metrics(metrics), "metrics", timeout=300)
    # The last event and heartbeat go before DONE (a required write flushes progress first): once DONE
    # is seen the controller may terminate this pod at any moment.
    said = {k: v for k, v in (("stop_reason", metrics.get("stop_reason")), ("note", after.note)) if v}
    reporter.event(
        "done",
        steps=trained.final_step,
        final_loss=metrics["final_loss"],
        eval_after=after.result,
        adapter_step=after.step,
        **said,
    )
    reporter.beat(
        "done",
        step=trained.final_step,
        total_steps=job.max_steps,
        loss=metrics["final_loss"],
        **({"message": "; ".join(said.values())} if said else {}),
        **follows,
    )
    uploader.required(artifacts.mark_done, "DONE", timeout=300)
    return metrics


def extra_metrics(trainer) -> dict:
    """Method-specific summary (e.g. GRPO's reward curve), if the trainer keeps one."""
    fn = getattr(trainer, "autoslm_metrics", None)
    return fn() if callable(fn) else {}
