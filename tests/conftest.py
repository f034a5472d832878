"""Shared test fixtures: an isolated AUTOSLM_HOME and a way to run the real CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import dealing

# The fake Hub speaks plain LFS, not xet; huggingface_hub reads this once, at import.
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# No test asks a real container registry whether the worker image is published (compute.image =
# "auto"): nothing listens here, so the answer is "cannot tell" -> bootstrap. Tests that need the
# published image point this at tests/fakes/container_registry.py.
os.environ.setdefault("AUTOSLM_REGISTRY_URL", "http://127.0.0.1:9")

REPO = Path(__file__).resolve().parents[1]
# Tests build the offline model once per session into this cache and share it.
_MODEL_CACHE = None


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("AUTOSLM_HOME", str(h))
    models = shared_models_dir(tmp_path)
    (h / "models").symlink_to(models, target_is_directory=True)
    return h


def shared_models_dir(tmp_path: Path) -> Path:
    global _MODEL_CACHE
    if _MODEL_CACHE is None:
        _MODEL_CACHE = Path(os.environ.get("AUTOSLM_TEST_MODELS") or tmp_path.parent.parent / "autoslm-models")
        _MODEL_CACHE.mkdir(parents=True, exist_ok=True)
    return _MODEL_CACHE


@pytest.fixture
def cli(home):
    """Run `python -m autoslm ARGS` with the test's AUTOSLM_HOME; returns code/stdout/stderr."""

    def run(*args: str, env: dict | None = None, timeout: float = 600, input: str | None = None) -> CliResult:
        # PYTHONPATH: a worker the local provider starts (cwd = AUTOSLM_HOME) imports this checkout too.
        full_env = {**os.environ, "AUTOSLM_HOME": str(home), "PYTHONPATH": str(REPO), **(env or {})}
        p = subprocess.run(
            [sys.executable, "-m", "autoslm", *args],
            capture_output=True,
            text=True,
            env=full_env,
            timeout=timeout,
            cwd=str(REPO),
            input=input,
        )
        return CliResult(p.returncode, p.stdout, p.stderr)

    run.home = home  # where a wait reads the run between the CLI's looks (tests/e2e/test_sft_local.py)
    return run


def write_spec(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def edited_spec(source: Path, edits, path: Path) -> Path:
    """``source`` (a shipped jobspec) written to ``path`` with each (old, new) edit made once; an old text
    the jobspec no longer has fails here, naming it, rather than leaving the edit silently undone."""
    text = source.read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    return write_spec(path, text)


# Longest first: `make test` runs tests side by side (pytest-xdist, --dist worksteal, each worker's
# slice ordered by tests/dealing.py), and a run of minutes started last would finish the suite alone.
# `long` (runs of several minutes: make test-long's), then the other end-to-end runs and the chaos
# scenarios, then the rest, each group in its collection order.
def _rank(item) -> int:
    if item.get_closest_marker("long"):
        return 0
    if item.get_closest_marker("e2e") or item.get_closest_marker("pod") or "/chaos/" in item.path.as_posix():
        return 1
    return 2


def pytest_addoption(parser):
    parser.addoption(
        "--shuffle",
        metavar="SEED",
        default=os.environ.get("AUTOSLM_TEST_SHUFFLE") or None,
        help="run the tests in a random order drawn from SEED (or $AUTOSLM_TEST_SHUFFLE): the modules, and the "
        "tests inside each module, shuffled; the longest still first. Proves that no test needs another to have "
        "run before it. Every xdist worker draws the same order from the same seed.",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """``$AUTOSLM_TEST_BASETEMP``: every stack's temporary directories under that directory, one folder per
    stack (``make test`` runs three pytest sessions at once, and pytest empties its --basetemp on start).
    With a long directory it proves that no test depends on how long the machine's paths are."""
    root = os.environ.get("AUTOSLM_TEST_BASETEMP")
    if root and not config.option.basetemp and not hasattr(config, "workerinput"):
        os.makedirs(root, exist_ok=True)
        config.option.basetemp = os.path.join(root, os.path.basename(sys.prefix))


def shuffled(items: list, seed: str) -> list:
    """``items`` with the modules in a random order and each module's tests shuffled inside it (a module's
    fixtures stay set up once), reproducible from ``seed``."""
    import random

    rng = random.Random(seed)
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.path.as_posix(), []).append(item)
    order = list(modules)
    rng.shuffle(order)
    out = []
    for name in order:
        group = modules[name]
        rng.shuffle(group)
        out += group
    return out


def _guess(item) -> float:
    """Seconds a test the durations table does not know may take (tests/dealing.py)."""
    return dealing.GUESS[("long", "e2e", "unit")[_rank(item)]]


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected: worksteal slices what is left
def pytest_collection_modifyitems(config, items):
    seed = config.getoption("--shuffle")
    if seed is not None:
        items[:] = shuffled(items, seed)
    items.sort(key=_rank)  # stable: the shuffled order stays within each rank
    # Under xdist's worksteal, each worker's slice starts with its share of the long runs (tests/dealing.py).
    # A worker's own --dist is "no": the controller's command line says how it deals.
    worker = getattr(config, "workerinput", {})
    argv = worker.get("mainargv", [])
    if worker.get("workercount", 0) > 1 and ("worksteal" in argv or "--dist=worksteal" in argv):
        items[:] = dealing.dealt(items, worker["workercount"], dealing.measured(), _guess)


def pytest_report_header(config):
    seed = config.getoption("--shuffle")
    return f"tests shuffled with seed {seed} (--shuffle)" if seed is not None else None


def backoff(first: float = 1.5, cap: float = 10.0, factor: float = 1.5):
    """Pauses between polls of the real CLI: quick at first, then every ``cap`` seconds. Each `autoslm
    status` is a Python process (0.4 CPU-s alone, 0.75 among make test's other work, where about 300 of
    them were a fifteenth of the suite's CPU), so a run of minutes polled every half second would spend a
    core of its own beside the run it waits for. Nothing a test waits for (a worker's start, a step, a
    run's end) comes within a second and a half; polled every 10 s once it has run for twenty, a wait of
    a minute costs 9 polls (0.5 s then 8 s: 13) and ends at most 10 s late, while the suite's other tests
    use the cores."""
    delay = first
    while True:
        yield delay
        delay = min(delay * factor, cap)


# Waits for its go file (argv[1]): processes started one by one then act at the same moment.
_AT_ONCE = """import sys, time
from pathlib import Path
while not Path(sys.argv[1]).exists():
    time.sleep(0.002)
"""


def at_once(tmp_path: Path, body: str, *args: str, processes: int = 6) -> list[str]:
    """Run ``body`` (Python; its arguments are ``sys.argv[2:]``) in ``processes`` processes that start
    it at the same moment, as commands started together do; their stdouts, once all have exited 0."""
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _AT_ONCE + body, str(go), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(processes)
    ]
    go.touch()
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs if err]
    return [out for out, _ in outs]


def spawn_in_pty(args: list[str], env: dict, cols: int = 100, rows: int = 30) -> tuple[int, int]:
    """The real CLI (``autoslm *args``) on a terminal of its own, ``cols`` x ``rows``: its pid and the
    terminal's fd, which the caller reads and closes."""
    import fcntl
    import pty
    import struct
    import termios

    pid, fd = pty.fork()
    if pid == 0:  # the child: the real CLI, on a terminal
        os.chdir(REPO)
        os.execvpe(sys.executable, [sys.executable, "-m", "autoslm", *args], env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    return pid, fd
