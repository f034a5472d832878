"""A run's result as `launch` (once it ends) and `status` print it: per seed, the loss, the held-out
evaluations (each named by its protocol), the reward, lm-evaluation-harness's scores, what [eval]
decided, and the adapter handed back."""

from __future__ import annotations

from autoslm.controller.seed_metrics import Evaluation, SeedMetrics, Validation
from autoslm.controller.status import RunStatus
from autoslm.recipes.harness import metric_lines, time_words
from autoslm.views.runview import duration, teardown_lines


def print_result(st: RunStatus, console) -> None:
    """A run's end (or where it stands), per seed: its loss, evaluations, reward, lm-eval scores, adapter.
    A serve's status speaks of serving instead (``serve_lines``)."""
    if st.serve is not None:
        for line in serve_lines(st):
            console.print(line, markup=False)
        return
    console.print(
        f"run {st.run_id}: [bold]{st.state}[/bold] at step {st.step}/{st.total_steps}"
        + (f", ${st.cost_usd:.2f}" if st.cost_usd else "")
    )
    for seed_key, m in (st.metrics or {}).items():
        console.print(seed_result(seed_key, m))
        for said in validation_lines(m) + metric_lines(m.lm_eval):
            console.print(f"    {said}", markup=False)
    if st.end_reason and st.end_reason != st.state:  # why it ended, where the state alone does not say
        console.print(f"  ended: {st.end_reason.words}")
    if st.adapter:
        console.print(f"  adapter: {st.adapter}")
    if st.error:
        console.print(f"  error: {st.error}", markup=False)  # worker errors may hold brackets


def seed_result(seed_key: str, m: SeedMetrics) -> str:
    """One seed's results in a line, each figure only where it is known (a run the controller handed back
    at a limit has no final loss and no training time: its step is what is known)."""
    before, after = m.before or Evaluation(), m.after or Evaluation()
    head = ", ".join(
        x
        for x in (f"final loss {m.final_loss}" if m.final_loss is not None else "", time_words(m.train_time_s, m.lm_eval_time_s))
        if x
    )
    said = [head] if head else []
    if before.loss is not None and after.loss is not None:
        said.append(f"eval loss {before.loss:.3f} -> {after.loss:.3f}")
    if before.score is not None and after.score is not None:
        said.append(f"eval accuracy (training prompt) {before.score:.1%} -> {after.score:.1%}")
        if before.score_sampled is not None and after.score_sampled is not None:
            said[-1] += f" (sampled {before.score_sampled:.1%} -> {after.score_sampled:.1%})"
    if m.reward_first is not None and m.reward_last is not None:
        said.append(f"reward {m.reward_first:.3f} -> {m.reward_last:.3f}")
    if not said and m.steps is not None:
        said.append(f"step {m.steps}")
    return f"  {seed_key}: " + "; ".join(said) if said else f"  {seed_key}:"


def serve_lines(st: RunStatus) -> list[str]:
    """A serve's status: what it serves, its endpoint while it answers, the time (and money) left to its
    limits, its pod; once ended, how long it served and why it ended."""
    sv, first = st.serve, st.first_seed
    what = f"run {sv.source_run}'s " + ("final adapter" if sv.step is None else f"checkpoint of step {sv.step}")
    where = (f" on {st.provider}" if st.provider else "") + (f" ({first.gpu})" if first is not None and first.gpu else "")
    cost = f", ${st.cost_usd:.2f}" + (" so far" if st.state.live else "") if st.cost_usd else ""
    if not st.state.live:
        served = f" for {duration(sv.served_s)}" if sv.served_s else ""
        out = [f"serve {st.run_id}: {st.state}; served {what} as model {sv.model}{where}{served}{cost}"]
        if st.end_reason and st.end_reason != st.state:
            out.append(f"  ended: {_SERVE_END.get(st.end_reason, st.end_reason.words)}")
    else:
        out = [f"serve {st.run_id}: {st.state}; serves {what} as model {sv.model}{where}{cost}"]
        message = first.message if first is not None else None
        if sv.endpoint and message and message.startswith("serving "):
            out.append(f"  {message}")  # the endpoint, with the token it needs where it needs one
        else:
            out.append("  not answering yet" + (f": {message}" if message else ""))
        left = f"  ends in {duration(sv.ttl_left_s)} (--ttl)" if sv.ttl_left_s is not None else "  ends at its --ttl"
        out.append(left + (f" or at ${sv.max_usd:.2f} (--max-usd), whichever comes first" if sv.max_usd else ""))
        if first is not None:
            pod = f"pod {first.pod_id}" if first.pod_id else "no pod yet"
            age = first.last_heartbeat_age_s
            out.append(f"  {pod}, restarts {first.restarts}" + (f", heartbeat {age:.0f}s ago" if age is not None else ""))
    for s in st.seeds:
        if s.teardown is not None:
            out += teardown_lines(s.teardown)
    if st.error:
        out.append(f"  error: {st.error}")
    return out


_SERVE_END = {"deadline": "its --ttl (limits.ttl_s) was reached", "money_limit": "its --max-usd (limits.max_usd) was reached"}


def validation_lines(m: SeedMetrics) -> list[str]:
    """What [eval] decided for one seed: why training stopped early, and which step's adapter it hands back."""
    out = [f"stopped early: {m.stop_reason}"] if m.stop_reason else []
    val = m.validation
    if m.note:
        out.append(m.note)
    elif val is not None and val.keep_best and m.after_step is not None and _the_runs_best(val, m.after_step):
        out.append(f"adapter: step {m.after_step}, the best evaluation by {val.metric}")
    return out


def _the_runs_best(val: Validation, step: int) -> bool:
    """Is the adapter of ``step`` the best evaluation of the run (not only of its last attempt)?"""
    return val.best_step == step and not (val.earlier_best_unusable or val.better_out_of_reach)
