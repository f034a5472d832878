"""The in-pod watchdog (time and money limits, starts counted on the pod's disk) and the failure classes."""

from __future__ import annotations

import threading

import pytest

from autoslm.engine.pod import watchdog
from autoslm.engine.pod.failures import is_retryable
from autoslm.errors import FatalWorkerError, StoreAuthError, StoreUnavailable
from autoslm.layout import RunPaths
from autoslm.store import RunArtifacts, open_store

pytestmark = pytest.mark.worker  # also runs on the worker image's pins (make test-image)


def test_check_deadline_after_a_grace_and_money_from_the_pods_price():
    dog = watchdog.Watchdog(deadline=1000.0, budget_usd=0.5, price_per_hour=1.8, pod_started_at=0.0, on_limit=print)
    assert dog.check(999.0) is None  # $0.4995 spent, before the deadline
    assert "money limit" in dog.check(1001.0)  # $0.5005 >= $0.50
    dog = watchdog.Watchdog(deadline=1000.0, budget_usd=None, price_per_hour=1.8, pod_started_at=0.0, on_limit=print)
    assert dog.check(1000.0 + watchdog.DEADLINE_GRACE_S - 1) is None  # the worker's own clean stop goes first
    assert "time limit" in dog.check(1000.0 + watchdog.DEADLINE_GRACE_S)


def test_the_thread_fires_once_even_while_the_main_thread_is_busy():
    now = [0.0]
    fired = []
    done = threading.Event()
    dog = watchdog.Watchdog(
        deadline=None,
        budget_usd=0.01,
        price_per_hour=36.0,
        pod_started_at=0.0,
        on_limit=lambda why: (fired.append(why), done.set()),
        clock=lambda: now[0],
        every_s=0.01,
    )
    dog.start()
    now[0] = 0.5  # $0.005
    assert not done.wait(0.1)
    now[0] = 1.0  # $0.01: the limit
    assert done.wait(5) and len(fired) == 1 and "money limit" in fired[0]


def _env(tmp_path, **kw):
    return {
        "HOME": str(tmp_path),
        "RUNPOD_POD_ID": "pod1",
        "AUTOSLM_RUN_ID": "r1",
        "AUTOSLM_SEED": "0",
        "AUTOSLM_ATTEMPT": "2",
        **kw,
    }


def test_starts_are_counted_on_the_pods_disk_and_a_loop_ends_the_pod(tmp_path):
    store = open_store((tmp_path / "store").as_uri())
    art = RunArtifacts(store, RunPaths("sft", "r1", 0))
    env = _env(tmp_path)
    logs = []
    for _ in range(watchdog.MAX_STARTS_IN_POD):
        dog = watchdog.start(env, None, art, logs.append, end_process=False, state_dir=tmp_path / "pod")
        assert dog is not None
        dog.stop()
    assert art.get_error() is None
    assert (
        watchdog.start(env, None, art, logs.append, end_process=False, state_dir=tmp_path / "pod") is None
    )  # one start too many
    err = art.get_error()
    assert err.retryable and f"failed {watchdog.MAX_STARTS_IN_POD} times in this pod" in err.message
    assert any("ending this pod" in line for line in logs)


def test_the_budget_is_what_is_left_shared_by_the_seeds(tmp_path):
    class Spec:
        seeds = [0, 1]

        class limits:
            max_usd = 1.0

        class compute:
            nodes = 1

    dog = watchdog.start(
        _env(tmp_path, AUTOSLM_SPENT_USD="0.40", AUTOSLM_PRICE_PER_HOUR="0.60"),
        Spec,
        None,
        print,
        end_process=False,
        state_dir=tmp_path / "pod",
    )
    dog.stop()
    assert dog.budget_usd == pytest.approx(0.30) and dog.price_per_hour == 0.60


@pytest.mark.parametrize(
    "exc, retryable",
    [
        (FileNotFoundError("data/train.jsonl"), False),  # missing data
        (FatalWorkerError("model 'x/y': cannot load it"), False),
        (StoreAuthError("token refused"), False),  # bad credentials
        (type("RepositoryNotFoundError", (OSError,), {})("404"), False),  # an unknown model or dataset repo
        (StoreUnavailable("timeout"), True),
        (RuntimeError("CUDA error: an illegal memory access"), True),
        (ConnectionResetError("peer"), True),
    ],
)
def test_what_a_restart_can_fix(exc, retryable):
    assert is_retryable(exc) is retryable


def test_max_usd_without_a_price_is_refused_naming_the_variable(tmp_path):
    class Spec:
        seeds = [0]

        class limits:
            max_usd = 1.0

    with pytest.raises(FatalWorkerError, match="AUTOSLM_PRICE_PER_HOUR"):
        watchdog.require_price(_env(tmp_path), Spec)
    watchdog.require_price(_env(tmp_path, AUTOSLM_PRICE_PER_HOUR="0.69"), Spec)  # a price: fine

    class NoLimit(Spec):
        class limits:
            max_usd = None

    watchdog.require_price(_env(tmp_path), NoLimit)  # no money limit: no price needed
