"""Users' data without a network: the row formats, shipping local files through a store, the checks
of ``hf:`` ids and of a local store with a cloud provider, and SFT's masks on whole chats."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from autoslm.envs.base import Example
from autoslm.envs.jsonl import JsonlEnv
from autoslm.envs.rows import RowError, match_reward, missing_columns, rename, to_example
from autoslm.errors import FatalWorkerError, SpecError, UsageError
from autoslm.layout import data_blob
from autoslm.spec import parse_spec
from autoslm.store.local import LocalStore
from autoslm.store.shipping import DataFiles, ship_file, ship_local_files

pytestmark = pytest.mark.worker  # also runs on the worker image's pins (make test-image)

CALL = {"type": "function", "function": {"name": "calc", "arguments": '{"expression": "2 * 3"}'}}
CHAT = [
    {"role": "system", "content": "Use the calculator."},
    {"role": "user", "content": "What is 2 * 3?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "name": "calc", "content": "6"},
    {"role": "assistant", "content": "It is 6."},
]


# -- row formats ------------------------------------------------------------------------------------
def test_chat_rows_keep_every_assistant_turn_and_parse_tool_arguments():
    ex = to_example({"messages": CHAT + [{"role": "user", "content": "thanks"}]})
    assert [m["role"] for m in ex.conversation] == ["system", "user", "assistant", "tool", "assistant"], (
        "the chat ends at its last assistant turn"
    )
    # OpenAI-style arguments (a JSON string) become the dict chat templates render.
    assert ex.conversation[2]["tool_calls"][0]["function"]["arguments"] == {"expression": "2 * 3"}
    assert ex.prompt == ex.conversation[:4] and ex.target == ex.answer == "It is 6."
    # One assistant turn and no tools: a plain prompt/target example (the cheap SFT path).
    simple = to_example({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})
    assert simple.conversation is None and simple.target == "hello"


def test_arrow_nulls_are_dropped_from_chats_and_tools():
    row = {
        "messages": [
            {"role": "user", "content": "q", "tool_calls": None},
            {"role": "assistant", "content": "a", "tool_calls": None, "name": None},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "description": None}}],
    }
    ex = to_example(row)
    assert ex.conversation == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert ex.info["tools"] == [{"type": "function", "function": {"name": "f"}}]


def test_prompt_completion_plain_and_conversational():
    plain = to_example({"prompt": "2+2=", "completion": "4"})
    assert plain.prompt == [{"role": "user", "content": "2+2="}] and plain.target == plain.answer == "4"
    conv = to_example(
        {
            "prompt": [{"role": "user", "content": "call it"}],
            "completion": [{"role": "assistant", "content": "", "tool_calls": [CALL]}],
        }
    )
    assert conv.conversation is not None and conv.target.startswith("<tool_call>\n") and '"name": "calc"' in conv.target


def test_prompt_answer_with_system_and_extra_columns():
    ex = to_example({"prompt": "2+2=", "answer": 4, "system": "be brief", "source": "x"})
    assert ex.prompt[0] == {"role": "system", "content": "be brief"} and ex.answer == "4" and ex.info == {"source": "x"}


def test_tools_as_a_json_string_and_bad_tools():
    tools = [{"type": "function", "function": {"name": "calc"}}]
    ex = to_example({"prompt": "q", "answer": "1", "tools": json.dumps(tools)})
    assert ex.info["tools"] == tools and ex.conversation[-1] == {"role": "assistant", "content": "1"}
    with pytest.raises(RowError, match='"tools" is not valid JSON'):
        to_example({"prompt": "q", "answer": "1", "tools": "[{"})


def test_column_mapping_and_the_missing_column_message():
    row = rename({"question": "q", "solution": "s"}, {"prompt": "question", "answer": "solution"})
    assert row == {"prompt": "q", "answer": "s"}
    msg = missing_columns({"question", "solution"})
    assert msg.startswith('missing column "messages" (or "prompt"); columns found: question, solution;')
    assert '"messages"; "prompt" + "completion"; "prompt" + "answer"' in msg and "params.columns" in msg
    assert missing_columns({"prompt"}).startswith('missing column "answer" (or "completion")')
    assert missing_columns({"prompt", "completion"}) is None and missing_columns({"messages", "x"}) is None


def test_match_reward_numbers_and_text():
    assert match_reward("42", "so the answer is 42") == 1.0 and match_reward("42", "4 2") == 0.0
    assert match_reward("Paris", "  paris. ") == 1.0 and match_reward("Paris", "Lyon") == 0.0


def test_jsonl_rows_with_a_column_mapping_and_a_bad_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"q": "1+1", "a": "2"}\n{"q": "2+2", "a": "4"}\n{"a": 3}\n')
    env = JsonlEnv(path, {"columns": {"prompt": "q", "answer": "a"}, "max_rows": 2, "eval_fraction": 0})
    assert [e.answer for e in env.train_examples()] == ["2", "4"]
    with pytest.raises(FatalWorkerError, match=r"d.jsonl:3: missing column \"prompt\""):
        JsonlEnv(path, {"columns": {"prompt": "q", "answer": "a"}})
    with pytest.raises(FatalWorkerError, match="dataset file not found"):
        JsonlEnv(tmp_path / "gone.jsonl", {})


# -- shipping local files through the store -------------------------------------------------------
def spec_for(tmp_path: Path, data: Path, eval_path: Path | None = None):
    params = f'params = {{ eval_path = "{eval_path}" }}' if eval_path else ""
    return parse_spec(f'name = "s"\nmodel = "autoslm/tiny"\n[environment]\nid = "jsonl:{data}"\n{params}\n', base_dir=tmp_path)


def test_local_files_are_shipped_once_by_content_and_read_back_from_the_store(tmp_path):
    data, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    data.write_text('{"prompt": "1+1", "answer": "2"}\n' * 5)
    held.write_text('{"prompt": "2+2", "answer": "4"}\n')
    store = LocalStore(tmp_path / "store")
    shipped = ship_local_files(spec_for(tmp_path, data, held), store)
    sha = hashlib.sha256(data.read_bytes()).hexdigest()
    assert shipped.environment.id == f"jsonl:store:{sha}/train.jsonl"
    assert shipped.environment.params["eval_path"].startswith("store:") and shipped.environment.params["eval_path"].endswith(
        "/held.jsonl"
    )
    assert (store.root / data_blob(sha)).read_bytes() == data.read_bytes()

    # The same bytes under another name are not stored again.
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(data.read_bytes())
    mtime = (store.root / data_blob(sha)).stat().st_mtime_ns
    assert ship_file(copy, store, "environment.id") == f"store:{sha}/copy.jsonl"
    assert (store.root / data_blob(sha)).stat().st_mtime_ns == mtime
    assert len(store.list_files("data/sha256")) == 2

    # The worker reads the store's copy: the laptop's files may be gone.
    data.unlink()
    held.unlink()
    env = JsonlEnv(
        shipped.environment.id[len("jsonl:") :], dict(shipped.environment.params), files=DataFiles(store, tmp_path / "work")
    )
    assert len(env.train_examples()) == 5 and env.eval_examples()[0].answer == "4" and env.name == "jsonl:train.jsonl"


def test_a_missing_or_corrupt_store_copy_is_fatal_and_names_the_file(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1", "answer": "2"}\n')
    store = LocalStore(tmp_path / "store")
    ref = ship_file(data, store, "environment.id")
    sha = ref.split(":")[1].split("/")[0]
    (store.root / data_blob(sha)).write_text('{"prompt": "1+1", "answer": "3"}\n')
    with pytest.raises(FatalWorkerError, match="train.jsonl: the run's copy in the store .* does not match its sha256"):
        DataFiles(store, tmp_path / "w1").local_path(ref)
    (store.root / data_blob(sha)).unlink()
    with pytest.raises(FatalWorkerError, match="train.jsonl: the run's copy is missing from the store"):
        DataFiles(store, tmp_path / "w2").local_path(ref)


def test_a_file_above_the_limit_is_refused_with_a_hub_dataset_hint(tmp_path):
    data = tmp_path / "big.jsonl"
    data.write_bytes(b"x" * 2048)
    with pytest.raises(UsageError) as e:
        ship_file(data, LocalStore(tmp_path / "store"), "environment.id", limit=1024)
    assert e.value.exit_code == 2 and "big.jsonl" in str(e.value) and 'environment.id = "hf:owner/name"' in str(e.value)
    assert not (tmp_path / "store").exists() or not LocalStore(tmp_path / "store").list_files("data")


# -- spec checks, offline -------------------------------------------------------------------------
GOOD = 'name = "t"\nmodel = "autoslm/tiny"\n[environment]\nid = "{id}"\n{params}\n'


def spec_issues(text: str) -> list[str]:
    with pytest.raises(SpecError) as e:
        parse_spec(text, "spec.toml")
    return [str(i) for i in e.value.issues]


def test_hf_ids_and_params_are_checked_offline():
    spec = parse_spec(
        GOOD.format(id="hf:someone/data", params='params = { split = "train", eval_split = "test", columns = { prompt = "q" } }')
    )
    assert spec.environment.id == "hf:someone/data"
    assert spec_issues(GOOD.format(id="hf:data", params="")) == [
        "spec.toml: environment.id: a Hub dataset id looks like \"hf:owner/name\", got 'hf:data'"
    ]
    (msg,) = spec_issues(GOOD.format(id="hf:a/b", params="params = { shuffle = true }"))
    assert "environment.params.shuffle: unknown parameter" in msg
    (msg,) = spec_issues(GOOD.format(id="hf:a/b", params='params = { eval_split = "train" }'))
    assert "eval_split must differ from split ('train')" in msg


def test_a_local_store_or_a_local_model_with_a_cloud_provider_is_refused():
    cloud = '[compute]\nprovider = "runpod"\ngpu = "RTX 4090"\n'
    msgs = spec_issues(GOOD.format(id="autoslm/arith", params="") + cloud)
    assert msgs == [
        'spec.toml: artifacts.store: a local store cannot be reached from a runpod pod: use store = "hf" '
        'with repo = "owner/name" (a Hugging Face dataset repo)'
    ]
    text = GOOD.format(id="autoslm/arith", params="").replace('"autoslm/tiny"', '"./my-model"')
    msgs = spec_issues(text + cloud + '[artifacts]\nstore = "hf"\nrepo = "me/runs"\n')
    assert msgs == [
        "spec.toml: model: a local model path does not reach a runpod pod: push the model to the Hub and name it as owner/name"
    ]


# -- SFT on whole chats (the tiny model's tokenizer) ----------------------------------------------
@pytest.fixture(scope="module")
def tokenizer():
    pytest.importorskip("trl")
    from autoslm.engine.train.tiny import build_tokenizer

    return build_tokenizer()


def test_chat_loss_covers_every_assistant_turn_and_the_tool_call(tokenizer):
    from autoslm.engine.train import conversations

    ex = to_example({"messages": CHAT + [{"role": "user", "content": "and 2+3?"}, {"role": "assistant", "content": "5"}]})
    template = conversations.training_template(tokenizer)
    assert template is not None
    (row,), too_long = conversations.tokenized_rows(conversations.chats([ex]), tokenizer, template, False, 4096)
    learned = tokenizer.decode([t for t, label in zip(row["input_ids"], row["labels"]) if label != -100])
    assert '"name": "calc"' in learned and "It is 6." in learned and "5" in learned and too_long == 0
    assert "What is 2 * 3?" not in learned and "and 2+3?" not in learned and "Use the calculator" not in learned
    assert learned.count("<|im_end|>") == 3, "each assistant turn learns to stop"


def test_a_template_without_generation_markers_learns_one_row_per_turn(tokenizer):
    import copy

    from autoslm.engine.train import conversations

    plain = copy.deepcopy(tokenizer)
    plain.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    assert conversations.training_template(plain) is None
    chat = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
    ]
    rows = conversations.per_turn_rows([(chat, None)], plain, False)
    assert [r["completion"] for r in rows] == ["b", "d"]
    assert rows[1]["prompt"].endswith("<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n")


def test_single_replies_join_chats_as_two_message_conversations():
    from autoslm.engine.train.conversations import chats

    pairs = chats([Example(prompt=[{"role": "user", "content": "q"}], target="t"), Example(prompt=[], target=None)])
    assert pairs == [([{"role": "user", "content": "q"}, {"role": "assistant", "content": "t"}], None)]
