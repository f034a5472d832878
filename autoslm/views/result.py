"""A run's result as `launch` (once it ends) and `status` print it: per seed, the loss, the held-out
evaluations (each named by its protocol), the reward, lm-evaluation-harness's scores, what [eval]
decided, and the adapter handed back."""

from __future__ import annotations

from autoslm.controller.seed_metrics import Evaluation, SeedMetrics, Validation
from autoslm.controller.status import RunStatus
from autoslm.recipes.harness import metric_lines, time_words


def print_result(st: RunStatus, console) -> None:
    """A run's end (or where it stands), per seed: its loss, evaluations, reward, lm-eval scores, adapter."""
    console.print(
        f"run {st.run_id}: [bold]{st.state}[/bold] at step {st.step}/{st.total_steps}"
        + (f", ${st.cost_usd:.2f}" if st.cost_usd else "")
    )
    for seed_key, m in (st.metrics or {}).items():
        before, after = m.before or Evaluation(), m.after or Evaluation()
        line = f"  {seed_key}: final loss {m.final_loss}, {time_words(m.document)}"
        if before.loss is not None and after.loss is not None:
            line += f"; eval loss {before.loss:.3f} -> {after.loss:.3f}"
        if before.score is not None and after.score is not None:
            line += f"; eval accuracy (training prompt) {before.score:.1%} -> {after.score:.1%}"
        if before.score_sampled is not None and after.score_sampled is not None:
            line += f" (sampled {before.score_sampled:.1%} -> {after.score_sampled:.1%})"
        if m.reward_first is not None and m.reward_last is not None:
            line += f"; reward {m.reward_first:.3f} -> {m.reward_last:.3f}"
        console.print(line)
        for said in validation_lines(m) + metric_lines(m.lm_eval):
            console.print(f"    {said}", markup=False)
    if st.end_reason and st.end_reason != st.state:  # why it ended, where the state alone does not say
        console.print(f"  ended: {st.end_reason.words}")
    if st.adapter:
        console.print(f"  adapter: {st.adapter}")
    if st.error:
        console.print(f"  error: {st.error}", markup=False)  # worker errors may hold brackets


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
