"""TRL's private names that autoslm's trainer (``engine.train.trainer``) relies on: all present in the pinned
TRL, each named when a TRL lacks it or changed it, and no other module writing into a TRL object."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.worker

REPO = Path(__file__).resolve().parents[2]
# Every private TRL name the subclasses override, call, read or replace, as a reader would list them.
EXPECTED = {
    "GRPOTrainer._generate_and_score_completions",
    "GRPOTrainer._metrics",
    "GRPOTrainer._logs",
    "GRPOTrainer._last_loaded_step",
    "GRPOTrainer._tokenizer",
    "GRPOTrainer.vllm_generation",
    "VLLMGeneration",
    "VLLMGeneration._iter_named_params",
    "VLLMGeneration._fix_param_name_to_vllm",
    "VLLMGeneration.sync_weights",
    "VLLMGeneration.generate",
    "VLLMGeneration._dist",
    "VLLMGeneration.llm",
    "LLM",
}
CHECK = """
from autoslm.engine.train.trainer import refuse_changed_trl, trl_changes
from autoslm.errors import FatalWorkerError
print("\\n".join(trl_changes()) or "OK")
try:
    refuse_changed_trl()
except FatalWorkerError as e:
    print("REFUSED:", e)
"""


def test_the_pinned_trl_has_every_private_name_the_trainer_uses():
    pytest.importorskip("trl")
    from autoslm.engine.train.trainer import TRL_INSIDES, trl_changes

    assert {i.name for i in TRL_INSIDES} == EXPECTED
    assert trl_changes() == []


def test_every_private_trl_name_the_trainer_module_uses_is_listed():
    """A new ``._name`` of TRL's in trainer.py without its entry in TRL_INSIDES fails here."""
    pytest.importorskip("trl")
    from autoslm.engine.train.trainer import TRL_INSIDES

    src = (REPO / "autoslm/engine/train/trainer.py").read_text()
    ours = {"_shaped_batch", "_GRPO", "_VG", "_trl_builds"}  # and every _autoslm_* name
    used = {n for n in re.findall(r"(?:self|trainer|vg)\.(_[a-z][a-z_]*)\b", src) if not n.startswith("_autoslm_")} - ours
    listed = {i.name.rpartition(".")[2] for i in TRL_INSIDES}
    assert used and used <= listed, sorted(used - listed)


def _trl_copy(tmp_path: Path, edit) -> Path:
    """A copy of the installed trl package under ``tmp_path`` with ``edit(package_dir)`` applied."""
    import trl

    root = tmp_path / "site"
    shutil.copytree(Path(trl.__file__).parent, root / "trl", ignore=shutil.ignore_patterns("__pycache__"))
    edit(root / "trl")
    return root


def _check_with(root: Path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO)])}
    out = subprocess.run(
        [sys.executable, "-c", "import trl, sys; print(trl.__file__, file=sys.stderr)\n" + CHECK],
        env=env,
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert str(root) in out.stderr  # the copy was the TRL checked
    return out.stdout


def _replacing(rel: str, old: str, new: str):
    """An edit of a TRL copy: ``old`` (which its file ``rel`` must hold, once) made ``new``."""

    def edit(d: Path) -> None:
        p = d / rel
        src = p.read_text()
        assert src.count(old) == 1, old
        p.write_text(src.replace(old, new))

    return edit


def _drop_method(path: Path, cls: str, method: str) -> None:
    """Rename ``cls.method`` in ``path`` (the definition only), as a TRL without it would have."""
    src = path.read_text()
    start = src.index(f"class {cls}")
    at = src.index(f"    def {method}(", start)
    path.write_text(src[:at] + src[at:].replace(f"def {method}(", f"def {method}_gone(", 1))


@pytest.mark.pod  # the guard's mechanism, proven once, on the pod's TRL (each stack checks its own TRL above)
def test_a_trl_whose_insides_changed_is_refused_naming_each_change(tmp_path):
    """One copy of the pinned TRL with three changes a release could make (a private method gone, one whose
    parameters changed, an attribute __init__ no longer sets): each is named, nothing else is, and the
    trainer is not built on it. (One copy, one process: importing TRL is most of such a check's time.)"""
    pytest.importorskip("trl")

    def edit(d: Path) -> None:
        _drop_method(d / "generation/vllm_generation.py", "VLLMGeneration", "_iter_named_params")
        _replacing(
            "trainer/grpo_trainer.py",
            "def _generate_and_score_completions(\n        self, inputs",
            "def _generate_and_score_completions(\n        self, batch",
        )(d)
        _replacing("trainer/grpo_trainer.py", "self._last_loaded_step = -1", "self._loaded_at = -1")(d)

    changes, refused = _check_with(_trl_copy(tmp_path, edit)).split("REFUSED:")
    assert sorted(changes.strip().splitlines()) == [
        "trl.generation.vllm_generation.VLLMGeneration._iter_named_params: missing",
        "trl.trainer.grpo_trainer.GRPOTrainer._generate_and_score_completions: parameters are (self, batch), pinned (self, inputs)",
        "trl.trainer.grpo_trainer.GRPOTrainer._last_loaded_step: GRPOTrainer.__init__ no longer sets it",
    ], changes
    assert "_iter_named_params: missing" in refused  # and the trainer is not built on it


@pytest.mark.pod
def test_the_unmodified_copy_passes(tmp_path):
    """The copy itself is sound: what fails above is the changes made to it."""
    pytest.importorskip("trl")
    assert _check_with(_trl_copy(tmp_path, lambda d: None)).strip() == "OK"


def test_no_module_but_the_trainer_assigns_into_a_trl_object():
    """What the issue's grep checks, the module globals TRL's trainer builds from, reads of a trainer's
    private attributes by name, and the colocated engine let go (``release_generation``, after training)."""
    pattern = re.compile(
        r"trainer\._\w+\s*=[^=]|getattr\((?:trainer|vg), [\"']_|\._iter_named_params\s*=[^=]|sync_weights\s*=[^=]|"
        r"\bvg\.\w+\s*=[^=]|\.LLM\s*=[^=]|\.VLLMGeneration\s*=[^=]|\.llm\s*=[^=]|vllm_generation\b.*=[^=]"
    )
    hits = []
    for path in (REPO / "autoslm").rglob("*.py"):
        if path.name == "trainer.py" and path.parent.name == "train":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not hits, hits


def _guess_trainer(tmp_path, steps):
    """A real AutoslmGRPOTrainer on the built-in tiny model, playing the guessing game for one step."""
    import datasets
    from peft import LoraConfig
    from trl import GRPOConfig

    from autoslm.engine.rollout.multiturn import MultiTurnRollout
    from autoslm.engine.rollout.rewards import build_reward_set, rows_from_examples
    from autoslm.engine.train.recipe import Device, checkpointing_kwargs
    from autoslm.engine.train.tiny import build_model, build_tokenizer
    from autoslm.engine.train.trainer import AutoslmGRPOTrainer
    from autoslm.envs.guess import GuessEnv
    from autoslm.recipes.batching import plan_grpo_batches
    from autoslm.recipes.grpo import GRPOTrain

    tok = build_tokenizer()
    env = GuessEnv({"n_train": 8, "n_eval": 0, "max_number": 5, "max_turns": 2})
    plan = plan_grpo_batches(GRPOTrain(prompts_per_step=2, group_size=2, micro_batch_size=4))
    rewards = build_reward_set(env, thinking=False)
    rollout = MultiTurnRollout(env, max_turn_tokens=4)
    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        learning_rate=1e-3,
        use_cpu=True,
        bf16=False,
        **checkpointing_kwargs(None, Device("cpu")),
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        max_completion_length=16,
        chat_template_kwargs={"enable_thinking": False},
        seed=0,
        **plan.grpo_config_kwargs(),
        **rewards.grpo_config_kwargs(),
    )
    return AutoslmGRPOTrainer(
        model=build_model(tok),
        processing_class=tok,
        reward_funcs=rewards.funcs,
        args=args,
        rollout_func=rollout,
        train_dataset=datasets.Dataset.from_list(rows_from_examples(env.train_examples())),
        steps=steps,
        cuda=False,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"),
    ), rollout


def test_the_generation_steps_run_in_their_order_on_a_real_trainer(tmp_path):
    """TRL generates with the rows captured (the guessing game's prompts are all alike: without its rows
    the rollout could not tell the examples apart), shaping sees each scored batch after that; sampling
    wraps both (one call per draw); the advantage numbers see sampling's result; all reach TRL's log."""
    pytest.importorskip("trl")
    from autoslm.engine.train.trainer import GenerationSteps

    calls = []

    def shaping(trainer, batch):
        calls.append(("shaping", trainer.autoslm_rows, batch["advantages"].shape[0]))
        return {"seam/shaped": 1.0}

    def sampling(trainer, inputs, generate):
        calls.append(("sampling", len(inputs)))
        generate(inputs)  # the first draw, shaped
        second = generate(inputs)  # a "draw": the same step again, shaped again
        second["advantages"] = second["advantages"] * 0 + 0.5
        return second

    def advantages(batch):
        calls.append(("advantages", batch["advantages"].tolist()))
        return {"seam/adv": float(batch["advantages"].mean())}

    trainer, rollout = _guess_trainer(tmp_path, GenerationSteps(shaping=shaping, sampling=sampling, advantages=advantages))
    trainer.train()
    n = len(rollout.last_episodes)
    assert calls == [("sampling", n), ("shaping", None, n), ("shaping", None, n), ("advantages", [0.5] * n)]
    assert trainer.autoslm_rows is None  # only while TRL generates
    logged = trainer.state.log_history[0]
    assert logged["seam/shaped"] == 1.0 and logged["seam/adv"] == 0.5


class OutOfMemoryError(RuntimeError):
    """Stands in for torch.cuda.OutOfMemoryError (recognised by its class name)."""


def test_an_out_of_memory_error_in_any_generation_step_ends_the_run_through_the_oom_step(tmp_path):
    pytest.importorskip("trl")
    from autoslm.engine.train.trainer import GenerationSteps
    from autoslm.errors import FatalWorkerError

    def shaping(trainer, batch):
        raise OutOfMemoryError("CUDA out of memory")

    steps = GenerationSteps(shaping=shaping, oom=lambda n: FatalWorkerError(f"out of memory generating {n}"))
    trainer, _ = _guess_trainer(tmp_path, steps)
    with pytest.raises(FatalWorkerError, match="out of memory generating 4"):
        trainer.train()
