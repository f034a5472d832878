"""[eval] lm_eval end to end on this CPU: a short GRPO run of the built-in model, then the real
lm-evaluation-harness on the base and on the adapter, with a task YAML of our own over local JSONL data
(no download: a generate_until task, a regex filter, a few samples, a few tokens). The scores land in
metrics.json, `status` and the report, each named by its protocol, and `autoslm eval` adds another task.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_sft_local import run_id_from
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


def task_files(folder: Path, name: str) -> Path:
    data = folder / f"{name}.jsonl"
    data.write_text(
        "".join(json.dumps({"a": a, "b": b, "answer": str(a + b)}) + "\n" for a, b in [(1, 2), (3, 4), (2, 2), (5, 1)])
    )
    path = folder / f"{name}.yaml"
    path.write_text(TASK.format(name=name, data=data))
    return path


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
    metrics = json.loads(next((tmp_path / "store").glob(f"*/{run_id}/seed0/metrics.json")).read_text())
    block = metrics["lm_eval"]
    assert block["version"] == "0.4.13" and block["backend"] == "hf" and "error" not in block, block
    assert "max_lora_rank" not in block["model_args"] and "enable_thinking=False" in block["model_args"]
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
