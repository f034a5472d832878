"""A held-out evaluation that several training processes share: each evaluates its part of the rows
(``evaluate``'s ``Shard``) and every one gathers the whole result, equal to one process's evaluation
of the whole split. Two real gloo processes on this CPU, the built-in model.

    .venv/bin/python -m pytest -q tests/unit/test_eval_shard.py
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from autoslm.engine.rollout.evaluate import Shard
from tests.conftest import REPO

pytestmark = [pytest.mark.worker, pytest.mark.pod]  # ranks splitting an evaluation: a multi-GPU pod's

# One process of the evaluation: RANK/WORLD_SIZE in its environment (none: the single-process run).
CHILD = r"""
import json, os, sys
import torch
from autoslm.engine.distributed import Ranks
from autoslm.engine.rollout.evaluate import Shard, evaluate
from autoslm.engine.train.tiny import build_model, build_tokenizer
from autoslm.envs.arith import ArithEnv

ranks = Ranks.from_env(dict(os.environ))
if ranks.distributed:
    import torch.distributed as td
    td.init_process_group("gloo", rank=ranks.rank, world_size=ranks.world_size)
torch.manual_seed(0)
tok = build_tokenizer()
model = build_model(tok)
env = ArithEnv({"n_train": 1, "n_eval": 11})
done = []
result = evaluate(model, tok, env, env.eval_examples(), thinking=False, max_new_tokens=6,
                  sampling={"temperature": 1.0, "top_p": 1.0, "seed": 3, "samples": 2, "ks": (1, 2), "threshold": 1.0},
                  progress=lambda d, t: done.append(t), shard=Shard(ranks.rank, ranks.world_size, ranks.gather))
print(json.dumps({"result": result, "rows_done": done[-1]}))
"""


def _run(world: int) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env = {**os.environ, "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        if world > 1:
            env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO)
            )
        )
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


def test_two_ranks_split_the_rows_and_each_returns_the_whole_splits_result():
    (alone,) = _run(1)
    first, second = _run(2)
    # 11 rows: a loss pass, a greedy answer and 2 sampled ones each. One process does all 44; two do
    # 6 rows each (rank 1's five, padded with a repeat so both make the same calls).
    assert alone["rows_done"] == 44 and first["rows_done"] == second["rows_done"] == 24
    assert first["result"] == second["result"]  # every rank has the whole result
    split, whole = first["result"], alone["result"]
    assert split["n"] == whole["n"] == 11
    assert split["loss"] == pytest.approx(whole["loss"], abs=1e-3)
    assert split["score"] == pytest.approx(whole["score"])  # greedy: the same answers, wherever they were made
    assert split["score_sampled"] is not None and set(split) == set(whole)


def test_a_shard_pads_to_one_length_and_joins_in_the_splits_order():
    rows = list(range(5))
    parts = [Shard(r, 2).part(rows) for r in range(2)]
    assert parts == [([0, 2, 4], 3), ([1, 3, 3], 2)]
    mine = [rows[:own] for rows, own in parts]
    assert Shard(0, 2, gather=lambda _: mine).join(mine[0]) == [0, 1, 2, 3, 4]
    assert Shard(1, 4).part([7]) == ([7], 0)  # more ranks than rows: a repeat, and none of its own
