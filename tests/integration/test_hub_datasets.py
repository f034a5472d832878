"""Hub datasets (``hf:owner/name``) against the fake Hub: the launch-time check and the worker's loading.

The test makes its own dataset repos with huggingface_hub (jsonl and parquet files, train and test
splits, a README ``configs`` section, a private repo). The laptop-side check runs here, in process,
with an HfApi pointed at the fake; the worker's loading (``datasets.load_dataset``) runs in one child
process, because huggingface_hub reads HF_ENDPOINT once, at import.

    .venv/bin/python -m pytest -q tests/integration/test_hub_datasets.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoslm.envs.parquet_footer import parquet_columns
from autoslm.errors import UsageError
from autoslm.store.hub_check import check_hub_dataset
from tests.fakes.hub import FAKE_HUB_TOKEN, fake_hub  # noqa: F401
from tests.fakes.hub_datasets import CHAT, TOOLS, make_repos, parquet

pytestmark = pytest.mark.worker  # also runs on the worker image's pins (make test-image)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def hub(fake_hub):  # noqa: F811
    make_repos(fake_hub)
    return fake_hub


def api(hub, token=FAKE_HUB_TOKEN):
    from huggingface_hub import HfApi

    return HfApi(endpoint=hub.endpoint, token=token)


def test_launch_check_reads_columns_of_jsonl_parquet_and_configs(hub):
    a = api(hub)
    assert check_hub_dataset("hf:someone/arith", {"eval_split": "test"}, api=a) == {
        "train": ["answer", "prompt"],
        "test": ["answer", "prompt"],
    }
    assert check_hub_dataset("hf:someone/chats", {}, api=a) == {"train": ["messages", "tools"]}
    assert check_hub_dataset("hf:someone/configs", {"config": "pc"}, api=a) == {"train": ["completion", "prompt"]}
    assert check_hub_dataset("hf:someone/configs", {"config": "bydir", "eval_split": "test"}, api=a) == {
        "train": ["messages"],
        "test": ["messages"],
    }
    mapped = {"columns": {"prompt": "question", "answer": "solution"}}
    assert check_hub_dataset("hf:someone/renamed", mapped, api=a) == {"train": ["question", "solution"]}
    assert check_hub_dataset("hf:someone/zipped", {}, api=a) == {}
    assert check_hub_dataset("hf:someone/script", {}, api=a) == {}
    # Only the head of a file is read: a range request, never the whole file.
    reads = [r for r in hub.requests if "/resolve/" in r.path and r.path.endswith((".jsonl", ".parquet"))]
    assert reads and all(r.range and r.range.startswith("bytes=") for r in reads), [(r.path, r.range) for r in reads]


@pytest.mark.parametrize(
    "env_id, params, words",
    [
        ("hf:someone/renamed", {}, ['missing column "messages" (or "prompt")', "question, solution", '"prompt" + "answer"']),
        ("hf:someone/renamed", {"columns": {"prompt": "question"}}, ['missing column "answer" (or "completion")']),
        ("hf:someone/nope", {}, ["no such dataset", "HF_TOKEN"]),
        ("hf:someone/arith", {"eval_split": "validation"}, ["no data files for split 'validation'", "data/test.jsonl"]),
        ("hf:someone/configs", {"config": "other"}, ["no data files for split 'train' in config 'other'"]),
        ("hf:someone/empty-test", {"eval_split": "test"}, ["data/test.jsonl", "empty"]),
        ("hf:someone/arith", {"revision": "v9"}, ["no revision 'v9'"]),
    ],
)
def test_launch_check_names_what_is_wrong(hub, env_id, params, words):
    with pytest.raises(UsageError) as e:
        check_hub_dataset(env_id, params, api=api(hub))
    assert e.value.exit_code == 2
    for w in words:
        assert w in str(e.value), str(e.value)


def test_launch_check_looks_into_the_data_a_critique_wraps(hub):
    from autoslm.spec import validate_dict
    from autoslm.store.hub_check import check_data

    def spec(data_params: dict):
        return validate_dict(
            {
                "name": "c",
                "model": "autoslm/tiny",
                "train": {"method": "grpo", "max_steps": 1, "max_length": 256},
                "environment": {"id": "autoslm/critique", "params": {"data": "hf:someone/renamed", "data_params": data_params}},
            }
        )

    with pytest.raises(UsageError, match='missing column "answer"'):
        check_data(spec({"columns": {"prompt": "question"}}), api=api(hub))
    check_data(spec({"columns": {"prompt": "question", "answer": "solution"}}), api=api(hub))


def _lm_eval_spec(tmp_path: Path, dataset: str) -> Path:
    """A local GRPO spec whose lm-eval task (a YAML including another, as lm-eval's own do) reads ``dataset``."""
    tmp_path = tmp_path / dataset.replace("/", "-")
    tmp_path.mkdir()
    (tmp_path / "base.yaml").write_text(f"dataset_path: {dataset}\noutput_type: generate_until\ntest_split: test\n")
    (tmp_path / "mine.yaml").write_text("include: base.yaml\ntask: mine\n")
    spec = tmp_path / "s.toml"
    spec.write_text(
        'name = "l"\nmodel = "autoslm/tiny"\n[train]\nmethod = "grpo"\nmax_steps = 1\nmax_length = 256\n'
        '[environment]\nid = "autoslm/arith"\n[eval]\nlm_eval = ["mine.yaml"]\n'
    )
    return spec


def test_an_lm_eval_tasks_hub_data_is_checked_before_anything_runs(hub, tmp_path, cli):
    from autoslm.envs.lm_tasks import task_dataset
    from autoslm.spec import load_spec
    from autoslm.store.hub_check import check_data

    found = load_spec(_lm_eval_spec(tmp_path, "someone/arith"))
    assert task_dataset(found.eval.lm_eval[0]) == "someone/arith"  # through its include:
    check_data(found, api=api(hub))
    missing_path = _lm_eval_spec(tmp_path, "someone/nope")
    missing = load_spec(missing_path)
    with pytest.raises(UsageError) as e:
        check_data(missing, api=api(hub))
    assert e.value.exit_code == 2 and "eval.lm_eval.0" in str(e.value) and "reads the Hub dataset someone/nope" in str(e.value)
    assert "no such dataset" in str(e.value)
    with pytest.raises(UsageError, match="private and HF_TOKEN"):  # readable only with the token
        check_data(load_spec(_lm_eval_spec(tmp_path, "someone/chats")), api=api(hub, token=False))
    # `autoslm plan` says it in one line and exits 2 before any offer is shown.
    r = cli("plan", str(missing_path), env=hub.env())
    assert r.code == 2 and "reads the Hub dataset someone/nope" in r.err and "Traceback" not in r.err, r.out + r.err
    # lm-eval's own tasks: the dataset their YAML names (a name with no file of its own, such as a group, none).
    if importlib.util.find_spec("lm_eval") is not None:
        assert task_dataset("gsm8k") == "openai/gsm8k" and task_dataset("no_such_task_here") is None


def test_private_dataset_needs_the_token(hub):
    with pytest.raises(UsageError, match="private and HF_TOKEN"):
        check_hub_dataset("hf:someone/chats", {}, api=api(hub, token=False))
    assert check_hub_dataset("hf:someone/chats", {}, api=api(hub))


def test_parquet_footer_with_nested_columns():
    data = parquet([{"messages": CHAT, "score": 1.5, "meta": {"a": [1, 2], "b": {"c": "d"}}, "tools": None}])
    assert parquet_columns(lambda s, e: data[s : e + 1], len(data)) == ["messages", "score", "meta", "tools"]


WORKER_SCRIPT = r"""
import json, sys
from pathlib import Path
from autoslm.envs.hub_dataset import HubDatasetEnv
from autoslm.errors import FatalWorkerError
out = {}
for key, env_id, params in json.loads(sys.argv[1]):
    try:
        env = HubDatasetEnv(env_id, params, cache_dir=Path(sys.argv[2]))
        tr, ev = env.train_examples(), env.eval_examples()
        out[key] = {"train": len(tr), "eval": len(ev), "first": [tr[0].prompt, tr[0].answer, tr[0].conversation, tr[0].info]}
    except FatalWorkerError as e:
        out[key] = {"fatal": str(e)}
print(json.dumps(out))
"""


def test_worker_loads_every_format_with_datasets_and_fails_bad_data_as_fatal(hub, tmp_path):
    cases = [
        ("splits", "hf:someone/arith", {"eval_split": "test"}),
        ("fraction", "hf:someone/arith", {"eval_fraction": 0.25, "max_rows": 20}),
        ("private", "hf:someone/chats", {"eval_fraction": 0}),
        ("config", "hf:someone/configs", {"config": "pc", "eval_fraction": 0}),
        ("data-dir", "hf:someone/configs", {"config": "bydir", "eval_split": "test"}),
        ("mapped", "hf:someone/renamed", {"columns": {"prompt": "question", "answer": "solution"}}),
        ("missing-column", "hf:someone/renamed", {}),
        ("bad-row", "hf:someone/late-bad", {}),
        ("empty-split", "hf:someone/empty-test", {"eval_split": "test"}),
        ("no-split", "hf:someone/arith", {"eval_split": "validation"}),
        ("no-dataset", "hf:someone/nope", {}),
    ]
    env = {**os.environ, **hub.env(), "HF_HOME": str(tmp_path / "hf-home"), "PYTHONPATH": str(REPO)}
    p = subprocess.run(
        [sys.executable, "-c", WORKER_SCRIPT, json.dumps(cases), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(REPO),
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])

    assert got["splits"]["train"] == 24 and got["splits"]["eval"] == 6
    assert got["splits"]["first"][:2] == [[{"role": "user", "content": "What is 0 + 1?"}], "1"]
    assert got["fraction"]["train"] == 15 and got["fraction"]["eval"] == 5
    prompt, answer, chat, info = got["private"]["first"]
    assert got["private"]["train"] == 6 and prompt == CHAT[:3] and answer == "6"
    assert chat == CHAT, "a chat keeps every assistant turn and the tool call for SFT"
    assert info["tools"] == TOOLS
    assert got["config"]["train"] == 8 and got["config"]["first"][1] == "0"
    assert got["data-dir"].get("train") == got["data-dir"].get("eval") == 1, got["data-dir"]
    assert got["mapped"]["first"][:2] == [[{"role": "user", "content": "q0"}], "0"]

    assert 'missing column "messages" (or "prompt")' in got["missing-column"]["fatal"]
    assert (
        "split 'train' row 8 (counting from 0)" in got["bad-row"]["fatal"] and '"prompt" must be text' in got["bad-row"]["fatal"]
    )
    assert got["empty-split"]["fatal"] == "hf:someone/empty-test split 'test' has no rows"
    assert 'Unknown split "validation"' in got["no-split"]["fatal"]
    assert "no such dataset" in got["no-dataset"]["fatal"]
