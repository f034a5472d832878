"""Several training processes: which process is which, who launches, which failing rank is named, and
dynamic sampling across two real gloo ranks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autoslm.engine.distributed import Ranks, should_launch
from autoslm.engine.rank_launcher import is_follower, rank_failure, record_failure
from autoslm.errors import FatalWorkerError, WorkerError
from autoslm.spec import validate_dict

pytestmark = pytest.mark.worker  # also runs on the worker image's pins (make test-image)

REPO = Path(__file__).resolve().parents[2]


def spec(gpus: int, strategy: str = "ddp"):
    return validate_dict(
        {
            "name": "d",
            "model": "autoslm/tiny",
            "environment": {"id": "autoslm/arith"},
            "compute": {"gpu_count": gpus, "strategy": strategy},
        }
    )


def test_ranks_from_the_launchers_environment():
    assert Ranks.from_env({}) == Ranks() and not Ranks().distributed and Ranks().is_main
    r = Ranks.from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert (r.rank, r.world_size, r.local_rank, r.distributed, r.is_main) == (3, 4, 1, True, False)
    assert Ranks.from_env({"RANK": "0", "WORLD_SIZE": "1"}) == Ranks()  # torchrun with one process: plain
    with pytest.raises(FatalWorkerError):
        Ranks.from_env({"RANK": "x", "WORLD_SIZE": "2"})


def test_the_worker_launches_ranks_only_when_the_spec_asks_and_it_is_not_one():
    assert should_launch(spec(2), Ranks())
    assert not should_launch(spec(2), Ranks(1, 2, 1))
    assert not should_launch(spec(1), Ranks())
    assert not should_launch(None, Ranks())


def test_single_process_collectives_are_plain_calls():
    r = Ranks()
    assert r.on_main(lambda: 42) == 42 and r.any(True) and not r.any(False) and r.sum(5) == 5
    r.barrier()


def failure(tmp_path: Path, rank: int, exitcode: int, message: str | None = None, *, retryable=True, follower=False):
    """What the elastic agent hands the launcher: a ProcessFailure read from the rank's error file."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    path = tmp_path / f"rank{rank}" / "error.json"
    if message is not None:
        record_failure({"TORCHELASTIC_ERROR_FILE": str(path)}, message, retryable, follower)
    return ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=exitcode, error_file=str(path))


def test_the_error_names_the_rank_that_failed_first(tmp_path):
    # rank 1 raised; rank 0 then lost its peer: rank 1 is named, with its message
    err = rank_failure(
        {
            0: failure(tmp_path, 0, 1, "RuntimeError: [gloo] Connection reset by peer", follower=True),
            1: failure(tmp_path, 1, 1, "ValueError: bad row 7"),
        },
        2,
    )
    assert isinstance(err, WorkerError) and str(err) == "rank 1 of 2 failed: ValueError: bad row 7"


def test_a_rank_killed_without_a_word_is_named_over_its_peers_socket_error(tmp_path):
    err = rank_failure(
        {
            0: failure(tmp_path, 0, 1, "RuntimeError: Connection reset by peer", follower=True),
            1: failure(tmp_path, 1, -9),
        },
        2,
    )
    assert str(err).startswith("rank 1 of 2 failed: exited with code -9") and "SIGKILL" in str(err)
    assert err.retryable


def test_a_fatal_rank_error_stays_fatal(tmp_path):
    err = rank_failure({3: failure(tmp_path, 3, 2, "FatalWorkerError: no example fits", retryable=False)}, 4)
    assert isinstance(err, FatalWorkerError) and "rank 3 of 4" in str(err)


def test_peer_failures_are_recognised_as_consequences():
    assert is_follower(RuntimeError("[../gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer"))
    assert not is_follower(ValueError("bad row"))


# -- dynamic sampling on two gloo ranks -------------------------------------------------------------

RANK_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    from accelerate import Accelerator
    from autoslm.engine.train.dynamic_sampling import DynamicSampling, informative_groups

    G = 2  # group size; each rank holds 2 groups per step
    acc = Accelerator(cpu=True)
    rank = acc.process_index
    calls, seen = [], []

    def generate_and_score(inputs):
        # Stands in for TRL's generation: it gathers rewards across ranks (a collective), so every
        # rank must call it equally often. Rank 0's first batch is all-equal groups; rank 1's is
        # informative; fresh draws give one informative group each.
        calls.append(len(inputs))
        acc.gather(torch.tensor([float(len(inputs))]))
        n = len(inputs)
        first = len(calls) == 1
        if first and rank == 0:
            adv = [0.0] * n
        elif first:
            adv = [1.0, -1.0] * (n // 2)
        else:
            seen.extend(r["prompt"] for r in inputs[::G])
            adv = [0.5, -0.5] + [0.0] * (n - 2)
        ids = torch.arange(n).unsqueeze(1)
        return {"prompt_ids": ids, "prompt_mask": torch.ones_like(ids), "completion_ids": ids,
                "completion_mask": torch.ones_like(ids), "advantages": torch.tensor(adv)}

    class Trainer:  # what DynamicSampling reads from TRL's GRPOTrainer
        accelerator = acc
        train_dataset = [{"prompt": f"p{i}"} for i in range(50)]
        processing_class = type("Tok", (), {"pad_token_id": 0})()
        args = type("Args", (), {"seed": 0})()

    class Reporter:
        events = []
        def event(self, kind, **data):
            self.events.append({"kind": kind, **data})

    reporter = Reporter()
    out = DynamicSampling(G, reporter)(Trainer(), [{"prompt": "x"}] * 4, generate_and_score)
    print(json.dumps({"rank": rank, "calls": len(calls), "informative": len(informative_groups(out["advantages"], G)),
                      "rows": int(out["advantages"].shape[0]), "seen": seen, "events": reporter.events}), flush=True)
    # Leave the group in order: tearing gloo down at interpreter exit can abort the process.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dynamic_sampling_draws_together_across_ranks():
    port = free_port()
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", RANK_SCRIPT],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=str(REPO),
            )
        )
    import json

    results = {}
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
        r = json.loads(out.strip().splitlines()[-1])
        results[r["rank"]] = r
    r0, r1 = results[0], results[1]
    # Both ranks called the generation the same number of times: the one step plus two shared draws
    # (rank 0 needed two informative groups, one per draw; rank 1 needed none but drew along).
    assert r0["calls"] == r1["calls"] == 3
    assert r0["informative"] == 2 and r0["rows"] == 4
    assert r1["informative"] == 2 and r1["rows"] == 4
    # One shared stream of fresh prompts, each rank its own share of it.
    assert r0["seen"] and r1["seen"] and not set(r0["seen"]) & set(r1["seen"])
    # The counts are summed over both ranks.
    ev = r0["events"][0]
    assert (ev["kind"], ev["dropped_groups"], ev["filled"], ev["draws"], ev["processes"]) == ("dynamic_sampling", 2, 2, 2, 2)


def test_validate_rejects_num_processes_that_disagrees_with_gpu_count(cli, tmp_path):
    path = tmp_path / "np.toml"
    path.write_text(
        'name = "np"\nmodel = "autoslm/tiny"\n[environment]\nid = "autoslm/arith"\n'
        '[train]\nmethod = "grpo"\nprompts_per_step = 8\nnum_processes = 2\n[compute]\ngpu_count = 4\n'
    )
    r = cli("validate", str(path))
    assert r.code == 2 and "train.num_processes" in r.err and "compute.gpu_count = 4" in r.err, r.err
    path.write_text(path.read_text().replace("prompts_per_step = 8\nnum_processes = 2\n", "prompts_per_step = 6\n"))
    r = cli("validate", str(path))
    assert r.code == 2 and "train.prompts_per_step" in r.err and "whole groups over 4 processes" in r.err, r.err


def test_on_several_pods_the_error_names_the_rank_and_its_node(tmp_path):
    from autoslm.engine.nodes import Node
    from autoslm.engine.rank_launcher import PeerNodeFailed

    node1 = Node(1, 2, "127.0.0.1", 29500)
    err = rank_failure({1: failure(tmp_path, 1, 2, "FatalWorkerError: bad row 7", retryable=False)}, 2, node1)
    assert isinstance(err, FatalWorkerError) and str(err) == "rank 1 of 2 on node 1 failed: FatalWorkerError: bad row 7"
    # Node 0's ranks only lost their peer on node 1: that pod reports why, this one writes no error record.
    err = rank_failure({0: failure(tmp_path, 0, 1, "RuntimeError: Connection closed by peer", follower=True)}, 2, Node(0, 2))
    assert isinstance(err, PeerNodeFailed) and str(err).startswith("rank 0 of 2 on node 0 failed")
    # ... but a rank of its own that died without a word is its own.
    assert not isinstance(rank_failure({0: failure(tmp_path / "killed", 0, -9)}, 2, Node(0, 2)), PeerNodeFailed)


def test_ranks_know_when_they_span_several_pods():
    r = Ranks.from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert (r.local_world_size, r.several_nodes, r.is_local_main) == (2, True, False)
    one = Ranks.from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert one == Ranks(1, 2, 1) and not one.several_nodes


class _Direct:
    """An uploader that writes at once (the real one's queue is not what is tested here)."""

    def required(self, fn, what, timeout) -> None:
        fn()


class _Silent:
    def beat(self, *a, **k) -> None:
        pass

    def event(self, *a, **k) -> None:
        pass


@pytest.mark.parametrize(
    ("error", "recorded"),
    [
        (RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:35744"), False),
        (ValueError("bad row 7"), True),
    ],
)
def test_rank_0_writes_the_runs_error_only_when_it_failed_for_a_reason_of_its_own(tmp_path, error, recorded):
    """A rank 0 whose peer died (on another pod, the rank that failed first) leaves the run's error record
    to the launcher that names that rank: written here, it could land after that launcher's, and the run
    would say "connection closed" instead of why. Its own failure is written as before."""
    from autoslm.engine.pod.runner import _record_failure
    from autoslm.layout import RunPaths
    from autoslm.store import RunArtifacts
    from autoslm.store.local import LocalStore

    artifacts = RunArtifacts(LocalStore(tmp_path / "store"), RunPaths("sft", "r", 0))
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "TORCHELASTIC_ERROR_FILE": str(tmp_path / "rank0.json")}
    ranks = Ranks.from_env(env)
    try:
        raise error
    except Exception as e:  # noqa: BLE001 - as the runner catches it
        _record_failure(e, env, ranks, artifacts, _Direct(), _Silent())
    assert (artifacts.get_error() is not None) == recorded
    assert (tmp_path / "rank0.json").exists()  # the launcher always hears from the rank
