"""A seed's metrics.json as the views read it: typed parts (the evaluations, the lm-eval block, a sweep
member's figures), each giving back exactly what the worker wrote for ``status --json``."""

from __future__ import annotations

from autoslm.controller.seed_metrics import MemberMetrics, SeedMetrics
from autoslm.recipes.harness import LmEvalBlock, metric_lines

TASK = {"version": 3, "shots": 5, "samples": 1319, "metrics": {"exact_match,strict-match": 0.31}}
DOC = {
    "steps": 8,
    "final_loss": 0.11,
    "reward_last": 0.9,
    "train_time_s": 41.5,
    "lm_eval_time_s": 9.5,
    "eval": {"before": {"loss": 2.0, "score": 0.1, "pass@4": 0.2, "n": 8}, "after": {"loss": 1.0, "score": 0.6, "n": 8}},
    "lm_eval": {"version": "0.4.13", "seconds": 9.5, "models": {"base": {"gsm8k": TASK}}, "cut": {"words": "cut"}},
}


def test_a_seeds_metrics_are_typed_and_given_back_as_written():
    m = SeedMetrics.of(DOC)
    assert m.to_json() is DOC and m.lm_eval.to_json() is DOC["lm_eval"]
    assert (m.train_time_s, m.lm_eval_time_s, m.after.score) == (41.5, 9.5, 0.6)
    assert m.before.figures == {"loss": 2.0, "score": 0.1, "pass@4": 0.2}  # every figure but n, as written
    assert (m.lm_eval.version, m.lm_eval.cut, m.lm_eval.running, m.lm_eval.error) == ("0.4.13", "cut", False, None)
    assert metric_lines(m.lm_eval) == metric_lines(DOC["lm_eval"])  # the typed block says what the dict says
    assert LmEvalBlock.of({}) is None and LmEvalBlock.of("garbled") is None and SeedMetrics.of({}).lm_eval is None


def test_a_sweep_members_figures_name_those_it_has_in_ranking_order():
    figures = MemberMetrics.of(SeedMetrics.of(DOC))
    assert figures.to_json() == {"eval_score": 0.6, "reward": 0.9, "eval_loss": 1.0, "final_loss": 0.11}
    assert list(figures.to_json()) == list(MemberMetrics.NAMES) and figures.get("eval_score") == 0.6
    assert MemberMetrics.of(None).to_json() == {} and MemberMetrics.of(None).get("reward") is None
    assert MemberMetrics.of(SeedMetrics.of({"final_loss": 1})).to_json() == {"final_loss": 1.0}
