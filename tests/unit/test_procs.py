"""procs.Starting: a signal whose handler raises while a child is being started still leaves the caller
that child, to end. A child's preexec_fn holds its start open (Popen returns once the child has exec'd),
so that the signal comes while the parent waits inside Popen, as a pod's SIGTERM can."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from autoslm.procs import GONE, Starting, pid_state

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


class Stopped(BaseException):
    pass


def hold_the_start() -> None:  # in the child, between fork and exec
    time.sleep(1.0)


def sigterm_during(start) -> object:
    """Call ``start()`` with a SIGTERM arriving 0.2 s in, whose handler raises ``Stopped``; returns what
    ``start`` returned, or the ``Stopped`` it raised."""

    def raise_stopped(signum, frame):
        raise Stopped()

    previous = signal.signal(signal.SIGTERM, raise_stopped)
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM))
    try:
        timer.start()
        try:
            got = start()
            time.sleep(2)  # not reached where the signal came inside start()
            return got
        except Stopped as e:
            return e
    finally:
        timer.cancel()
        signal.signal(signal.SIGTERM, previous)


def end(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=30)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # preexec_fn beside threads: this test's own child
def test_a_signal_raised_mid_start_leaves_the_child_with_the_caller():
    starting = Starting(SLEEPER, preexec_fn=hold_the_start, start_new_session=True)
    got = sigterm_during(starting.started)
    assert isinstance(got, Stopped)  # the handler raised while the start was under way
    proc = starting.process()
    assert proc is not None and pid_state(proc.pid) != GONE, "the started child is known to the caller"
    end(proc)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_popen_on_the_main_thread_loses_the_child_that_starting_keeps():
    """Why Starting exists: the same signal inside a plain Popen raises out of it, the child forked."""
    before = set(children())
    got = sigterm_during(lambda: subprocess.Popen(SLEEPER, preexec_fn=hold_the_start, start_new_session=True))
    assert isinstance(got, Stopped)
    lost = set(children()) - before
    assert lost, "Popen raised after forking: a child runs that the caller has no handle on"
    for pid in lost:
        os.kill(pid, signal.SIGKILL)


def test_a_failed_start_raises_in_the_caller_and_leaves_no_process():
    starting = Starting(["/nonexistent/autoslm-test-binary"])
    with pytest.raises(FileNotFoundError):
        starting.started()
    assert starting.process() is None


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
