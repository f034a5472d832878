"""Dataset repos for tests, made on the fake Hub through the real huggingface_hub client.

``make_repos(hub)`` creates the same small set every Hub-dataset test reads: jsonl and parquet files,
train and test splits, a README ``configs`` section, a private repo, and repos with bad data.
"""

from __future__ import annotations

import io
import json

from tests.fakes.hub import FAKE_HUB_TOKEN

CHAT = [
    {"role": "user", "content": "What is 2 * 3?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": {"expression": "2 * 3"}}}],
    },
    {"role": "tool", "name": "calc", "content": "6"},
    {"role": "assistant", "content": "6"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "evaluate an expression",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


def jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def parquet(rows) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


def make_repos(hub) -> None:
    """The dataset repos every test here reads (created through the real client)."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub.endpoint, token=FAKE_HUB_TOKEN)

    def repo(name, files, private=False):
        api.create_repo(name, repo_type="dataset", private=private)
        for path, data in files.items():
            api.upload_file(path_or_fileobj=data, path_in_repo=path, repo_id=name, repo_type="dataset")

    qa = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(30)]
    repo("someone/arith", {"data/train.jsonl": jsonl(qa[:24]), "data/test.jsonl": jsonl(qa[24:])})
    chats = [{"messages": CHAT, "tools": json.dumps(TOOLS)} for _ in range(6)]
    repo(
        "someone/chats",
        {"data/train-00000-of-00001.parquet": parquet(chats), "data/test-00000-of-00001.parquet": parquet(chats[:2])},
        private=True,
    )
    renamed = [{"question": f"q{i}", "solution": str(i)} for i in range(10)]
    repo("someone/renamed", {"train.jsonl": jsonl(renamed)})
    pc = [
        {"prompt": [{"role": "user", "content": f"say {i}"}], "completion": [{"role": "assistant", "content": str(i)}]}
        for i in range(8)
    ]
    card = (
        "---\nconfigs:\n- config_name: pc\n  data_files:\n  - split: train\n    path: pc/*.parquet\n"
        "- config_name: bydir\n  data_dir: bydir\n---\n# data\n"
    )
    repo(
        "someone/configs",
        {
            "README.md": card.encode(),
            "pc/part-0.parquet": parquet(pc),
            "bydir/train.parquet": parquet([{"messages": CHAT}]),
            "bydir/test.parquet": parquet([{"messages": CHAT}]),
        },
    )
    # The first file is fine, so the launch-time check passes; the worker finds row 5 of the second.
    bad_rows = [{"prompt": "p", "answer": "1"}] * 5 + [{"prompt": None, "answer": "1"}]
    repo(
        "someone/late-bad",
        {"data/train-0.jsonl": jsonl([{"prompt": "p", "answer": "1"}] * 3), "data/train-1.jsonl": jsonl(bad_rows)},
    )
    # Files the launch-time check cannot open: it lets them through for the worker to judge.
    repo("someone/zipped", {"data/train.jsonl.gz": b"\x1f\x8b not really"})
    repo("someone/script", {"loader.py": b"# a loading script\n"})
    repo("someone/empty-test", {"data/train.jsonl": jsonl(qa), "data/test.jsonl": b""})
