"""[eval] lm_eval end to end on this CPU: a short GRPO run of the built-in model, handed back (adapter,
metrics, DONE) before the real lm-evaluation-harness scores the base and the adapter, each in a process
of its own, with a task YAML of our own over local JSONL data (no download: a generate_until task, a
regex filter, a few samples, a few tokens). The scores land in metrics.json, `status` and the report,
each named by its protocol, and `autoslm eval` adds another task. A time limit that falls while the
harness runs cuts it: the run keeps its own hand-back and the base's scores, and `status` says what the
limit cut. A 2-process run's harness gets no rank's environment, and ends.

    PYTHONPATH=$PWD .venv-image/bin/python -m pytest -q tests/e2e/test_lm_eval_local.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, edited_spec
from tests.e2e.test_sft_local import run_id_from, wait_for
from tests.fakes.hub import FAKE_HUB_TOKEN, FakeHub

pytestmark = [pytest.mark.e2e, pytest.mark.worker]  # worker: run on the image's pins (make test: only there)
pytest.importorskip("lm_eval")  # the worker extra pins it: every stack `make setup-all` builds has it

TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "What is {{{{a}}}} + {{{{b}}}}?"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  do_sample: false
  max_gen_toks: 6
filter_list:
  - name: "strict-match"
    filter:
      - function: regex
        regex_pattern: "(-?[0-9]+)"
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 2.0
"""


def task_files(folder: Path, name: str, doc_to_text: str | None = None) -> Path:
    data = folder / f"{name}.jsonl"
    data.write_text(
        "".join(json.dumps({"a": a, "b": b, "answer": str(a + b)}) + "\n" for a, b in [(1, 2), (3, 4), (2, 2), (5, 1)])
    )
    path = folder / f"{name}.yaml"
    text = TASK.format(name=name, data=data)
    if doc_to_text is not None:
        text = text.replace('doc_to_text: "What is {{a}} + {{b}}?"', f"doc_to_text: {doc_to_text}")
    path.write_text(text)
    return path


def harness_ended(st: dict) -> bool:
    """The harness after the hand-back has written its last block (metrics.json's lm_eval no longer
    says "running"), and the run's pod is gone."""
    block = ((st.get("metrics") or {}).get("seed0") or {}).get("lm_eval") or {}
    return block.get("state") != "running" and st["pod_id"] is None


def kinds_in_order(store: Path, run_id: str) -> list[str]:
    events = next(store.glob(f"*/{run_id}/seed0/events.jsonl")).read_text().splitlines()
    return [json.loads(line)["kind"] for line in events]


def test_lm_eval_scores_base_and_adapter_beside_the_runs_own(cli, tmp_path, home):
    task_files(tmp_path, "tiny_sum")
    spec = tmp_path / "lm.toml"
    spec.write_text(f"""# autoslm launch {spec}
name = "lm"
model = "autoslm/tiny"
[environment]
id = "autoslm/arith"
params = {{ n_train = 64, n_eval = 4, max_operand = 9 }}
[train]
method = "grpo"
max_steps = 2
prompts_per_step = 2
group_size = 2
max_completion_tokens = 8
max_length = 64
eval_samples = 4
lora_rank = 32
[eval]
samples = 0
lm_eval = ["tiny_sum.yaml"]
lm_eval_limit = 3
[artifacts]
path = "{tmp_path / "store"}"
""")
    r = cli("launch", str(spec))
    assert r.code == 0, r.out + r.err
    run_id = run_id_from(r.out + r.err)
    wait_for(cli, run_id, harness_ended)
    # Handed back first: the adapter, metrics and DONE ("done") before the harness started.
    kinds = kinds_in_order(tmp_path / "store", run_id)
    assert kinds.index("done") < kinds.index("lm_eval_started") < kinds.index("lm_eval"), kinds
    metrics = json.loads(next((tmp_path / "store").glob(f"*/{run_id}/seed0/metrics.json")).read_text())
    block = metrics["lm_eval"]
    assert block["version"] == "0.4.13" and block["backend"] == "hf" and "error" not in block, block
    assert "max_lora_rank" not in block["model_args"] and "enable_thinking=False" in block["model_args"]
    assert set(block["model_seconds"]) == {"base", "adapter"} and "cut" not in block and "state" not in block
    for model in ("base", "adapter"):
        task = block["models"][model]["tiny_sum"]
        assert task["version"] == 2.0 and task["shots"] == 0 and task["samples"] == 3, task
        assert 0.0 <= task["metrics"]["exact_match,strict-match"] <= 1.0
    assert metrics["lm_eval_time_s"] > 0 and metrics["train_time_s"] > 0

    r = cli("status", run_id)
    assert r.code == 0, r.err
    assert "s lm-eval" in r.out and "s training" in r.out
    line = next(x for x in r.out.splitlines() if "lm-eval tiny_sum exact_match,strict-match" in x)
    assert " -> " in line and "lm-eval 0.4.13, tiny_sum v2.0, 0-shot, 3 samples" in line, line
    st = json.loads(cli("status", run_id, "--json").out)
    assert st["metrics"]["seed0"]["lm_eval"]["models"]["adapter"]["tiny_sum"]["metrics"]

    out = tmp_path / "report.html"
    assert cli("report", run_id, "--out", str(out)).code == 0
    html = out.read_text()
    assert "lm-evaluation-harness (base -&gt; adapter)" in html or "lm-evaluation-harness (base -> adapter)" in html
    assert "protocol: the training prompt" in html and "lm-eval 0.4.13, tiny_sum v2.0" in html

    # The model card's model-index carries the adapter's scores, the base's beside them.
    with FakeHub(token=FAKE_HUB_TOKEN) as hub:
        r = cli("push", run_id, "--to", "alice/lm", env=hub.env())
        assert r.code == 0, r.out + r.err
        card = hub.files("alice/lm", "model")["README.md"].decode()
    meta = yaml.safe_load(card.split("---\n")[1])
    [result] = meta["model-index"][0]["results"]
    assert result["dataset"]["name"] == "tiny_sum" and result["source"]["name"] == "lm-eval 0.4.13"
    [metric] = result["metrics"]
    assert metric["type"] == "exact_match" and "0-shot, 3 samples" in metric["name"] and "base " in metric["name"]
    assert metric["value"] == block["models"]["adapter"]["tiny_sum"]["metrics"]["exact_match,strict-match"]
    assert "- lm-eval tiny_sum exact_match,strict-match:" in card

    # On this machine: another task, scored with the run's adapter, joins the first in metrics.json.
    task_files(tmp_path, "tiny_more")
    r = cli("eval", run_id, "--lm-eval", str(tmp_path / "tiny_more.yaml"), "--limit", "2")
    assert r.code == 0, r.out + r.err
    assert "lm-eval tiny_more exact_match,strict-match" in r.out
    metrics = json.loads(next((tmp_path / "store").glob(f"*/{run_id}/seed0/metrics.json")).read_text())
    assert set(metrics["lm_eval"]["models"]["adapter"]) == {"tiny_sum", "tiny_more"}
    assert metrics["lm_eval"]["models"]["base"]["tiny_more"]["samples"] == 2


# A task function (lm-eval's `!function`) that holds the adapter's scoring (lm-eval's hf model imports
# peft only to load an adapter) until RELEASE exists, and lets the base's through: a harness that is
# still running when the run's time limit falls, whatever the speed of this machine.
GATE = """import sys
import time
from pathlib import Path

RELEASE = Path(__file__).parent / "RELEASE"


def doc_to_text(doc):
    until = time.monotonic() + 900
    while "peft" in sys.modules and not RELEASE.exists() and time.monotonic() < until:
        time.sleep(0.5)
    return f"What is {doc['a']} + {doc['b']}?"
"""
CUT_HOURS = 0.05  # 180 s from the launch: the quickstart's 30 steps and the base's scores fit well before


def test_a_time_limit_during_lm_eval_cuts_it_and_the_run_keeps_its_own_hand_back(cli, tmp_path, home):
    gate = tmp_path / "gate" / "gate.py"
    gate.parent.mkdir()
    gate.write_text(GATE)
    task = task_files(tmp_path, "gated_sum", doc_to_text=f"!function {gate.with_suffix('')}.doc_to_text")
    edits = (
        ('name = "quickstart"', 'name = "cut"'),
        ("max_steps = 150", "max_steps = 30"),
        ("[compute]", f'[eval]\nlm_eval = ["{task}"]\nlm_eval_limit = 2\n\n[compute]'),
        ("max_hours = 1", f"max_hours = {CUT_HOURS}"),
    )
    spec = edited_spec(REPO / "jobspecs/quickstart.toml", edits, tmp_path / "cut.toml")
    try:
        r = cli("launch", str(spec))
        assert r.code == 0, r.out + r.err
        run_id = run_id_from(r.out)
        st = wait_for(cli, run_id, harness_ended, timeout=600)
    finally:
        (gate.parent / "RELEASE").touch()  # whatever happened, no harness waits on the gate
    # The run ended with the worker's own hand-back: the adapter it trained, its final loss and the
    # evaluation after training (not the controller's hand-back of a checkpoint at the limit).
    assert st["state"] == "succeeded" and st["end_reason"] == "succeeded" and st["step"] == 30, st
    m = st["metrics"]["seed0"]
    assert isinstance(m["final_loss"], float) and m["eval"]["after"]["n"] > 0 and m["eval"]["after_step"] == 30, m
    assert "limit" not in m and (Path(st["adapter"]) / "adapter_model.safetensors").is_file(), st
    # The limit cut the harness: the base's scores are kept, the adapter's process was stopped.
    block = m["lm_eval"]
    assert block["cut"]["by"] == "max_hours" and block["cut"]["models"] == ["adapter"], block
    assert block["models"]["base"]["gated_sum"]["samples"] == 2 and "adapter" not in block["models"], block
    said = cli("status", run_id).out
    assert (
        "lm-eval: the time limit (limits.max_hours) cut lm-eval before it scored the adapter; the base's scores are kept" in said
    ), said
    assert "lm-eval gated_sum exact_match,strict-match:" in said and " -> -" in said, said
    chat = cli("chat", run_id, "--prompt", "What is 3 + 4? Answer with the number only.", "--max-new-tokens", "8")
    assert chat.code == 0 and chat.out.strip(), chat.out + chat.err


TWO_PROCESSES = """# autoslm launch {path}
name = "two"
model = "autoslm/tiny"
[environment]
id = "autoslm/arith"
params = {{ n_train = 256, n_eval = 4 }}
[train]
max_steps = 4
batch_size = 8
micro_batch_size = 4
max_length = 64
lora_rank = 8
lora_alpha = 16
eval_samples = 4
[eval]
lm_eval = ["{task}"]
lm_eval_limit = 2
[compute]
gpu_count = 2
[artifacts]
path = "{store}"
[limits]
max_hours = 0.15
"""


def test_a_two_process_runs_harness_gets_no_ranks_environment_and_ends(cli, tmp_path, home):
    """Rank 0 of 2 runs the harness; with the ranks' RANK/WORLD_SIZE/MASTER_* it would build an
    accelerator waiting for a rank 1 that never comes, until the run's limit cut it."""
    task = task_files(tmp_path, "tiny_sum")
    spec = tmp_path / "two.toml"
    spec.write_text(TWO_PROCESSES.format(path=spec, task=task, store=tmp_path / "store"))
    r = cli("launch", str(spec))
    assert r.code == 0, r.out + r.err
    run_id = run_id_from(r.out)
    st = wait_for(cli, run_id, harness_ended, timeout=700)
    m = st["metrics"]["seed0"]
    assert st["state"] == "succeeded" and m["world_size"] == 2, st
    block = m["lm_eval"]
    assert "cut" not in block and "error" not in block, block
    assert {name: set(tasks) for name, tasks in block["models"].items()} == {"base": {"tiny_sum"}, "adapter": {"tiny_sum"}}
    # From the hand-back to the harness's end: its two processes and a minute at most.
    events = [
        json.loads(line) for line in next((tmp_path / "store").glob(f"*/{run_id}/seed0/events.jsonl")).read_text().splitlines()
    ]
    handed_back = next(e["time"] for e in events if e["kind"] == "done")
    ended = next(e["time"] for e in events if e["kind"] == "lm_eval")
    assert ended - handed_back <= sum(block["model_seconds"].values()) + 60, (ended - handed_back, block["model_seconds"])
