"""[eval] lm_eval without running a model: the arguments lm-eval's vllm and hf models get (read back by
lm-eval's own parser and checked against its VLLM class's parameters, no GPU needed), the bad-input
lines, the time `plan` counts, the rows status, the report and the model card show, the block as the
worker builds it after the hand-back, and the clean environment its harness process gets.

    .venv/bin/python -m pytest -q tests/unit/test_lm_eval.py      # a few seconds
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
import yaml

from autoslm.catalog import estimate_run
from autoslm.engine.harness import model_args
from autoslm.engine.pod.lm_eval_phase import build_request, harness_env, running_block
from autoslm.recipes.harness import (
    args_string,
    cut_words,
    metric_lines,
    metric_rows,
    model_index,
    with_failure,
    with_scores,
)
from autoslm.spec import load_spec
from autoslm.views.lm_eval import merged
from tests.conftest import edited_spec

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO / "jobspecs" / "qwen2.5-0.5b-gsm8k-grpo-gpu.toml"
GSM8K_15B = REPO / "jobspecs" / "qwen2.5-1.5b-gsm8k-grpo-gpu.toml"
HAS_LM_EVAL = importlib.util.find_spec("lm_eval") is not None
needs_lm_eval = pytest.mark.skipif(not HAS_LM_EVAL, reason="lm-eval (the worker extra) is not installed in this stack")

BLOCK = {
    "version": "0.4.13",
    "backend": "vllm",
    "seconds": 412.5,
    "models": {
        "base": {
            "gsm8k": {
                "version": 3.0,
                "shots": 5,
                "samples": 1319,
                "metrics": {"exact_match,strict-match": 0.31, "exact_match,flexible-extract": 0.34},
            }
        },
        "adapter": {
            "gsm8k": {
                "version": 3.0,
                "shots": 5,
                "samples": 1319,
                "metrics": {"exact_match,strict-match": 0.35, "exact_match,flexible-extract": 0.36},
            }
        },
    },
}


def _vllm_params() -> set[str]:
    """The named parameters of lm-eval's VLLM model, read from its source (importing it needs vllm)."""
    path = Path(importlib.util.find_spec("lm_eval").submodule_search_locations[0]) / "models" / "vllm_causallms.py"
    cls = next(n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef) and n.name == "VLLM")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    return {a.arg for a in init.args.args + init.args.kwonlyargs}


@needs_lm_eval
def test_the_gpu_paths_arguments_avoid_lm_evals_three_traps():
    from lm_eval.utils import simple_parse_args_string

    spec = load_spec(GSM8K)
    assert spec.eval.lm_eval == ["gsm8k"] and spec.train.lora_rank == 32
    req = build_request(spec, "Qwen/Qwen2.5-0.5B-Instruct", "/pod/adapter", ["gsm8k"], "vllm")
    args = simple_parse_args_string(args_string(model_args(req, "/pod/adapter")))  # as lm-eval's CLI reads them
    assert args["max_lora_rank"] == 32  # lm-eval's 16 refuses a rank-32 adapter
    assert args["max_gen_toks"] == 1024  # lm-eval's 256 cuts the completions GRPO trained to 1024 tokens
    assert args["enable_thinking"] is False and "think_end_token" not in args
    assert args["lora_local_path"] == "/pod/adapter" and args["max_model_len"] >= 1024 + 2048
    assert {
        "pretrained",
        "lora_local_path",
        "max_lora_rank",
        "max_gen_toks",
        "enable_thinking",
        "max_model_len",
    } <= _vllm_params()
    from autoslm.engine.pod.lm_eval_phase import vllm_share

    assert args["gpu_memory_utilization"] == 0.85  # the default; on the pod, what the trainer left free:
    assert vllm_share(0.97) == 0.9 and vllm_share(0.6) == 0.55 and vllm_share(0.02) == 0.05
    base = simple_parse_args_string(args_string(model_args(req, None)))
    assert "lora_local_path" not in base and "max_lora_rank" not in base and base["max_gen_toks"] == 1024


@needs_lm_eval
def test_thinking_and_the_rank_follow_the_spec(tmp_path):
    from lm_eval.utils import simple_parse_args_string

    path = edited_spec(
        GSM8K,
        [
            ("\nthinking = false", "\nthinking = true"),
            ("\nlora_rank = 32", "\nlora_rank = 64"),
            ("\nmax_completion_tokens = 1024", "\nmax_completion_tokens = 2048"),
            ("\nmax_length = 1536", "\nmax_length = 2560"),
        ],
        tmp_path / "think.toml",
    )
    req = build_request(load_spec(path), "m", "/a", ["gsm8k"], "vllm")
    args = simple_parse_args_string(args_string(model_args(req, "/a")))
    assert args["enable_thinking"] is True and args["think_end_token"] == "</think>"
    assert args["max_lora_rank"] == 64 and args["max_gen_toks"] == 2048
    hf = model_args({**req, "backend": "hf"}, "/a")  # transformers: the adapter through peft=
    assert hf["peft"] == "/a" and hf["enable_thinking"] is True and "max_gen_toks" not in hf


def test_a_rank_vllm_does_not_take_is_rounded_up_and_one_above_512_is_refused(cli, tmp_path):
    from autoslm.recipes.generation import vllm_lora_rank

    ranks = (1, 2, 8, 9, 16, 24, 32, 48, 100, 256, 300, 320, 321, 512)
    assert [vllm_lora_rank(r) for r in ranks] == [1, 8, 8, 16, 16, 32, 32, 64, 128, 256, 320, 320, 512, 512]
    with pytest.raises(ValueError, match="above 512"):
        vllm_lora_rank(513)
    # Rank 24 (vLLM 0.31 takes 1, 8, 16, 32, ...): validate passes, and the harness's vllm model gets 32.
    path = edited_spec(GSM8K, [("\nlora_rank = 32", "\nlora_rank = 24")], tmp_path / "r24.toml")
    r = cli("validate", str(path))
    assert r.code == 0, r.out + r.err
    req = build_request(load_spec(path), "Qwen/Qwen2.5-0.5B-Instruct", "/pod/adapter", ["gsm8k"], "vllm")
    assert req["lora_rank"] == 24 and model_args(req, "/pod/adapter")["max_lora_rank"] == 32
    # Above 512 on a GPU pod with lm_eval: one line, exit 2, before anything is rented.
    big = edited_spec(GSM8K, [("\nlora_rank = 32", "\nlora_rank = 1024")], tmp_path / "r1024.toml")
    r = cli("validate", str(big))
    lines = [x for x in r.err.strip().splitlines() if x.strip()]
    assert r.code == 2 and len(lines) == 1 and "train.lora_rank" in lines[0] and "above 512" in lines[0], r.err
    assert "Traceback" not in r.err
    # Without lm_eval nothing vLLM loads the adapter on the pod: the rank is the run's to choose.
    plain = edited_spec(big, [('\nlm_eval = ["gsm8k"]', "")], tmp_path / "plain.toml")
    assert load_spec(plain).train.lora_rank == 1024


def test_a_missing_task_file_is_one_line_before_anything_runs(cli, tmp_path):
    path = edited_spec(GSM8K, [('\nlm_eval = ["gsm8k"]', '\nlm_eval = ["gsm8k", "mine.yaml"]')], tmp_path / "s.toml")
    r = cli("validate", str(path))
    assert r.code == 2, r.out + r.err
    lines = [x for x in r.err.strip().splitlines() if x.strip()]
    assert any("eval.lm_eval.1" in x and "mine.yaml does not exist" in x for x in lines), r.err
    assert "Traceback" not in r.err
    r = cli("plan", str(path))
    assert r.code == 2 and "mine.yaml does not exist" in r.err


def test_a_task_reading_local_data_is_refused_for_a_rented_pod(tmp_path):
    from autoslm.errors import SpecError

    (tmp_path / "mine.yaml").write_text(
        "task: mine\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: rows.jsonl\n"
        "process_docs: !function utils.process\noutput_type: generate_until\n"
    )
    rented = edited_spec(GSM8K, [('\nlm_eval = ["gsm8k"]', '\nlm_eval = ["mine.yaml"]')], tmp_path / "rented.toml")
    with pytest.raises(SpecError) as e:
        load_spec(rented)
    [issue] = [i for i in e.value.issues if i.field.startswith("eval.lm_eval")]
    assert (
        issue.field == "eval.lm_eval.0"
        and "reads the local file rows.jsonl, which a runpod/vast pod cannot reach" in issue.message
    )
    local = tmp_path / "local.toml"  # here the file must exist
    local.write_text('name = "l"\nmodel = "autoslm/tiny"\n[environment]\nid = "autoslm/arith"\n[eval]\nlm_eval = ["mine.yaml"]\n')
    with pytest.raises(SpecError) as e:
        load_spec(local)
    assert [i.message for i in e.value.issues] == ["task file mine.yaml reads rows.jsonl, which does not exist"]
    (tmp_path / "rows.jsonl").write_text('{"a": 1}\n')
    assert load_spec(local).eval.lm_eval == [str(tmp_path / "mine.yaml")]


@needs_lm_eval
def test_an_unknown_task_is_one_line(cli, tmp_path):
    path = edited_spec(GSM8K, [('\nlm_eval = ["gsm8k"]', '\nlm_eval = ["gsm8kk"]')], tmp_path / "s.toml")
    r = cli("validate", str(path))
    assert r.code == 2 and "eval.lm_eval.0" in r.err and "'gsm8kk' is not a task of lm-eval" in r.err, r.err
    r = cli("eval", "nosuchrun", "--lm-eval", str(tmp_path / "absent.yaml"))
    assert r.code == 2 and "absent.yaml does not exist" in r.err and "Traceback" not in r.err, r.err
    assert len([x for x in r.err.splitlines() if x.strip()]) <= 2  # the line, and its hint


# make test-long's: a property of the pinned release (checked when the pin or the scan changes; make
# test keeps the scan's own test below), for 10-20 CPU-seconds of lm-eval building its index.
@pytest.mark.long
@needs_lm_eval
def test_the_pinned_lm_evals_text_declares_every_name_of_its_index():
    """Why validate refuses a name the text scan lacks without building lm-eval's index (10-20 CPU-seconds):
    for the pinned release, the scan holds every task, group and tag the index has."""
    from importlib.metadata import version

    from lm_eval.tasks import TaskManager

    from autoslm.envs.lm_tasks import known_tasks, lm_eval_root
    from autoslm.recipes.harness import LM_EVAL_VERSION

    if version("lm_eval") != LM_EVAL_VERSION:
        pytest.skip(f"lm-eval {version('lm_eval')} is not the pinned {LM_EVAL_VERSION}: validate asks its index")
    index = set(TaskManager().all_tasks)
    assert len(index) > 10_000
    missing = index - known_tasks(lm_eval_root())
    assert not missing, sorted(missing)


def test_task_names_are_read_from_the_task_files(tmp_path):
    from autoslm.envs.lm_tasks import known_tasks, task_issues

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.yaml").write_text('"task": "quoted_one"\ntag:\n  - "tagged"\n')
    (tmp_path / "a" / "g.yaml").write_text("group: my_group\ntask:\n  - task: nested_one\n")
    (tmp_path / "a" / "_base_yaml").write_text("tag:\n  - included_tag\n")  # an include file: its tags count
    assert {"quoted_one", "tagged", "my_group", "nested_one", "included_tag"} <= known_tasks(tmp_path)
    assert task_issues(["quoted_one", "nested_one"], root=tmp_path) == []
    [(field, message)] = task_issues(["quoted_one", "nope"], root=tmp_path)
    assert field == "eval.lm_eval.1" and "'nope' is not a task of lm-eval" in message


def test_plan_counts_the_harness_time():
    spec = load_spec(GSM8K)
    without = spec.eval.model_copy(update={"lm_eval": []})
    kw = dict(max_hours=spec.limits.max_hours, has_vllm=True)
    a = estimate_run(spec.model, "L40S", spec.train, 0.86, ev=spec.eval, **kw)
    b = estimate_run(spec.model, "L40S", spec.train, 0.86, ev=without, **kw)
    assert 120 < a.lm_eval_s < 3600 and b.lm_eval_s == 0
    assert a.hours == pytest.approx(b.hours + a.lm_eval_s / 3600)
    assert "lm-eval ~" in a.basis and "lm-eval" not in b.basis
    from autoslm.catalog.spec_checks import recipe_summary

    assert "after training, lm-eval gsm8k on the base and the adapter" in recipe_summary(spec)
    # Twice the samples of a task cost more; the 1.5B model more than the 0.5B.
    more = estimate_run(
        spec.model, "L40S", spec.train, 0.86, ev=spec.eval.model_copy(update={"lm_eval": ["gsm8k", "gsm8k_cot"]}), **kw
    )
    assert more.lm_eval_s > a.lm_eval_s
    big = load_spec(GSM8K_15B)
    assert big.eval.lm_eval == ["gsm8k"]
    assert estimate_run(big.model, "L40S", big.train, 0.86, ev=big.eval, **kw).lm_eval_s > a.lm_eval_s


def test_the_rows_name_each_protocol_and_the_model_index_is_yaml():
    rows = metric_rows(BLOCK)
    assert [(r["metric"], r["base"], r["adapter"]) for r in rows] == [
        ("exact_match,flexible-extract", 0.34, 0.36),
        ("exact_match,strict-match", 0.31, 0.35),
    ]
    lines = metric_lines(BLOCK)
    assert lines[1] == "lm-eval gsm8k exact_match,strict-match: 0.310 -> 0.350 (lm-eval 0.4.13, gsm8k v3.0, 5-shot, 1319 samples)"
    card = yaml.safe_load(model_index(BLOCK, "my-adapter"))
    result = card["model-index"][0]["results"][0]
    assert card["model-index"][0]["name"] == "my-adapter" and result["dataset"]["name"] == "gsm8k"
    assert {m["value"] for m in result["metrics"]} == {0.35, 0.36}
    assert "base 0.3100" in next(m["name"] for m in result["metrics"] if m["value"] == 0.35)
    assert model_index(None, "x") == "" and metric_lines({"error": "lm-eval exited with 1: boom"}) == [
        "lm-eval: lm-eval exited with 1: boom"
    ]


def test_a_later_task_joins_the_earlier_ones():
    later = {
        "version": "0.4.13",
        "tasks": ["t2"],
        "seconds": 3.0,
        "models": {"base": {"t2": {"metrics": {"m": 0.1}}}, "adapter": {"t2": {"metrics": {"m": 0.2}}}},
    }
    out = merged(BLOCK, later)
    assert set(out["models"]["adapter"]) == {"gsm8k", "t2"} and out["models"]["base"]["gsm8k"]["samples"] == 1319
    assert merged({"version": "0.4.12", "models": {}}, later) is later  # another lm-eval's scores are not mixed in


def test_the_block_is_built_one_model_at_a_time_and_says_what_a_limit_cut():
    """After the hand-back: "running" until the harness ends; each model's scores joined as its process
    ends; a failed model beside the other's scores; a cut naming the limit and what it left unscored."""
    spec = load_spec(GSM8K)
    block = running_block(spec)
    [said] = metric_lines(block)
    assert said == ("lm-eval: not finished: it runs after the hand-back on gsm8k; its scores join these metrics when it ends")
    part = {**BLOCK, "models": {"base": BLOCK["models"]["base"]}, "model_seconds": {"base": 200.0}}
    block = with_scores(block, "base", part)
    assert block["models"] == {"base": BLOCK["models"]["base"]} and block["model_seconds"] == {"base": 200.0}
    words = cut_words("the time limit (limits.max_hours)", ["adapter"])
    assert words == "the time limit (limits.max_hours) cut lm-eval before it scored the adapter; the base's scores are kept"
    cut = {k: v for k, v in block.items() if k != "state"} | {"cut": {"by": "max_hours", "models": ["adapter"], "words": words}}
    lines = metric_lines(cut)
    assert lines[0].startswith("lm-eval gsm8k exact_match,flexible-extract: 0.340 -> -")
    assert lines[-1] == f"lm-eval: {words}"
    failed = with_failure(with_scores(running_block(spec), "adapter", BLOCK), "base", "lm-eval exited with 1: CUDA OOM")
    assert failed["models"]["adapter"] and failed["errors"] == {"base": "lm-eval exited with 1: CUDA OOM"}
    assert metric_lines(failed)[-1] == "lm-eval: base: lm-eval exited with 1: CUDA OOM"
    assert cut_words("the pod's stop (SIGTERM)", ["base", "adapter"]) == (
        "the pod's stop (SIGTERM) cut lm-eval before it scored the base and the adapter"
    )
    # `autoslm eval` later: what the pod's block said of itself is not said of the merge.
    later = {**BLOCK, "tasks": ["gsm8k"]}
    assert "cut" not in merged(cut, later) and "state" not in merged(running_block(spec) | {"version": "0.4.13"}, later)


def test_the_harness_gets_no_training_ranks_environment():
    """A rank's variables (torch's elastic agent, accelerate, FSDP, TRL's colocated vLLM) would make
    lm-eval's hf model wait for ranks that never come: none reaches the harness; the rest does."""
    rank = {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "0",
        "ROLE_RANK": "0",
        "ROLE_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "r",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_ERROR_FILE": "/tmp/e.json",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "60",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "ACCELERATE_USE_FSDP": "true",
        "FSDP_CPU_RAM_EFFICIENT_LOADING": "true",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "NODE_RANK": "0",
    }
    kept = {"PATH": "/usr/bin", "HF_HOME": "/h", "AUTOSLM_RUN_ID": "r", "CUDA_VISIBLE_DEVICES": "0,1", "HF_TOKEN": "x"}
    assert harness_env({**rank, **kept}) == kept


def test_the_early_stop_reserves_the_harness_by_the_pods_gpu():
    """On a GPU the catalog knows, the worker prices the harness as `plan` does (its two engines' start
    included); on a CPU, or without lm_eval, there is nothing to reserve."""
    from autoslm.catalog import gpu_info
    from autoslm.catalog.cost import lm_eval_seconds
    from autoslm.engine.pod.lm_eval_phase import harness_seconds
    from autoslm.engine.train.recipe import Device
    from autoslm.recipes.harness import ENGINE_START_S

    spec = load_spec(GSM8K)
    pod = Device.assumed("cuda", "L40S")
    seconds = harness_seconds(spec, pod)
    assert seconds == lm_eval_seconds(spec.model, gpu_info("L40S"), spec.train, spec.eval, has_vllm=True) > 2 * ENGINE_START_S
    assert harness_seconds(spec, Device.assumed("cpu")) is None and harness_seconds(spec, None) is None
    assert harness_seconds(spec.model_copy(update={"eval": spec.eval.model_copy(update={"lm_eval": []})}), pod) is None
