"""The supervisor's one-actor rules, in process, against the fake RunPod (real provider, fake far end).

.venv/bin/python -m pytest tests/integration/test_supervisor_safety.py -q
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autoslm.controller.podnames import home_id, pod_name
from autoslm.controller.registry import RunRecord
from autoslm.errors import NoCapacity
from autoslm.providers.base import Offer, PodRequest
from autoslm.providers.http import RetryPolicy
from autoslm.providers.runpod.provider import RunPodProvider
from autoslm.sdk import Client
from autoslm.spec import JobSpec
from tests.fakes.pods import pod_request
from tests.fakes.runpod import fake_runpod  # noqa: F401 - pytest fixture

SLEEP = ["sleep", "60"]


class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _spec(tmp_path: Path, **limits) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "safe",
            "model": "autoslm/tiny",
            "environment": {"id": "autoslm/arith"},
            "train": {"method": "sft", "max_steps": 10},
            "compute": {"provider": "runpod", "gpu": "RTX 4090"},
            "artifacts": {"store": "local", "path": str(tmp_path / "store")},
            "limits": {"max_hours": 1, **limits},
        }
    )


class StealingProvider(RunPodProvider):
    """A RunPod whose create call is so slow that the run's lease expires and another process takes it."""

    steal = None
    on_status = None
    launches = 0  # creates asked of it

    def launch(self, request: PodRequest, offers: tuple[Offer, ...] | None = None):
        self.launches += 1
        handle = super().launch(request, offers)
        if self.steal:
            self.steal()
        return handle

    def status(self, handle):
        if self.on_status:
            self.on_status()
        return super().status(handle)


@pytest.fixture
def rig(fake_runpod, tmp_path):  # noqa: F811
    fake_runpod.worker_command = SLEEP
    rp = StealingProvider(fake_runpod.api_key, base_url=fake_runpod.url, retry=RetryPolicy(attempts=2, backoff_s=0.01))
    clock = Clock()
    client = Client(tmp_path / "home", providers=lambda name: rp, clock=clock)
    return fake_runpod, rp, clock, client


def _new_run(client: Client, spec: JobSpec, clock: Clock) -> RunRecord:
    run = RunRecord(
        run_id="safe-1",
        name="safe",
        phase="sft",
        spec_json=spec.to_json(),
        spec_path=None,
        store_uri=(Path(spec.artifacts.path)).resolve().as_uri(),
        created_at=clock(),
        deadline=clock() + 3600,
    )
    client.registry.create_run(run, spec.seeds)
    return run


def test_a_launch_that_lost_its_lease_terminates_its_own_pod(rig, tmp_path):
    fake, rp, clock, client = rig
    run = _new_run(client, _spec(tmp_path), clock)

    def steal():
        clock.t += 10_000  # our lease expired while the create was in flight
        assert client.registry.acquire_lease(run.run_id, "otherhost:1:x", ttl_s=600)

    rp.steal = steal
    client.supervisor.tick(run)
    (pod,) = fake.pods()
    assert pod.deleted, "the pod of a launch whose lease was taken over must not run beside the new holder's"
    (r,) = client.registry.replicas(run.run_id)
    assert r.pod_id is None and r.intent_name == pod.name  # the new holder finds the name and decides


def test_an_intent_whose_create_landed_is_adopted_not_doubled(rig, tmp_path):
    fake, rp, clock, client = rig
    run = _new_run(client, _spec(tmp_path), clock)
    name = pod_name(home_id(client.home), run.run_id, 0, 1)
    # A launch that crashed between the create call and recording its answer:
    client.registry.set_intent(run.run_id, 0, provider="runpod", name=name, attempt=1)
    rp.launch(pod_request(name, SLEEP, gpu_types=("RTX 4090",)))
    client.supervisor.tick(run)
    (r,) = client.registry.replicas(run.run_id)
    assert len(fake.pods()) == 1 and r.pod_id == fake.pods()[0].id and r.intent_name is None and r.attempt == 1


def test_an_intent_whose_create_never_landed_is_created_under_the_same_name(rig, tmp_path):
    fake, rp, clock, client = rig
    run = _new_run(client, _spec(tmp_path), clock)
    name = pod_name(home_id(client.home), run.run_id, 0, 1)
    client.registry.set_intent(run.run_id, 0, provider="runpod", name=name, attempt=1)
    client.supervisor.tick(run)
    (pod,) = fake.pods()
    assert pod.name == name  # same attempt, same name: a late create would have been adopted by name


def test_bill_then_decide_the_money_limit_counts_this_ticks_bill(rig, tmp_path):
    fake, rp, clock, client = rig
    run = _new_run(client, _spec(tmp_path, max_usd=0.5), clock)
    client.supervisor.tick(run)  # launches at $0.69/h
    clock.t += 3600 * 0.5 / 0.69 + 1  # just past $0.50 since the last look
    client.supervisor.tick(run)
    (r,) = client.registry.replicas(run.run_id)
    assert r.state == "failed" and "money limit" in r.error and r.cost_usd >= 0.5, (r.state, r.error, r.cost_usd)
    assert r.end_reason == "money_limit"  # stored beside the state
    assert all(p.deleted for p in fake.pods())


def test_cancel_arriving_during_the_create_terminates_the_new_pod(rig, tmp_path):
    fake, rp, clock, client = rig
    run = _new_run(client, _spec(tmp_path), clock)
    rp.steal = lambda: client.registry.request_cancel(run.run_id)  # the cancel lands while the create runs
    client.supervisor.tick(run)
    (r,) = client.registry.replicas(run.run_id)
    assert r.state == "cancelled" and r.pod_id is None and all(p.deleted for p in fake.pods())


class Statements:
    """Every statement the registry's connection runs (SQLite's own trace), grouped by transaction."""

    def __init__(self, registry):
        self.log: list[str] = []
        registry._db.set_trace_callback(self.log.append)

    def transactions(self) -> tuple[list[list[str]], list[str]]:
        """(the transactions, each its statements; the table statements run outside any transaction)."""
        txs, loose, current = [], [], None
        for stmt in (s.strip() for s in self.log):
            word = stmt.split()[0].upper()
            if word == "BEGIN":
                current = []
            elif word in ("COMMIT", "ROLLBACK"):
                txs.append(current)
                current = None
            elif current is not None:
                current.append(stmt)
            elif word != "PRAGMA":  # PRAGMA user_version: the file's version, asked of its header
                loose.append(stmt)
        return txs, loose


def _touches(stmts: list[str], verb: str, table: str) -> bool:
    return any(s.upper().startswith(verb) and f" {table} " in f" {s} " for s in stmts)


def test_a_tick_reads_the_registry_once_and_writes_its_decisions_in_one_transaction(rig, tmp_path):
    fake, rp, clock, client = rig
    run = _new_run(client, _spec(tmp_path), clock)
    sup = client.supervisor
    sup.tick(run)  # launches
    clock.t += 30
    trace = Statements(client.registry)
    sup.tick(run)  # a steady look: bill, progress, nothing to do
    (look, write), loose = trace.transactions()
    assert loose == []
    # The one read: the lease taken, and the run, its replicas and its ended pods read with it.
    assert all(_touches(look, "SELECT", t) for t in ("runs", "replicas", "ended_pods")) and not _touches(
        look, "UPDATE", "replicas"
    )
    # The one write: the decisions (here, the bill), fenced by the lease, which it lets go.
    assert _touches(write, "UPDATE", "replicas") and not _touches(write, "SELECT", "replicas")
    assert _touches(write, "SELECT", "leases") and _touches(write, "UPDATE", "leases")
    (r,) = client.registry.replicas(run.run_id)
    assert r.cost_usd > 0 and client.registry.lease_owner(run.run_id) is None

    # A preempted pod: its terminate and relaunch. Still one read; the decisions with the new pod's
    # intent in one write (ahead of the create), the create's outcome in the tick's last; between them
    # only the checks that must be fresh (the lease before each provider action, the cancel flag
    # right before and after the create).
    fake.preempt(r.pod_id)
    clock.t += 30
    trace = Statements(client.registry)
    sup.tick(run)
    txs, loose = trace.transactions()
    assert len(txs) == 3 and sum(_touches(tx, "SELECT", "replicas") for tx in txs) == 1, trace.log
    assert all(s.startswith("SELECT") and ("FROM leases" in s or "FROM runs" in s) for s in loose), loose
    (r2,) = client.registry.replicas(run.run_id)
    assert r2.pod_id not in (None, r.pod_id) and r2.restarts == 1


class SpecParses:
    """How many JobSpecs this thread builds from JSON or a dict: the calls into JobSpec's pydantic
    validator, as the interpreter's profiler sees them (every way to build one goes through it)."""

    def __enter__(self):
        validator, self.count = JobSpec.__pydantic_validator__, 0

        def seen(_frame, event, arg):
            if event == "c_call" and getattr(arg, "__self__", None) is validator:
                self.count += 1

        self._before = sys.getprofile()
        sys.setprofile(seen)
        return self

    def __exit__(self, *exc):
        sys.setprofile(self._before)


def test_a_runs_jobspec_is_parsed_once_per_record_through_launch_relaunch_and_teardown(rig, tmp_path):
    fake, rp, clock, client = rig
    run = _new_run(client, _spec(tmp_path), clock)
    sup = client.supervisor
    with SpecParses() as launch:
        sup.tick(run)  # looks, plans the offers, builds the pod spec, creates, prices
    (r,) = client.registry.replicas(run.run_id)
    assert r.pod_id and launch.count == 1, launch.count
    clock.t += 30
    with SpecParses() as steady:
        sup.tick(run)  # the same record: its spec is parsed already
    fake.preempt(r.pod_id)
    clock.t += 30
    with SpecParses() as relaunch:
        sup.tick(run)  # terminate, plan again on what is left, create again
    (r2,) = client.registry.replicas(run.run_id)
    assert r2.restarts == 1 and (steady.count, relaunch.count) == (0, 0), (steady.count, relaunch.count)
    again = client.registry.get_run(run.run_id)  # a record read anew parses once, wherever it goes
    with SpecParses() as teardown:
        sup.tick(again)
        sup.abort_launch(again, "the test ends it")
    assert teardown.count == 1 and all(p.deleted for p in fake.pods()), teardown.count


def test_a_tick_taken_over_while_it_looked_acts_on_nothing_and_writes_nothing(rig, tmp_path):
    fake, rp, clock, client = rig
    run = _new_run(client, _spec(tmp_path), clock)
    client.supervisor.tick(run)
    (before,) = client.registry.replicas(run.run_id)

    def steal():  # it stalled in its look past LEASE_HUNG_S (and past the deadline): another takes over
        clock.t += 10_000
        assert client.registry.take_lease(run.run_id, "otherhost:1:x", ttl_s=600, hung_s=120)

    rp.on_status = steal
    client.supervisor.tick(run)  # it resumes and decides on what it saw: the deadline passed, end the pod
    assert client.supervisor.acted and client.supervisor.lost
    (after,) = client.registry.replicas(run.run_id)
    assert after == before, "a stale holder's bill and state must not land"
    assert [p for p in fake.pods() if not p.deleted], "a stale holder must not end the pod the new holder keeps"


def test_an_attempt_number_rises_only_when_a_pod_is_created(rig, tmp_path):
    """While no offer is usable, each look tries again under the same attempt: pod names and
    AUTOSLM_ATTEMPT count pods created, not looks."""
    fake, rp, clock, client = rig
    run = _new_run(client, _spec(tmp_path), clock)
    client.supervisor.tick(run)
    (first,) = fake.pods()
    fake.no_capacity(True)
    fake.preempt(first.id, terminate=True)
    for _ in range(5):
        clock.t += 30
        client.supervisor.tick(run)
        (r,) = client.registry.replicas(run.run_id)
        assert r.state == "recovering" and r.pod_id is None and r.attempt == 1, (r.state, r.attempt, r.error)
    fake.no_capacity(False)
    clock.t += 30
    client.supervisor.tick(run)
    (r,) = client.registry.replicas(run.run_id)
    second = next(p for p in fake.pods() if p.id != first.id)
    assert r.attempt == 2 and r.pod_id == second.id and second.name == pod_name(home_id(client.home), run.run_id, 0, 2)


def test_a_sweep_member_that_meets_no_usable_offer_waits_as_a_relaunch_does(rig, tmp_path):
    from autoslm.controller import sweeps
    from autoslm.controller.sweeps import Member, SweepBook, SweepRecord

    fake, rp, clock, client = rig
    spec = _spec(tmp_path)
    book = SweepBook(client.registry)
    book.create(
        SweepRecord("sw-1", "safe", None, "[]", max_parallel=1, max_usd=None, created_at=clock()),
        [Member("sw-1", 0, 0, 0, "{}", spec.to_json(), Path(spec.artifacts.path).resolve().as_uri(), "sw-1-m0")],
    )
    fake.no_capacity(True)
    for _ in range(3):
        assert sweeps.step(client.supervisor, "sw-1")
        (r,) = client.registry.replicas("sw-1-m0")
        assert r.state == "pending" and r.pod_id is None and r.error is None and r.attempt == 0, (r.state, r.error)
        clock.t += 30
    assert not fake.pods() and book.get("sw-1").stopped is None
    fake.no_capacity(False)
    assert sweeps.step(client.supervisor, "sw-1")
    (r,) = client.registry.replicas("sw-1-m0")
    (pod,) = fake.pods()
    assert r.pod_id == pod.id and r.attempt == 1 and r.state == "provisioning"
    # A run a user launches still hears at once that nothing can be rented.
    fake.no_capacity(True)
    run = _new_run(client, spec, clock)
    with pytest.raises(NoCapacity):
        client.supervisor.tick(run)
    (r,) = client.registry.replicas(run.run_id)
    assert r.state == "failed" and r.end_reason == "launch_failed"


def test_when_every_offer_is_over_the_money_limit_the_one_hint_names_it(rig, tmp_path):
    fake, rp, clock, client = rig
    run = _new_run(client, _spec(tmp_path, max_usd=0.0001), clock)
    with pytest.raises(NoCapacity) as e:
        client.supervisor.tick(run)
    assert "limits.max_usd" in e.value.hint and e.value.hint not in e.value.message, str(e.value)
    assert ") (" not in str(e.value)  # one hint, not two run together
    assert not fake.pods() and rp.launches == 0, "placement found nothing usable: the provider is not asked to create"
