"""The JobSpec: loading, defaults from the recipes, and every malformed-spec error reported at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoslm.errors import SpecError
from autoslm.spec import load_spec, parse_spec

REPO = Path(__file__).resolve().parents[2]

GOOD = """
name = "t"
model = "autoslm/tiny"
[environment]
id = "autoslm/arith"
"""


def issues(text: str, tmp_path: Path | None = None) -> list[str]:
    with pytest.raises(SpecError) as e:
        parse_spec(text, "spec.toml", base_dir=tmp_path)
    return [str(i) for i in e.value.issues]


def test_minimal_spec_gets_recipe_defaults():
    spec = parse_spec(GOOD)
    assert spec.train.method == "sft"
    assert spec.train.epochs == 1.0 and spec.train.batch_size == 16 and spec.train.lora_rank == 16
    assert spec.compute.providers == ["local"] and spec.artifacts.store == "local"
    assert spec.seeds == [0] and spec.phase == "sft"


def test_grpo_recipe_defaults_differ():
    spec = parse_spec(GOOD + '[train]\nmethod = "grpo"\n')
    assert spec.train.method == "grpo" and spec.train.loss_type == "dr_grpo" and spec.train.scale_rewards == "none"
    assert spec.train.learning_rate == 5e-5


def test_every_shipped_jobspec_validates():
    for path in sorted((REPO / "jobspecs").glob("*.toml")):
        first = path.read_text().splitlines()[0]
        assert first.startswith("# autoslm "), f"{path.name} must open with the command that runs it"
        load_spec(path)


def test_seed_list_is_replicas():
    spec = parse_spec(GOOD.replace('name = "t"', 'name = "t"\nseed = [1, 2, 3]'))
    assert spec.seeds == [1, 2, 3]
    assert any("distinct" in i for i in issues(GOOD.replace('name = "t"', 'name = "t"\nseed = [1, 1]')))


def test_bad_toml_names_the_file_and_line():
    (msg,) = issues('name = "t"\nmodel = \n')
    assert msg.startswith("spec.toml: invalid TOML") and "line 2" in msg


def test_unknown_key_names_its_path():
    msgs = issues(GOOD + "[train]\nbatch_sise = 4\n")
    assert msgs == [
        "spec.toml: train.batch_sise: unknown key: remove it or check its spelling (autoslm validate lists the fields)"
    ]


def test_wrong_type_and_out_of_range_reported_together():
    msgs = issues(GOOD + '[train]\nbatch_size = "big"\nlearning_rate = 5.0\nlora_rank = 0\n')
    joined = "\n".join(msgs)
    assert len(msgs) == 3
    assert "train.batch_size" in joined and "'big'" in joined
    assert "train.learning_rate" in joined and "train.lora_rank" in joined


def test_missing_model():
    msgs = issues('name = "t"\n[environment]\nid = "autoslm/arith"\n')
    assert msgs == ["spec.toml: model: required field is missing"]


def test_unknown_builtin_model_and_bad_hub_id():
    assert "unknown built-in model" in issues(GOOD.replace("autoslm/tiny", "autoslm/huge"))[0]
    assert "Hub id" in issues(GOOD.replace("autoslm/tiny", "not a model"))[0]


@pytest.mark.parametrize(
    "snippet, field, hint",
    [
        ('[artifacts]\nstore = "hf"\nrepo = "a/b"\ntoken = "hf_abcdefghijklmnopqrstuvwx"\n', "artifacts.token", "HF_TOKEN"),
        ('[compute]\napi_key = "x"\n', "compute.api_key", "RUNPOD_API_KEY"),
        (
            '[environment.judge]\nbase_url = "http://x"\nmodel = "m"\napi_key = "sk-123"\n',
            "environment.judge.api_key",
            "api_key_env",
        ),
    ],
)
def test_secrets_are_rejected_with_where_to_put_them(snippet, field, hint):
    text = GOOD + snippet if not snippet.startswith("[environment.judge]") else GOOD + snippet
    msgs = issues(text)
    secret = [m for m in msgs if f": {field}:" in m]
    assert secret and hint in secret[0] and "secrets do not belong" in secret[0]
    assert "hf_abcdefghijklmnopqrstuvwx" not in "\n".join(msgs)


def test_api_key_env_is_allowed():
    spec = parse_spec(
        GOOD
        + '[train]\nmethod = "grpo"\n[environment.judge]\nbase_url = "http://127.0.0.1:1/v1"\nmodel = "m"\napi_key_env = "JUDGE_KEY"\n'
    )
    assert spec.environment.judge.api_key_env == "JUDGE_KEY"


def test_environment_problems_found_at_validation(tmp_path):
    assert "unknown built-in task" in issues(GOOD.replace("autoslm/arith", "autoslm/nope"))[0]
    msg = issues(GOOD.replace('"autoslm/arith"', '"jsonl:data/missing.jsonl"'), tmp_path)[0]
    assert "dataset file not found" in msg and str(tmp_path) in msg
    msg = issues(GOOD + "params = { n_trian = 5 }\n")[0]
    assert msg == "spec.toml: environment.params.n_trian: unknown parameter"


def test_jsonl_path_is_relative_to_the_spec(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    spec_file = tmp_path / "s.toml"
    spec_file.write_text(GOOD.replace('"autoslm/arith"', '"jsonl:d.jsonl"'))
    assert load_spec(spec_file).environment.id == f"jsonl:{tmp_path / 'd.jsonl'}"


def test_cloud_provider_needs_a_gpu_and_hf_needs_a_repo():
    msgs = issues(GOOD + '[compute]\nprovider = "runpod"\n[artifacts]\nstore = "hf"\n')
    joined = "\n".join(msgs)
    assert "compute: a cloud provider needs a GPU type" in joined
    assert 'artifacts: store = "hf" needs repo' in joined


def test_sft_batch_must_divide_into_micro_batches():
    msg = issues(GOOD + "[train]\nbatch_size = 10\nmicro_batch_size = 4\n")[0]
    assert "train: batch_size 10 is not a multiple of micro_batch_size 4" in msg and "e.g. 2" in msg


def test_roundtrip_json():
    from autoslm.spec import JobSpec

    spec = parse_spec(GOOD)
    assert JobSpec.from_json(spec.to_json()) == spec


def test_missing_file():
    with pytest.raises(SpecError) as e:
        load_spec("/nonexistent/spec.toml")
    assert "file not found" in str(e.value)
