"""[eval]: pass@k, the rules that read a metric, the best evaluation kept, the early stop, and what
validate refuses."""

from __future__ import annotations

import math

import pytest

from autoslm.engine.pod.validation import Snapshot, StoredAdapter, Validation, earlier_best
from autoslm.engine.rollout.evaluate import sampled_metrics
from autoslm.errors import SpecError
from autoslm.recipes.evaluation import at_least_as_good, pass_at_k, reached
from autoslm.spec import parse_spec

pytestmark = pytest.mark.worker  # also runs on the worker image's pins (make test-image)


def test_pass_at_k_is_the_unbiased_estimator():
    # 1 - C(n-c, k) / C(n, k), by hand: n = 4, c = 2 -> pass@1 = 1/2, pass@2 = 1 - 1/6, pass@3 = pass@4 = 1.
    assert pass_at_k(4, 2, 1) == pytest.approx(0.5)
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)
    assert pass_at_k(4, 2, 3) == 1.0 and pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - math.comb(7, 5) / math.comb(10, 5))
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5)  # large n: no overflow
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_sampled_metrics_on_fixed_samples_match_a_hand_computation():
    rewards = [[1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 0]]  # three prompts, four sampled answers each
    out = sampled_metrics(rewards, ks=(1, 2, 4))
    assert out["score_sampled"] == pytest.approx(5 / 12, abs=1e-4)
    assert out["pass@1"] == pytest.approx((0.5 + 0 + 0.75) / 3, abs=1e-4)
    assert out["pass@2"] == pytest.approx((5 / 6 + 0 + 1) / 3, abs=1e-4)
    assert out["pass@4"] == pytest.approx(2 / 3, abs=1e-4)
    # Partial credit passes only at the threshold.
    assert sampled_metrics([[0.5, 1.0]], ks=(1,), threshold=1.0)["pass@1"] == 0.5
    assert sampled_metrics([[0.5, 1.0]], ks=(1,), threshold=0.5)["pass@1"] == 1.0


def test_metric_rules():
    assert reached("score", 0.6, 0.5) and reached("score", 0.5, 0.5) and not reached("score", 0.4, 0.5)
    assert reached("loss", 1.0, 1.2) and not reached("loss", 1.3, 1.2) and not reached("score", None, 0.5)
    assert not reached("score", 0.9, None)
    assert at_least_as_good("score", 0.5, 0.5) and not at_least_as_good("score", 0.4, 0.5)  # ties: the later
    assert at_least_as_good("loss", 1.0, 1.2) and not at_least_as_good("loss", 1.3, 1.2)
    assert at_least_as_good("pass@1", 0.1, None) and not at_least_as_good("score", None, 0.1)


class _Model:
    """Named trainable parameters, as a PEFT model has them."""

    def __init__(self, value: float):
        import torch

        self.w = torch.nn.Parameter(torch.full((2,), value))
        self.frozen = torch.nn.Parameter(torch.zeros(2), requires_grad=False)

    def named_parameters(self):
        return [("lora_A.weight", self.w), ("base.weight", self.frozen)]


def test_keep_best_hands_back_the_best_evaluation_and_says_its_step():
    v = Validation(metric="score", every=10, keep_best=True)
    v.consider(0, "before", {"score": 0.5}, _Model(0.0))
    v.consider(10, "during", {"score": 0.7}, _Model(1.0))
    v.consider(20, "during", {"score": 0.6}, _Model(2.0))
    v.consider(30, "after", {"score": 0.55}, _Model(3.0))
    best = v.chosen(final_step=30)
    assert best.step == 10 and best.value == 0.7 and set(best.weights.tensors) == {"lora_A.weight"}
    model = _Model(3.0)
    best.weights.put_into(model)
    assert model.w.tolist() == [1.0, 1.0]
    s = v.summary(best, 30)
    assert s["adapter"] == "best" and s["best"] == {"step": 10, "when": "during", "value": 0.7}
    assert [e["step"] for e in s["evaluations"]] == [0, 10, 20, 30] and "step 10" in s["note"]


def test_a_run_that_only_got_worse_hands_back_its_start_and_says_so():
    v = Validation(metric="score", keep_best=True)
    v.consider(0, "before", {"score": 0.56}, _Model(0.0))
    v.consider(400, "after", {"score": 0.44}, _Model(1.0))
    best = v.chosen(400)
    assert best.when == "before" and best.step == 0
    assert "started from" in v.choice_note(best, 400)


def test_ties_and_the_last_state_hand_back_the_last():
    v = Validation(metric="score", keep_best=True)
    v.consider(0, "before", {"score": 0.5}, _Model(0.0))
    v.consider(40, "after", {"score": 0.5}, _Model(1.0))
    assert v.chosen(40) is None and v.summary(None, 40)["adapter"] == "last"
    last = Validation(metric="score", keep_best=True, hand_back="last")
    last.consider(0, "before", {"score": 0.9}, _Model(0.0))
    last.consider(40, "after", {"score": 0.5}, _Model(1.0))
    assert last.chosen(40) is None and "the best evaluation was at step 0" in last.choice_note(None, 40)


def test_without_keep_best_nothing_is_copied_and_the_last_is_handed_back():
    v = Validation(metric="score")
    v.consider(0, "before", {"score": 0.9}, _Model(0.0))
    v.consider(40, "after", {"score": 0.1}, _Model(1.0))
    assert v.best is None and v.chosen(40) is None


def test_a_resumed_attempts_before_is_history_only():
    v = Validation(metric="score", keep_best=True)
    v.consider(0, "before", {"score": 0.9}, candidate=False)
    v.consider(40, "after", {"score": 0.1}, _Model(1.0))
    assert v.best.step == 40 and len(v.history) == 2


def _record(step: int, when: str, value: float, metric: str = "score") -> dict:
    """What RunArtifacts.fetch_best reads back: an earlier attempt's best evaluation."""
    return {"step": step, "when": when, "metric": metric, "value": value, "result": {metric: value, "n": 8}, "attempt": 1}


def test_earlier_best_reads_a_record_and_refuses_one_that_cannot_be_trusted(tmp_path):
    best = earlier_best(_record(2, "during", 0.52), "score", tmp_path)
    assert (best.step, best.when, best.value, best.attempt, best.weights) == (2, "during", 0.52, 1, StoredAdapter(tmp_path))
    for bad, why in [
        (_record(2, "during", 0.52, metric="loss"), "chosen by 'loss'"),
        ({**_record(2, "during", 0.52), "step": "2"}, "unreadable"),
        ({**_record(2, "during", 0.52), "when": "sometime"}, "unreadable"),
        ({**_record(2, "during", 0.52), "attempt": None}, "unreadable"),
        ({**_record(2, "during", 0.52), "value": 0.9}, "not its evaluation's"),
        (_record(2, "during", math.nan), "not its evaluation's"),
        ([1, 2], "not a JSON object"),
    ]:
        with pytest.raises(ValueError, match=why):
            earlier_best(bad, "score", tmp_path)


def test_a_relaunched_attempt_chooses_among_every_evaluation_of_the_run(tmp_path):
    # The first attempt's start scored 0.52; the relaunched one resumes at step 2 and only gets worse.
    v = Validation(metric="score", every=2, keep_best=True)
    v.recall(earlier_best(_record(0, "before", 0.52), "score", tmp_path))
    v.consider(0, "before", {"score": 0.52}, candidate=False)  # the first attempt's "before", from train_meta
    v.consider(4, "during", {"score": 0.3}, _Model(1.0))
    v.consider(6, "after", {"score": 0.0}, _Model(2.0))
    chosen = v.chosen(6)
    assert chosen.step == 0 and chosen.weights == StoredAdapter(tmp_path) and chosen.attempt == 1
    note = v.choice_note(chosen, 6)
    assert "started from (step 0)" in note and "attempt 1 made that evaluation" in note
    s = v.summary(chosen, 6)
    assert s["adapter"] == "best" and s["best"] == {
        "step": 0,
        "when": "before",
        "value": 0.52,
        "attempt": 1,
        "earlier_attempt": True,
    }
    assert [e["step"] for e in s["evaluations"]] == [0, 4, 6]

    # A kept "during" evaluation of the first attempt is listed among the evaluations, in its place.
    during = Validation(metric="score", every=2, keep_best=True)
    during.recall(earlier_best(_record(2, "during", 0.6), "score", tmp_path))
    during.consider(0, "before", {"score": 0.52}, candidate=False)
    during.consider(6, "after", {"score": 0.1}, _Model(2.0))
    assert [(e["step"], e.get("attempt")) for e in during.summary(during.chosen(6), 6)["evaluations"]] == [
        (0, None),
        (2, 1),
        (6, None),
    ]

    # One of its own evaluations at least as good takes the earlier one's place, whatever the order.
    later = Validation(metric="score", keep_best=True)
    later.recall(earlier_best(_record(0, "before", 0.52), "score", tmp_path))
    later.consider(4, "during", {"score": 0.52}, _Model(1.0))
    assert later.best.step == 4 and later.best.attempt is None and "earlier_attempt" not in later.summary(None, 6)["best"]
    own = Validation(metric="score", keep_best=True)
    own.consider(0, "before", {"score": 0.52}, _Model(0.0))
    own.recall(earlier_best(_record(2, "during", 0.52), "score", tmp_path))
    assert own.best.attempt is None
    off = Validation(metric="score")
    off.recall(earlier_best(_record(2, "during", 0.52), "score", tmp_path))
    assert off.best is None


UNUSABLE = (
    "the best evaluation an earlier attempt recorded cannot be used (SafetensorError: incomplete metadata): "
    "keep_best chooses among this attempt's evaluations only"
)


def test_a_best_record_set_aside_is_said_and_no_adapter_is_called_the_best_that_is_not():
    from autoslm.controller.seed_metrics import SeedMetrics
    from autoslm.views.result import validation_lines

    # The first attempt's start scored 0.52 and its best record was damaged; the relaunched one only gets worse.
    v = Validation(metric="score", every=2, keep_best=True, earlier_unusable=UNUSABLE)
    v.consider(0, "before", {"score": 0.52}, candidate=False)
    v.consider(6, "after", {"score": 0.0}, _Model(2.0))
    assert v.chosen(6) is None  # the last state is this attempt's best
    note = v.choice_note(None, 6)
    assert note.startswith(UNUSABLE) and "the last one, step 6 (score 0.0), the best of this attempt's evaluations" in note
    assert "the run's start scored score 0.52, better" in note
    s = v.summary(None, 6)
    assert s["earlier_best_unusable"] == UNUSABLE and s["better_out_of_reach"] == {"step": 0, "when": "before", "value": 0.52}
    metrics = {"eval": {"after_step": 6, "note": note}, "validation": s}
    assert validation_lines(SeedMetrics.of(metrics)) == [note]
    assert not any(
        "the best evaluation by" in line for line in validation_lines(SeedMetrics.of({**metrics, "eval": {"after_step": 6}}))
    )

    # A kept evaluation of its own is named as this attempt's best, not the run's.
    during = Validation(metric="score", every=2, keep_best=True, earlier_unusable=UNUSABLE)
    during.consider(0, "before", {"score": 0.52}, candidate=False)
    during.consider(4, "during", {"score": 0.3}, _Model(1.0))
    during.consider(6, "after", {"score": 0.0}, _Model(2.0))
    chosen = during.chosen(6)
    assert chosen.step == 4
    note = during.choice_note(chosen, 6)
    assert "step 4's (score 0.3), the best of this attempt's evaluations" in note and "start scored score 0.52" in note
    assert "adapter of the best evaluation" not in note

    # Without a record set aside, a start out of reach is said too; a record set aside alone is said.
    lost = Validation(metric="score", keep_best=True)
    lost.consider(0, "before", {"score": 0.52}, candidate=False)
    lost.consider(6, "after", {"score": 0.0}, _Model(2.0))
    assert lost.choice_note(None, 6).startswith("not the best evaluation of the run: ")
    better = Validation(metric="score", keep_best=True, earlier_unusable=UNUSABLE)
    better.consider(0, "before", {"score": 0.52}, candidate=False)
    better.consider(6, "after", {"score": 0.6}, _Model(2.0))
    assert better.choice_note(None, 6).startswith(UNUSABLE) and "better_out_of_reach" not in better.summary(None, 6)


class _Keeper:
    """A keeper that remembers what it was handed, and recalls what it is given."""

    def __init__(self, earlier=None, note=None):
        self.earlier, self.note, self.recorded = earlier, note, []

    def recall(self):
        return self.earlier, self.note

    def record(self, best, model):
        self.recorded.append((best.step, best.when))


def test_each_new_best_before_the_end_is_handed_to_the_keeper():
    keeper = _Keeper()
    seen = keeper.recorded
    v = Validation(metric="score", every=2, keep_best=True, keeper=keeper)
    v.consider(0, "before", {"score": 0.5}, _Model(0.0))
    v.consider(2, "during", {"score": 0.4}, _Model(1.0))
    v.consider(4, "during", {"score": 0.6}, _Model(2.0))
    v.consider(6, "after", {"score": 0.9}, _Model(3.0))  # handed back by this attempt: nothing to keep for another
    assert seen == [(0, "before"), (4, "during")]


def test_stop_at():
    v = Validation(metric="pass@1", every=5, stop_at=0.5)
    assert v.due(5, 20) and not v.due(20, 20) and not v.due(3, 20)
    v.consider(5, "during", {"pass@1": 0.3})
    assert v.stopped is None
    v.consider(10, "during", {"pass@1": 0.55})
    v.consider(15, "during", {"pass@1": 0.6})
    assert v.stopped["step"] == 10 and "pass@1 0.55 >= 0.5" in v.stop_reason()
    loss = Validation(metric="loss", stop_at=2.0)
    loss.consider(5, "during", {"loss": 1.9})
    assert "<= 2.0" in loss.stop_reason()
    ranks = Validation(metric="score", stop_at=0.5, agree=lambda flag: False)  # another rank has not reached it
    ranks.consider(5, "during", {"score": 0.9})
    assert ranks.stopped is None


def test_snapshot_copies_trainable_weights_only():
    m = _Model(2.0)
    snap = Snapshot.of(m)
    m.w.data.fill_(5.0)
    assert list(snap.tensors) == ["lora_A.weight"] and snap.tensors["lora_A.weight"].tolist() == [2.0, 2.0]


def test_the_keepers_recall_is_the_first_candidate_and_a_note_sets_it_aside(tmp_path):
    earlier = earlier_best(_record(2, "during", 0.6), "score", tmp_path)
    v = Validation(metric="score", every=2, keep_best=True, keeper=_Keeper(earlier))
    assert v.recall_earlier() is earlier and v.best is earlier
    v.consider(4, "during", {"score": 0.5}, _Model(1.0))
    assert v.chosen(6) is earlier and v.chosen(6).weights == StoredAdapter(tmp_path)
    unusable = Validation(metric="score", keep_best=True, keeper=_Keeper(earlier, note=UNUSABLE))
    assert unusable.recall_earlier() is None and unusable.best is None and unusable.earlier_unusable == UNUSABLE
    off = Validation(metric="score", keeper=_Keeper(earlier))  # no keep_best: nothing is recalled
    assert off.recall_earlier() is None and off.best is None


BASE = """
name = "t"
model = "autoslm/tiny"
[environment]
id = "autoslm/arith"
[train]
method = "grpo"
max_steps = 10
"""


def test_eval_table_defaults_and_validate_errors():
    spec = parse_spec(BASE)
    assert (spec.eval.every, spec.eval.metric, spec.eval.at_start, spec.eval.at_end, spec.eval.adapter) == (
        0,
        "score",
        True,
        True,
        "best",
    )
    spec = parse_spec(BASE + '[eval]\nevery = 50\nsamples = 4\nmetric = "pass@4"\nstop_at = 0.9\nkeep_best = true\n')
    assert spec.eval.samples == 4 and spec.eval.stop_at == 0.9
    with pytest.raises(SpecError) as e:
        parse_spec(BASE + '[eval]\nsamples = 2\nmetric = "pass@4"\n')
    assert "eval.metric" in str(e.value) and "eval.samples = 4" in str(e.value)
    with pytest.raises(SpecError) as e:
        parse_spec(BASE + '[eval]\nmetric = "accuracy"\n')
    assert "pass@K" in str(e.value)
    with pytest.raises(SpecError) as e:
        parse_spec(BASE.replace('method = "grpo"\n', "") + '[eval]\nmetric = "score_sampled"\n')
    assert "needs sampled answers" in str(e.value)
    with pytest.raises(SpecError) as e:
        parse_spec(BASE + "eval_samples = 0\n[eval]\nstop_at = 0.5\n")
    assert "train.eval_samples" in str(e.value)
    with pytest.raises(SpecError) as e:
        parse_spec(BASE + '[eval]\nkeep_best = true\n[compute]\ngpu_count = 2\nstrategy = "fsdp"\n')
    assert "eval.keep_best" in str(e.value)


def test_keep_best_auto_is_on_for_grpo_continuing_an_adapter():
    from autoslm.recipes.evaluation import keeps_best

    assert not keeps_best(parse_spec(BASE).eval, parse_spec(BASE).train)
    cont = parse_spec(BASE + 'init_from_adapter = "quickstart"\n')
    assert keeps_best(cont.eval, cont.train)
    off = parse_spec(BASE + 'init_from_adapter = "quickstart"\n[eval]\nkeep_best = false\n')
    assert not keeps_best(off.eval, off.train)


def test_the_checkpoint_where_stop_at_ended_training_says_so(tmp_path):
    from types import SimpleNamespace

    from autoslm.engine.pod.validation import stopped_at

    events = []
    reporter = SimpleNamespace(event=lambda kind, **data: events.append((kind, data)))
    v = Validation(metric="score", every=5, stop_at=0.5)
    cb = v.callback(lambda model: {"score": 0.6, "n": 4}, reporter)
    args, control = SimpleNamespace(output_dir=str(tmp_path)), SimpleNamespace(should_training_stop=False, should_save=False)
    cb.on_step_end(args, SimpleNamespace(global_step=5, max_steps=20), control, model=None)
    assert control.should_training_stop and control.should_save
    assert [k for k, _ in events] == ["eval", "early_stop"]
    (tmp_path / "checkpoint-5").mkdir()
    cb.on_save(args, SimpleNamespace(global_step=5, max_steps=20), control)
    assert stopped_at(tmp_path / "checkpoint-5")["step"] == 5 and stopped_at(tmp_path) is None


def test_the_adapter_handed_back_leaves_out_trls_frozen_reference_copy(tmp_path):
    """GRPO with beta > 0 on a continued adapter trains beside TRL's "ref" copy of it: only the trained
    adapter is saved."""
    from types import SimpleNamespace

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from autoslm.engine.distributed import Ranks, save_adapter
    from autoslm.engine.train.tiny import ensure_tiny

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(ensure_tiny(tmp_path / "m")), LoraConfig(r=2, target_modules=["q_proj"])
    )
    model.add_adapter("ref", model.peft_config["default"])
    save_adapter(SimpleNamespace(model=model), tmp_path / "adapter", Ranks())
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists() and not (tmp_path / "adapter" / "ref").exists()
