"""procs.Starting: a signal whose handler raises while a child is being started still leaves the caller
that child, to end, and one that comes before the start began keeps it from beginning. A child's
preexec_fn says it was forked (a file) and holds its start open (Popen returns once the child has
exec'd), so that the signal comes while the parent waits inside Popen, as a pod's SIGTERM can."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from autoslm.procs import GONE, Starting, pid_state

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


class Stopped(BaseException):
    pass


def holding_the_start(forked: Path):
    """A preexec_fn: in the child, between fork and exec, say so (``forked``) and wait until the parent's
    signal was sent (``forked.sent``), however slowly a loaded machine runs the thread that sends it."""
    sent = forked.with_suffix(".sent")

    def hold() -> None:
        forked.touch()
        until = time.monotonic() + 60
        while not sent.exists() and time.monotonic() < until:
            time.sleep(0.01)

    return hold


def sigterm_during(start, forked: Path) -> object:
    """Call ``start()`` with a SIGTERM, whose handler raises ``Stopped``, sent once the child is forked
    (``forked`` exists) and before it may exec; returns what ``start`` returned, or the ``Stopped`` it raised."""

    def raise_stopped(signum, frame):
        raise Stopped()

    def signal_once_forked() -> None:
        until = time.monotonic() + 60
        while not forked.exists() and time.monotonic() < until:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)
        forked.with_suffix(".sent").touch()

    previous = signal.signal(signal.SIGTERM, raise_stopped)
    sender = threading.Thread(target=signal_once_forked, daemon=True)
    try:
        sender.start()
        try:
            return start()
        except Stopped as e:
            return e
    finally:
        while sender.is_alive():  # its signal comes to this handler, not to the next test
            try:
                time.sleep(0.01)
            except Stopped:
                pass
        signal.signal(signal.SIGTERM, previous)


def end(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=30)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # preexec_fn beside threads: this test's own child
def test_a_signal_raised_mid_start_leaves_the_child_with_the_caller(tmp_path):
    forked = tmp_path / "forked"
    starting = Starting(SLEEPER, preexec_fn=holding_the_start(forked), start_new_session=True)
    got = sigterm_during(lambda: starting.begin().started(), forked)
    assert isinstance(got, Stopped)  # the handler raised while the start was under way
    proc = starting.process()
    assert proc is not None and pid_state(proc.pid) != GONE, "the started child is known to the caller"
    end(proc)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_popen_on_the_main_thread_loses_the_child_that_starting_keeps(tmp_path):
    """Why Starting exists: the same signal inside a plain Popen raises out of it, the child forked.

    Where the parent's main thread still runs the interpreter's own after-fork hooks when the signal
    comes, the handler runs inside them and Python swallows its exception ("Exception ignored"): that
    Popen returns its child. A loaded machine can make that happen; the next try, with a new child, is
    made then (the one signal that lands inside Popen proper is what this test shows)."""
    for attempt in range(5):
        forked = tmp_path / f"forked{attempt}"
        before = set(children())
        hold = holding_the_start(forked)
        got = sigterm_during(lambda hold=hold: subprocess.Popen(SLEEPER, preexec_fn=hold, start_new_session=True), forked)
        if isinstance(got, Stopped):
            break
        end(got)  # swallowed in an after-fork hook: Popen returned the child; again
    assert isinstance(got, Stopped)
    lost = set(children()) - before
    assert lost, "Popen raised after forking: a child runs that the caller has no handle on"
    for pid in lost:
        os.kill(pid, signal.SIGKILL)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass  # reaped already (subprocess reaps what its half-built Popen left)


def test_a_failed_start_raises_in_the_caller_and_leaves_no_process():
    starting = Starting(["/nonexistent/autoslm-test-binary"]).begin()
    with pytest.raises(FileNotFoundError):
        starting.started()
    assert starting.process() is None


def test_a_start_given_up_before_it_began_never_begins():
    """The signal came before the start's thread ran: the handler's path gets None, and no child follows."""
    before = set(children())
    starting = Starting(SLEEPER, start_new_session=True)
    assert starting.process() is None
    starting.begin()
    with pytest.raises(AssertionError, match="gave the start up"):
        starting.started()  # returns once the thread has run: it started nothing
    assert set(children()) - before == set(), "a start given up before it began started a child"


def children() -> list[int]:
    """This process's child pids (from /proc)."""
    me, out = str(os.getpid()), []
    for stat in os.listdir("/proc"):
        if not stat.isdigit():
            continue
        try:
            with open(f"/proc/{stat}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[1] == me:
                    out.append(int(stat))
        except (OSError, IndexError):
            continue
    return out
