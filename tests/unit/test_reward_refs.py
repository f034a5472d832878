"""``[environment] rewards``: references, the checks `validate` makes on a reward file, shipping the
file through the store, the worker's TRL call with the row's columns, the error policy, and the
final-answer formats (``answer_format``) of math datasets."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from autoslm.engine.rollout.named_rewards import NamedTRLReward, prepare, resolve
from autoslm.engine.rollout.rewards import RewardLog, build_reward_set, example_to_row
from autoslm.engine.train.grpo_progress import reward_summary
from autoslm.envs.answers import format_reward, gold_answer, gsm8k_extract, gsm8k_gold, last_boxed
from autoslm.envs.base import Example
from autoslm.envs.jsonl import JsonlEnv
from autoslm.envs.reward_check import check_file
from autoslm.envs.reward_refs import MAX_REWARD_FILE_BYTES, NamedReward, named_rewards, parse_reward, placeholder_row
from autoslm.errors import FatalWorkerError, SpecError
from autoslm.spec import load_spec
from autoslm.store.local import LocalStore
from autoslm.store.shipping import DataFiles, ship_local_files

pytestmark = pytest.mark.worker  # also runs on the worker image's pins (make test-image)

GSM8K_ANSWER = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)

REWARDS_PY = '''
import re

def parity(prompts, completions, answer, **kwargs):
    """1 when the completion's last number has the parity of the answer."""
    out = []
    for completion, want in zip(completions, answer):
        found = re.findall(r"-?\\d+", completion[0]["content"])
        out.append(1.0 if found and int(found[-1]) % 2 == int(want) % 2 else 0.0)
    return out

def raises(prompts, completions, **kwargs):
    return [1 / 0 for _ in completions]

def narrow(prompts, completions):
    return [0.0 for _ in completions]

def wants_a_column(prompts, completions, difficulty, **kwargs):
    return [0.0 for _ in completions]

def not_a_list(prompts, completions, **kwargs):
    return 1.0

async def slow(prompts, completions, **kwargs):
    return [None for _ in completions]

COUNT = 3
'''


def write_spec(tmp_path: Path, rewards: str, extra: str = "", env_id: str = "autoslm/arith", method: str = "grpo") -> Path:
    (tmp_path / "rewards.py").write_text(REWARDS_PY)
    path = tmp_path / "spec.toml"
    train = "prompts_per_step = 2\ngroup_size = 2\nmax_completion_tokens = 8\n" if method == "grpo" else "batch_size = 2\n"
    path.write_text(
        f'name = "rw"\nmodel = "autoslm/tiny"\n[environment]\nid = "{env_id}"\nrewards = [{rewards}]\n{extra}\n'
        f'[train]\nmethod = "{method}"\nmax_steps = 2\n{train}max_length = 64\n'
    )
    return path


def one_issue(path: Path) -> str:
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert len(e.value.issues) == 1, e.value.issues
    return str(e.value.issues[0])


# -- validate ---------------------------------------------------------------------------------------
def test_a_good_file_validates_with_its_path_relative_to_the_spec(tmp_path):
    spec = load_spec(
        write_spec(tmp_path, '"rewards.py:parity", "trl:accuracy_reward", "env"', "reward_weights = [0.5, 1.0, 2.0]")
    )
    assert spec.environment.rewards[0] == f"{tmp_path / 'rewards.py'}:parity"
    assert spec.environment.rewards[1:] == ["trl:accuracy_reward", "env"]


@pytest.mark.parametrize(
    "ref, said",
    [
        (
            '"rewards.py:raises"',
            "rewards.py:raises: calling it on the first row of the data raised ZeroDivisionError: division by zero (line 13)",
        ),
        (
            '"rewards.py:nope"',
            "rewards.py:nope: the file has no 'nope'; its functions: narrow, not_a_list, parity, raises, slow, wants_a_column",
        ),
        ('"rewards.py:narrow"', "rewards.py:narrow: its parameters (prompts, completions) cannot take the keywords TRL passes"),
        ('"rewards.py:wants_a_column"', "ask for what TRL does not pass (missing a required argument: 'difficulty')"),
        ('"rewards.py:not_a_list"', "on the first row of the data it returned float, not a list"),
        ('"rewards.py:COUNT"', "'COUNT' is not a function (it is int)"),
        ('"gone.py:f"', "gone.py:f: file not found"),
        ('"trl:nope"', "'trl:nope' is not one of TRL's reward functions; known: trl:accuracy_reward"),
        ('"rewards.txt:f"', "the reward file must be a Python file (.py)"),
    ],
)
def test_each_bad_reward_is_one_line_naming_the_entry(tmp_path, ref, said):
    line = one_issue(write_spec(tmp_path, ref))
    assert "environment.rewards.0" in line and said in line, line


def test_a_file_above_the_size_cap_is_refused_before_it_is_imported(tmp_path):
    path = write_spec(tmp_path, '"big.py:f"')
    (tmp_path / "big.py").write_text("raise SystemExit('never imported')\n" + "#" * MAX_REWARD_FILE_BYTES)
    line = one_issue(path)
    assert "big.py:f: the file is 1025 KiB, above the 1024 KiB a reward file may have" in line, line


def test_a_file_that_raises_while_importing_names_the_line(tmp_path):
    path = write_spec(tmp_path, '"broken.py:f"')
    (tmp_path / "broken.py").write_text("x = 1\nraise RuntimeError('no config')\n")
    assert "broken.py:f: importing the file raised RuntimeError: no config (line 2)" in one_issue(path)


LOOPS = {
    "import": ("x = 1\nwhile True:\n    x += 1\n", "loop.py:f: importing the file did not finish within 1 s (it was at line "),
    "call": (
        "def f(prompts, completions, **kw):\n    n = 0\n    while True:\n        n += 1\n",
        "loop.py:f did not return within 1 s when called on the first row of the data (it was at line ",
    ),
}


@pytest.mark.parametrize("where", sorted(LOOPS))
def test_a_reward_file_that_loops_is_stopped_at_its_limit_and_named(tmp_path, where):
    body, said = LOOPS[where]
    (tmp_path / "loop.py").write_text(body)
    started = time.monotonic()
    problem = check_file(
        tmp_path / "loop.py", parse_reward(f"{tmp_path / 'loop.py'}:f"), placeholder_row(None)[:2] + (True,), limit_s=1
    )
    assert time.monotonic() - started < 10, "stopped at its limit, not waited on"
    assert problem.startswith(said), problem


@pytest.mark.parametrize(
    "body, said",
    [
        ("import sys\nsys.exit('bye')\n", "ends.py:f: importing the file raised SystemExit: bye (line 2)"),
        (
            "def f(prompts, completions, **kw):\n    raise SystemExit(3)\n",
            "ends.py:f: calling it on the first row of the data raised SystemExit: 3 (line 2)",
        ),
        (
            "import os\ndef f(prompts, completions, **kw):\n    os._exit(7)\n",
            "ends.py:f: calling it on the first row of the data ended the process (exit code 7); a reward file must return its scores",
        ),
    ],
    ids=["sys-exit-at-import", "system-exit-in-call", "os-exit-in-call"],
)
def test_a_reward_file_that_ends_its_process_is_one_line_and_validate_goes_on(tmp_path, body, said):
    path = write_spec(tmp_path, '"ends.py:f"')
    (tmp_path / "ends.py").write_text(body)
    line = one_issue(path)
    assert "environment.rewards.0" in line and said in line, line


@pytest.mark.parametrize(
    "ref, place",
    [
        ('"../outside.py:f"', "{out}/outside.py is outside {spec}, the spec's folder: a reward file is uploaded with the run"),
        ('"{out}/outside.py:f"', "{out}/outside.py is outside {spec}, the spec's folder"),
        ('"link.py:f"', "{spec}/link.py (a link to {out}/outside.py) is outside {spec}, the spec's folder"),
        ('"sub/../../outside.py:f"', "{out}/outside.py is outside {spec}, the spec's folder"),
    ],
    ids=["parent", "absolute", "link-out", "parent-through-a-subfolder"],
)
def test_a_reward_file_outside_the_specs_folder_is_refused(tmp_path, ref, place):
    spec_dir, out = tmp_path / "spec", tmp_path
    spec_dir.mkdir()
    (out / "outside.py").write_text("def f(prompts, completions, **kw):\n    return [0.0 for _ in completions]\n")
    (spec_dir / "link.py").symlink_to(out / "outside.py")
    line = one_issue(write_spec(spec_dir, ref.format(out=out)))
    assert "environment.rewards.0: outside.py:f: " in line or "environment.rewards.0: link.py:f: " in line, line
    assert place.format(out=out, spec=spec_dir) in line, line


def test_a_reward_file_inside_the_specs_folder_may_be_a_link_or_absolute(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "real.py").write_text("def f(prompts, completions, **kw):\n    return [0.0 for _ in completions]\n")
    (tmp_path / "link.py").symlink_to(tmp_path / "sub" / "real.py")
    spec = load_spec(write_spec(tmp_path, f'"link.py:f", "{tmp_path}/sub/real.py:f", "sub/../rewards.py:parity"'))
    assert spec.environment.rewards == [f"{tmp_path}/link.py:f", f"{tmp_path}/sub/real.py:f", f"{tmp_path}/rewards.py:parity"]


@pytest.mark.parametrize(
    "rewards, extra, said",
    [
        ('"env", "trl:think_format_reward"', "reward_weights = [1.0]", "1 weights for 2 rewards"),
        (
            '"trl:accuracy_reward"',
            'reward_args = { "trl:accuracy_reward" = { x = 1 } }',
            "trl:accuracy_reward takes no arguments",
        ),
        (
            '"trl:get_soft_overlong_punishment"',
            'reward_args = { "trl:get_soft_overlong_punishment" = { cache = 1 } }',
            "has no argument cache; it takes max_completion_len, soft_punish_cache",
        ),
        ('"env", "env"', "", "a reward is listed twice"),
        ('"env"', 'answer_format = "gsm8k"', "environment.answer_format: applies to prompt + answer datasets"),
        (
            '"trl:think_format_reward"',
            '[environment.judge]\nbase_url = "http://127.0.0.1:1/v1"\nmodel = "j"',
            'environment.judge: the judge scores as part of the environment\'s reward: list "env"',
        ),
    ],
)
def test_weights_arguments_and_answer_format_are_checked(tmp_path, rewards, extra, said):
    assert said in one_issue(write_spec(tmp_path, rewards, extra))


def test_rewards_are_for_grpo(tmp_path):
    assert "reward functions score GRPO completions" in one_issue(write_spec(tmp_path, '"env"', method="sft"))


def test_the_first_jsonl_row_is_what_the_function_is_called_on(tmp_path):
    data = tmp_path / "gsm.jsonl"
    data.write_text(json.dumps({"question": "How many?", "answer": GSM8K_ANSWER, "difficulty": 3}) + "\n")
    (tmp_path / "col.py").write_text(
        "def f(prompts, completions, difficulty, solution, **kw):\n"
        "    assert prompts[0][-1]['content'] == 'How many? Answer after ####.', prompts\n"
        "    assert solution == ['72'] and difficulty == [3], (solution, difficulty)\n"
        "    return [float(d) for d in difficulty]\n"
    )
    spec = write_spec(
        tmp_path,
        '"col.py:f"',
        'answer_format = "gsm8k"\nparams = { columns = { prompt = "question" }, '
        'prompt_template = "{prompt} Answer after ####.", eval_fraction = 0 }',
        env_id=f"jsonl:{data}",
    )
    load_spec(spec)  # the function's own asserts would fail validate


# -- shipping and the worker ------------------------------------------------------------------------
def test_the_file_ships_by_content_and_the_worker_imports_the_store_copy(tmp_path):
    spec = load_spec(write_spec(tmp_path, '"rewards.py:parity", "env"'))
    store = LocalStore(tmp_path / "store")
    shipped = ship_local_files(spec, store)
    ref = parse_reward(shipped.environment.rewards[0])
    assert ref.path.startswith("store:") and ref.path.endswith("/rewards.py") and ref.shown == "rewards.py:parity"
    assert shipped.environment.rewards[1] == "env"
    assert ship_local_files(spec, store).environment.rewards == shipped.environment.rewards  # once per content
    assert len(store.list_files("data")) == 1
    (tmp_path / "rewards.py").unlink()  # the laptop's copy is not what the worker reads
    named = named_rewards(shipped, DataFiles(store, tmp_path / "pod"))
    assert named[0].local_path.read_text() == REWARDS_PY and named[1].ref.kind == "env"
    fn = resolve(named[0])
    assert fn([[]], [[{"role": "assistant", "content": "I say 5"}]], answer=["3"]) == [1.0]


def call(reward, completions, answers, infos=None):
    prompts = [[{"role": "user", "content": "q"}]] * len(completions)
    msgs = [[{"role": "assistant", "content": c}] for c in completions]
    return reward(
        prompts,
        msgs,
        answer=answers,
        info=infos or ["{}"] * len(completions),
        example_index=list(range(len(completions))),
        completion_ids=[[1]] * len(completions),
        trainer_state=None,
    )


def test_the_worker_calls_with_the_rows_columns_and_logs_each_function(tmp_path):
    (tmp_path / "r.py").write_text(
        "def f(prompts, completions, answer, solution, level, **kw):\n"
        "    assert 'info' not in kw and 'example_index' not in kw\n"
        "    return [float(l) if s == '72' else None for s, l in zip(solution, level)]\n"
    )
    log = RewardLog()
    fn = resolve(NamedReward(parse_reward(f"{tmp_path / 'r.py'}:f"), 1.0, tmp_path / "r.py"))
    reward = NamedTRLReward("f", fn, "r.py:f", answer_format="gsm8k", on_error="fail", log=log)
    infos = [json.dumps({"level": 2}), json.dumps({"level": 5})]
    assert call(reward, ["a", "b"], [GSM8K_ANSWER, "#### 71"], infos) == [2.0, None]
    assert log.drain() == {"f": 2.0}  # None is left out of the mean


def test_a_raising_function_fails_the_run_or_scores_none_and_is_counted(tmp_path):
    (tmp_path / "r.py").write_text(
        "def f(prompts, completions, **kw):\n    return [1.0 if 'ok' in c[0]['content'] else 1 / 0 for c in completions]\n"
    )
    fn = resolve(NamedReward(parse_reward(f"{tmp_path / 'r.py'}:f"), 1.0, tmp_path / "r.py"))
    strict = NamedTRLReward("f", fn, "r.py:f", answer_format=None, on_error="fail", log=RewardLog())
    with pytest.raises(FatalWorkerError, match=r"reward r.py:f raised ZeroDivisionError: division by zero") as e:
        call(strict, ["ok", "bad"], ["1", "1"])
    assert isinstance(e.value.__cause__, ZeroDivisionError) and not e.value.retryable
    log = RewardLog()
    lenient = NamedTRLReward("f", fn, "r.py:f", answer_format=None, on_error="none", log=log)
    assert call(lenient, ["ok", "bad", "bad"], ["1"] * 3) == [1.0, None, None]
    assert log.drain_errors() == {"f": 2} and log.drain_errors() == {}


def test_steps_where_no_completion_scored_are_left_out_of_the_reward_summary():
    # TRL logs a step's reward as None when every completion scored None (on_reward_error = "none").
    none = [{"step": s, "reward": None, "loss": 0.0} for s in (1, 2, 3)]
    assert reward_summary(none) == {"reward_first": None, "reward_last": None, "reward_curve": []}
    some = [
        {"step": 1, "reward": None},
        {"step": 2, "reward": 0.5},
        {"step": 3, "reward": math.nan},
        {"step": 4, "reward": 1.0},
        {"step": 4, "train_runtime": 1.0},
    ]
    assert reward_summary(some) == {"reward_first": 0.5, "reward_last": 1.0, "reward_curve": [[2, 0.5], [4, 1.0]]}
    assert reward_summary([{"step": 1, "loss": 1.0}]) == {}  # no reward logged at all: nothing to say


def test_reward_set_replaces_the_environment_reward_and_env_keeps_it(tmp_path):
    from autoslm.envs.arith import ArithEnv

    (tmp_path / "r.py").write_text(REWARDS_PY)
    parity = NamedReward(parse_reward(f"{tmp_path / 'r.py'}:parity"), 0.5, tmp_path / "r.py")
    env = ArithEnv({}, seed=0)
    kw = dict(answer_format=None, on_error="fail")
    only = build_reward_set(env, thinking=False, named=prepare([parity], **kw))
    assert only.names == ["parity"] and only.weights == [0.5]
    both = build_reward_set(env, thinking=False, named=prepare([parity, NamedReward(parse_reward("env"), 2.0)], **kw))
    assert both.names == ["parity", "correct"] and both.weights == [0.5, 2.0]
    assert build_reward_set(env, thinking=False, named=prepare([], **kw)).names == ["correct"]
    with pytest.raises(FatalWorkerError, match="cannot take the keywords TRL passes"):
        prepare([NamedReward(parse_reward(f"{tmp_path / 'r.py'}:narrow"), 1.0, tmp_path / "r.py")], **kw)


# -- answer formats ---------------------------------------------------------------------------------
def test_gsm8k_answers_are_scored_strictly_as_verl_does():
    assert gsm8k_gold(GSM8K_ANSWER) == "72" and gsm8k_gold("#### 1,234") == "1234" and gsm8k_gold("no mark") is None
    assert gsm8k_extract("so 70+2 = 72\n#### 72") == "72"
    assert gsm8k_extract("#### 71 wait, no: #### 72") == "72"  # the last mark counts
    assert gsm8k_extract("the answer is 72") is None and gsm8k_extract("####72") is None  # strict: "#### " and a number
    assert format_reward(GSM8K_ANSWER, "48+24=72\n#### 72", "gsm8k") == 1.0
    assert format_reward(GSM8K_ANSWER, "48+24=72\n#### 72.0", "gsm8k") == 0.0  # verl compares the strings
    assert format_reward(GSM8K_ANSWER, "The answer is 72.", "gsm8k") == 0.0


def test_boxed_answers_compare_values():
    assert last_boxed(r"so \boxed{\frac{1}{2}} then \boxed{3}") == "3"
    assert last_boxed(r"\boxed{\frac{1}{\sqrt{2}}}") == r"\frac{1}{\sqrt{2}}"
    assert gold_answer(r"we get $\boxed{0.50}$", "boxed") == "0.50"
    assert format_reward(r"$\boxed{0.50}$", r"thus \boxed{0.5}", "boxed") == 1.0
    assert format_reward(r"$\boxed{x + 1}$", r"\boxed{x+1}", "boxed") == 1.0
    assert format_reward(r"$\boxed{2}$", "2", "boxed") == 0.0


def test_answer_format_and_prompt_template_reach_the_environment(tmp_path):
    from autoslm.envs.task_table import load_task

    data = tmp_path / "gsm.jsonl"
    data.write_text("".join(json.dumps({"question": f"Q{i}?", "answer": f"work\n#### {i}"}) + "\n" for i in range(4)))
    spec = load_spec(
        write_spec(
            tmp_path,
            '"env"',
            'answer_format = "gsm8k"\nparams = { columns = { prompt = "question" }, '
            'prompt_template = "{prompt} Think, then write the answer after ####.", eval_fraction = 0.5 }',
            env_id=f"jsonl:{data}",
        )
    )
    task = load_task(spec)
    env = task.env
    ex = env.train_examples()[1]
    assert ex.prompt[-1]["content"] == "Q1? Think, then write the answer after ####."
    assert env.eval_examples()[0].prompt[-1]["content"].startswith("Q2? Think")
    assert env.reward(ex, "work\n#### 1") == 1.0 and env.reward(ex, "1") == 0.0  # strict, for reward and eval alike
    assert isinstance(env, JsonlEnv) and [n.ref.kind for n in task.rewards] == ["env"] and task.answer_format == "gsm8k"
    assert not hasattr(env, "named_rewards")  # the task is loaded whole: nothing is attached to its environment
    with pytest.raises(SpecError, match=r"must contain \{prompt\}"):
        load_spec(write_spec(tmp_path, '"env"', 'params = { prompt_template = "no slot" }', env_id=f"jsonl:{data}"))


# -- TRL's rewards by name --------------------------------------------------------------------------
def test_trl_accuracy_reward_scores_a_gsm8k_row_as_math_verify_does():
    pytest.importorskip("trl")
    math_verify = pytest.importorskip("math_verify")
    from latex2sympy2_extended import NormalizationConfig

    fn = resolve(NamedReward(parse_reward("trl:accuracy_reward"), 1.0))
    reward = NamedTRLReward("accuracy_reward", fn, "trl:accuracy_reward", answer_format="gsm8k", on_error="fail", log=RewardLog())
    right, wrong = r"48/2 = 24 in May, 48 + 24 = 72 in all, so \boxed{72}.", r"48 + 48 = 96, so \boxed{96}."
    got = call(reward, [right, wrong], [GSM8K_ANSWER] * 2)
    assert got == [1.0, 0.0]
    # The same verdict from math-verify itself, with the extraction TRL's accuracy_reward configures.
    extract = [
        math_verify.LatexExtractionConfig(
            normalization_config=NormalizationConfig(units=True), boxed_match_priority=0, try_extract_without_anchor=False
        )
    ]
    gold = math_verify.parse(gold_answer(GSM8K_ANSWER, "gsm8k"))
    assert [
        float(math_verify.verify(gold, math_verify.parse(c, extraction_config=extract, extraction_mode="first_match")))
        for c in (right, wrong)
    ] == got


def test_trl_factories_get_their_lengths_from_the_spec(tmp_path):
    pytest.importorskip("trl")
    spec = load_spec(
        write_spec(
            tmp_path,
            '"trl:get_soft_overlong_punishment", "trl:think_format_reward"',
            'reward_args = { "trl:get_soft_overlong_punishment" = { soft_punish_cache = 2 } }',
        )
    )
    named = named_rewards(spec)
    assert named[0].args == {"max_completion_len": 8, "soft_punish_cache": 2} and named[1].args is None
    punish = resolve(named[0])
    assert punish(completion_ids=[[1] * 6, [1] * 7, [1] * 9]) == [0.0, -0.5, -1.0]
    rows = [example_to_row(Example(prompt=[{"role": "user", "content": "q"}], answer="1"), 0)]
    assert rows[0]["answer"] == "1"


def test_the_readme_example_validates_and_scores(tmp_path):
    """README's "Your own reward" file, as written, on a GSM8K-shaped local file."""
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("### Your own reward") :]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    assert len(code.strip().splitlines()) <= 12
    (tmp_path / "readme_rewards.py").write_text(code)
    data = tmp_path / "gsm.jsonl"
    data.write_text(json.dumps({"question": "How many?", "answer": GSM8K_ANSWER}) + "\n")
    spec = write_spec(
        tmp_path,
        '"readme_rewards.py:correct", "trl:think_format_reward", "env"',
        'reward_weights = [1.0, 0.2, 1.0]\nanswer_format = "gsm8k"\n'
        'params = { columns = { prompt = "question" }, eval_fraction = 0 }',
        env_id=f"jsonl:{data}",
    )
    named = named_rewards(load_spec(spec))
    reward = NamedTRLReward(
        "correct", resolve(named[0]), "readme_rewards.py:correct", answer_format="gsm8k", on_error="fail", log=RewardLog()
    )
    assert call(reward, ["so 72", "so 71"], [GSM8K_ANSWER] * 2) == [1.0, 0.0]


def test_a_dict_spec_refuses_a_reward_file_outside_the_folder_it_is_launched_from(tmp_path):
    """``autoslm.launch({...})`` has no spec file: its folder is the working directory, checked as a file's."""
    import os
    import subprocess
    import sys

    here, out = tmp_path / "notebook", tmp_path
    here.mkdir()
    body = "def f(prompts, completions, **kw):\n    return [0.0 for _ in completions]\n"
    (out / "outside.py").write_text(body)
    (here / "inside.py").write_text(body)
    code = (
        "import sys\nfrom autoslm.errors import SpecError\nfrom autoslm.sdk import Client\n"
        "spec = {'name': 'rw', 'model': 'autoslm/tiny', 'environment': {'id': 'autoslm/arith', 'rewards': [sys.argv[1]]},\n"
        "        'train': {'method': 'grpo', 'max_steps': 2, 'prompts_per_step': 2, 'group_size': 2, 'max_completion_tokens': 8, 'max_length': 64}}\n"
        "try:\n    Client(sys.argv[2]).prepare(spec)\nexcept SpecError as e:\n    sys.exit(str(e))\nprint('prepared')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}

    def prepare(ref: str):
        return subprocess.run(
            [sys.executable, "-c", code, ref, str(tmp_path / "home")],
            cwd=here,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    for ref in ("../outside.py:f", f"{out}/outside.py:f"):
        r = prepare(ref)
        assert r.returncode == 1 and "environment.rewards.0" in r.stderr and f"{out}/outside.py is outside {here}" in r.stderr, (
            r.stderr
        )
    r = prepare("inside.py:f")
    assert r.returncode == 0 and "prepared" in r.stdout, r.stdout + r.stderr


def test_a_task_is_loaded_as_one_object_and_nothing_is_attached_to_its_environment(tmp_path):
    """``load_task`` builds every kind of task through its loader, and each environment comes out of its
    constructor as it is used: its attributes are those the constructor set, none added afterwards."""
    from autoslm.envs.task_table import EXACT_LOADERS, PREFIX_LOADERS, load_task

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Q{i}?", "answer": f"#### {i}"}) + "\n" for i in range(4)))
    rewards_only = load_spec(
        write_spec(tmp_path, '"trl:accuracy_reward"', "params = { eval_fraction = 0.5 }", env_id=f"jsonl:{data}")
    )
    task = load_task(rewards_only)
    assert [n.ref.kind for n in task.rewards] == ["trl"] and task.judge is None
    assert task.env.scored_by_rewards and task.env.answer_format is None
    built = type(task.env)(
        str(data), dict(rewards_only.environment.params), scored_by_rewards=True
    )  # the constructor alone gives the same object
    assert vars(built).keys() == vars(task.env).keys()
    assert set(PREFIX_LOADERS) == {"jsonl:", "hf:"} and "autoslm/arith" in EXACT_LOADERS
