"""HfStore, through the real huggingface_hub client, against the fake Hub on 127.0.0.1.

Covers every RunArtifacts operation, what "not there" and "could not tell" look like (404s vs
429/5xx/hangs: a network error must never read as "not done"), retries, and that the token is sent
but never stored. Timeouts are short so the whole file stays fast.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from autoslm.engine.pod.uploader import Uploader
from autoslm.errors import StoreAuthError, StoreError, StoreUnavailable
from autoslm.layout import CHECKPOINT_MANIFEST, Event, Heartbeat, RunPaths
from autoslm.store import open_store
from autoslm.store.artifacts import ErrorRecord, RunArtifacts
from autoslm.store.hf import HfStore
from tests.fakes.hub import FAKE_HUB_TOKEN, FakeHub, fake_hub  # noqa: F401 - fake_hub is a fixture

pytestmark = pytest.mark.worker  # also runs on the worker image's pins (make test-image)

REPO = "autoslm-test/runs"
PATHS = RunPaths("sft", "run-1", 0)


class Sleeps:
    """Records the store's backoff sleeps instead of sleeping them (a retry is still a real request)."""

    def __init__(self):
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


@pytest.fixture
def sleeps():
    return Sleeps()


@pytest.fixture
def store(fake_hub, sleeps):
    return HfStore(
        REPO, token=FAKE_HUB_TOKEN, endpoint=fake_hub.endpoint, timeout=0.5, max_attempts=3, backoff_s=0.01, sleep=sleeps
    )


@pytest.fixture
def artifacts(store):
    return RunArtifacts(store, PATHS)


@pytest.fixture
def fake_hub_store_factory(fake_hub):
    def make(**kw):
        sleeps = Sleeps()
        kw = {"token": FAKE_HUB_TOKEN, "endpoint": fake_hub.endpoint, "timeout": 0.5, "backoff_s": 0.01, "sleep": sleeps, **kw}
        return HfStore(REPO, **kw), sleeps

    return make


def make_dir(root: Path, files: dict[str, bytes]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def checkpoint_dir(root: Path, step: int) -> Path:
    return make_dir(
        root / f"checkpoint-{step}",
        {
            "adapter_model.safetensors": os.urandom(3000),  # an LFS file: batch + PUT + verify
            "trainer_state.json": f'{{"global_step": {step}}}'.encode(),
            "optimizer/state.pt": os.urandom(500),
        },
    )


def test_round_trip_of_every_run_artifact_operation(fake_hub, artifacts, tmp_path):
    assert artifacts.get_heartbeat() is None and artifacts.read_events() == [] and not artifacts.is_done()

    artifacts.put_heartbeat(Heartbeat(run_id="run-1", seed=0, phase="sft", stage="training", step=4))
    assert artifacts.get_heartbeat().step == 4
    assert fake_hub.repo(REPO).private  # created on the first write, private by default

    artifacts.append_events([Event(kind="train_begin", step=0), Event(kind="step", step=1)])
    artifacts.append_events([Event(kind="step", step=2)])
    assert [(e.kind, e.step) for e in artifacts.read_events()] == [("train_begin", 0), ("step", 1), ("step", 2)]

    for step in (1, 2, 3):
        artifacts.put_checkpoint(step, checkpoint_dir(tmp_path / "out", step), keep=2)
    assert artifacts.list_checkpoints() == [2, 3]
    last = fake_hub.commits(REPO)[-1]  # adding 3 and deleting 1 is one commit
    assert f"{PATHS.checkpoint(3)}/{CHECKPOINT_MANIFEST}" in last.added
    assert last.deleted == [PATHS.checkpoint(1) + "/"]
    assert any(r.method == "PUT" and r.path.startswith("/_fake_lfs/") for r in fake_hub.requests)

    step, path = artifacts.fetch_latest_checkpoint(tmp_path / "resume")
    assert step == 3
    assert (path / "trainer_state.json").read_bytes() == b'{"global_step": 3}'
    assert (path / "optimizer/state.pt").read_bytes() == (tmp_path / "out/checkpoint-3/optimizer/state.pt").read_bytes()

    adapter = make_dir(tmp_path / "adapter", {"adapter_config.json": b"{}", "adapter_model.safetensors": os.urandom(999)})
    artifacts.put_adapter(adapter)
    assert artifacts.has_adapter()
    got = artifacts.fetch_adapter(tmp_path / "fetched")
    assert sorted(p.name for p in got.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert (got / "adapter_model.safetensors").read_bytes() == (adapter / "adapter_model.safetensors").read_bytes()

    artifacts.put_metrics({"eval_accuracy": 0.5})
    artifacts.put_train_meta({"max_steps": 3})
    assert artifacts.get_metrics() == {"eval_accuracy": 0.5}
    assert artifacts.get_json(PATHS.train_meta) == {"max_steps": 3}

    artifacts.put_error(ErrorRecord("CUDA out of memory", retryable=True, detail="trace"))
    err = artifacts.get_error()
    assert (err.message, err.retryable, err.detail) == ("CUDA out of memory", True, "trace")
    artifacts.clear_error()
    assert artifacts.get_error() is None
    n = len(fake_hub.commits(REPO))
    artifacts.clear_error()  # nothing to delete: no commit, no failure
    assert len(fake_hub.commits(REPO)) == n

    assert not artifacts.is_done()
    artifacts.mark_done()
    assert artifacts.is_done()


def test_latest_checkpoint_skips_a_corrupt_newest_one(fake_hub, artifacts, tmp_path):
    for step in (1, 2):
        artifacts.put_checkpoint(step, checkpoint_dir(tmp_path / "out", step), keep=3)
    fake_hub.corrupt(REPO, f"{PATHS.checkpoint(2)}/adapter_model.safetensors")
    step, path = artifacts.fetch_latest_checkpoint(tmp_path / "resume")
    assert step == 1 and path.name == "checkpoint-1"
    assert not (tmp_path / "resume" / "checkpoint-2").exists()


def test_missing_repo_and_missing_files_read_as_not_there(fake_hub, store, artifacts, tmp_path):
    assert fake_hub.repo(REPO) is None
    assert store.read_bytes("a/b.json") is None
    assert store.list_files("a") == []
    assert store.download("a", tmp_path / "dl") == tmp_path / "dl"
    assert not artifacts.is_done() and artifacts.fetch_latest_checkpoint(tmp_path / "r") is None
    store.ensure_repo()
    store.ensure_repo()  # exists already: fine
    assert store.read_bytes("a/b.json") is None and store.list_files("a") == []


def test_a_network_error_never_reads_as_not_done(fake_hub, store, artifacts):
    artifacts.mark_done()
    fake_hub.fail_next(3, status=503, match="/resolve/")
    with pytest.raises(StoreUnavailable):
        artifacts.is_done()
    assert artifacts.is_done()

    t0 = time.monotonic()
    fake_hub.hang_next(3, seconds=3, match="/resolve/")
    with pytest.raises(StoreUnavailable, match="timed out"):
        artifacts.is_done()
    assert time.monotonic() - t0 < 2.5  # 3 attempts x 0.5 s, not the 3 s hang
    fake_hub.clear_faults()
    assert artifacts.is_done()

    fake_hub.fail_next(3, status=500, match="/tree/")
    with pytest.raises(StoreUnavailable):
        artifacts.list_checkpoints()


def test_a_429_storm_then_success_honours_retry_after(fake_hub, fake_hub_store_factory):
    store, sleeps = fake_hub_store_factory(max_attempts=5)
    store.ensure_repo()
    fake_hub.fail_next(3, status=429, retry_after=1, match="/commit/")
    store.commit({"x/heartbeat.json": b"{}"})
    assert [c.added for c in fake_hub.commits(REPO)] == [["x/heartbeat.json"]]
    assert sleeps.calls and all(s >= 1 for s in sleeps.calls)  # Retry-After, not the 10 ms backoff

    # A Retry-After longer than the store will wait is handed to the caller (the uploader) at once.
    fake_hub.fail_next(1, status=429, retry_after=600, match="/commit/")
    with pytest.raises(StoreUnavailable) as info:
        store.commit({"x/heartbeat.json": b"{1}"})
    assert info.value.retry_after == 600


def test_5xx_on_commit_is_retried_then_raises(fake_hub, store, sleeps):
    store.ensure_repo()
    fake_hub.fail_next(1, status=502, match="/commit/")
    store.commit({"a.json": b"1"})
    assert len(fake_hub.commits(REPO)) == 1

    fake_hub.fail_next(10, status=500, match="/commit/")
    with pytest.raises(StoreUnavailable, match="HTTP 500"):
        store.commit({"a.json": b"2"})
    assert len([r for r in fake_hub.requests if r.path.endswith("/commit/main")]) == 1 + 1 + 3
    assert fake_hub.files(REPO)["a.json"] == b"1"


def test_a_hanging_commit_times_out_and_a_lost_answer_is_not_committed_twice(fake_hub, store):
    store.ensure_repo()
    fake_hub.hang_next(3, seconds=3, match="/commit/")
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailable, match="timed out"):
        store.commit({"a.json": b"1"})
    assert time.monotonic() - t0 < 2.5
    assert fake_hub.commits(REPO) == []
    fake_hub.clear_faults()

    store.commit({"old/x": b"x"})
    # The commit happens but its answer is lost: the retry finds nothing left to do.
    fake_hub.hang_next(1, seconds=1, match="/commit/", apply=True)
    store.commit({"a.json": b"2"}, ["old/"])
    assert [(c.added, c.deleted) for c in fake_hub.commits(REPO)] == [(["old/x"], []), (["a.json"], ["old/"])]


def test_deleting_missing_paths_does_not_fail_a_commit(fake_hub, store):
    store.commit({"keep/a": b"a"}, ["nothing/here/", "no/such/file"])
    store.commit({}, ["ghost/"])
    assert [c.added for c in fake_hub.commits(REPO)] == [["keep/a"]]
    store.commit({}, ["keep/"])
    assert fake_hub.commits(REPO)[-1].deleted == ["keep/"]
    assert store.list_files("keep") == []


def test_bad_or_missing_tokens_raise_auth_errors_without_the_token(fake_hub, store, monkeypatch):
    store.commit({"private.json": b"1"})
    wrong = "hf_WrongTokenWrongTokenWrong123"
    bad = HfStore(REPO, token=wrong, endpoint=fake_hub.endpoint, timeout=0.5)
    for call in (lambda: bad.read_bytes("private.json"), lambda: bad.commit({"x": b"1"}), lambda: bad.list_files("")):
        with pytest.raises(StoreAuthError) as info:
            call()
        assert wrong not in str(info.value)

    # No token at all: a private repo answers 401 "not found"; that is an auth problem, never "not there".
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    import huggingface_hub

    if huggingface_hub.get_token() is not None:
        pytest.skip("a saved Hugging Face login would be used")
    anonymous = HfStore(REPO, endpoint=fake_hub.endpoint, timeout=0.5)
    with pytest.raises(StoreAuthError):
        anonymous.read_bytes("private.json")


def test_the_token_is_sent_but_never_stored(fake_hub, artifacts, tmp_path):
    # The worker writes heartbeats and events through the uploader, which scrubs secrets from them.
    up = Uploader(artifacts, staging_dir=tmp_path / "staging", log=lambda m: None).start()
    up.heartbeat(Heartbeat(run_id="run-1", seed=0, phase="sft", stage="error", error=f"refused {FAKE_HUB_TOKEN}"))
    up.event(Event(kind="error", data={"message": f"401 with Authorization: Bearer {FAKE_HUB_TOKEN}"}))
    up.checkpoint(1, checkpoint_dir(tmp_path, 1), keep=1, final=True)
    up.required(artifacts.mark_done, "DONE", timeout=10)
    assert up.close(10)
    assert f"Bearer {FAKE_HUB_TOKEN}" in fake_hub.authorizations
    repo = fake_hub.repo(REPO)
    for commit in repo.history:
        for path, blob in commit.files.items():
            assert FAKE_HUB_TOKEN.encode() not in blob.content, path
    assert FAKE_HUB_TOKEN not in repr(artifacts.store)


def test_listing_follows_pages(tmp_path):
    with FakeHub(token=FAKE_HUB_TOKEN, page_size=3) as hub:
        store = HfStore(REPO, token=FAKE_HUB_TOKEN, endpoint=hub.endpoint, timeout=1.0)
        store.commit({f"p/f{i:02d}.json": b"{}" for i in range(10)})
        assert store.list_files("p") == [f"p/f{i:02d}.json" for i in range(10)]
        store.download("p", tmp_path / "dl")
        assert len(list((tmp_path / "dl").iterdir())) == 10
        assert sum(1 for r in hub.requests if "/tree/" in r.path) >= 4 * 2


def test_open_store_reads_the_endpoint_from_the_environment(fake_hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.endpoint)
    monkeypatch.setenv("HF_TOKEN", FAKE_HUB_TOKEN)
    store = open_store(f"hf://{REPO}", timeout=1.0)
    assert isinstance(store, HfStore) and store.uri == f"hf://{REPO}" and store.endpoint == fake_hub.endpoint
    store.commit({"a": b"1"})
    assert store.read_bytes("a") == b"1"


def test_the_library_downloads_what_the_store_wrote(fake_hub, store, tmp_path):
    # Fidelity of the fake: the client's own snapshot_download (repo info -> tree -> resolve).
    from huggingface_hub import snapshot_download

    store.commit({"a/x.json": b"{}", "a/w.safetensors": os.urandom(100)})
    local = snapshot_download(
        REPO, repo_type="dataset", endpoint=fake_hub.endpoint, token=FAKE_HUB_TOKEN, cache_dir=tmp_path / "cache"
    )
    assert (Path(local) / "a/x.json").read_bytes() == b"{}"


def test_the_uploader_over_the_hub(fake_hub, store, tmp_path):
    artifacts = RunArtifacts(store, PATHS)
    up = Uploader(artifacts, staging_dir=tmp_path / "staging", log=lambda m: None).start()
    for step in range(1, 6):
        up.heartbeat(Heartbeat(run_id="run-1", seed=0, phase="sft", stage="training", step=step))
        up.event(Event(kind="step", step=step))
    up.checkpoint(5, checkpoint_dir(tmp_path / "out", 5), keep=2, final=True)
    up.required(artifacts.mark_done, "DONE", timeout=10)
    assert up.close(10)
    assert artifacts.is_done() and artifacts.list_checkpoints() == [5]
    assert artifacts.get_heartbeat().step == 5
    assert [e.step for e in artifacts.read_events()] == [1, 2, 3, 4, 5]
    assert len(fake_hub.commits(REPO)) == up.commits <= 6


def test_without_create_a_missing_repo_is_an_error(fake_hub, fake_hub_store_factory):
    store, _ = fake_hub_store_factory(create=False)
    store.commit({}, ["nothing/"])  # deleting from a repo that is not there is not an error
    with pytest.raises(StoreError, match="does not exist"):
        store.commit({"a": b"1"})
    assert fake_hub.repo(REPO) is None


def test_a_rejected_commit_is_a_store_error_not_a_retry(fake_hub, store):
    store.ensure_repo()
    fake_hub.fail_next(5, status=400, match="/commit/", message="bad request")
    with pytest.raises(StoreError) as info:
        store.commit({"a": b"1"})
    assert not isinstance(info.value, StoreUnavailable)
    assert len([r for r in fake_hub.requests if r.path.endswith("/commit/main")]) == 1


def test_a_child_process_given_the_hub_env_writes_through_open_store(fake_hub, tmp_path):
    # What a worker launched by a fake provider sees: HF_ENDPOINT, HF_TOKEN, HF_HUB_DISABLE_XET.
    import subprocess
    import sys

    code = (
        "from autoslm.store import open_store\n"
        f"s = open_store('hf://{REPO}', timeout=5.0)\n"
        "s.commit({'child/w.safetensors': bytes(range(256)) * 8})\n"
    )
    env = {**os.environ, **fake_hub.env()}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60, cwd=str(Path(__file__).resolve().parents[2]))
    assert fake_hub.files(REPO)["child/w.safetensors"] == bytes(range(256)) * 8


def test_ensure_repo_follows_the_specs_private_setting(fake_hub, fake_hub_store_factory):
    store, _ = fake_hub_store_factory()
    store.ensure_repo(private=False)
    assert fake_hub.repo(REPO) is not None and not fake_hub.repo(REPO).private
