"""What a process on this host is: gone, dead (a zombie, or exiting), stopped, or alive.

The one liveness check: the registry's leases, the supervisors' pidfiles and the local provider's
pods all ask it. Linux answers from ``/proc/PID/stat``; without /proc (macOS) a pid that answers a
signal is alive. And ``Starting``: a child started where a signal's handler may raise.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

GONE, DEAD, STOPPED, ALIVE = "gone", "dead", "stopped", "alive"


def pid_state(pid: int) -> str:
    """What a process on this host is: ``gone``, ``dead`` (a zombie not yet reaped, or exiting),
    ``stopped`` (SIGSTOP, ^Z, a debugger) or ``alive``. Without /proc (macOS) a live pid is alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return GONE
    except PermissionError:
        pass  # someone else's process: it exists
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return GONE if Path("/proc/self").exists() else ALIVE  # it ended while we looked, or no /proc
    except (OSError, IndexError):
        return ALIVE
    if state in ("Z", "X", "x"):
        return DEAD
    if state in ("T", "t"):
        return STOPPED
    return ALIVE


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` still runs (a zombie, which holds nothing, does not count):
    a process tree that must be gone, not only its leader. Without /proc, whether the group answers a signal."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[2] == str(pgid) and fields[0] != "Z":  # state, ppid, pgrp
            return True
    return False


class Starting:
    """``subprocess.Popen(argv, **kwargs)`` on a thread of its own, for a process that must be ended when
    a signal's handler raises (the worker's SIGTERM raises ``Preempted``).

    Python runs a handler in the main thread between two bytecodes, so one that raises can land inside
    ``Popen`` after the child was forked and before its object is returned: the child runs on, and no one
    knows its pid. So the caller holds this handle before anything starts, ``begin()``s the start inside
    its ``try``, and its handler's path calls ``process()``: that waits for a start under way and hands
    over its child, or stops a start that has not begun from ever beginning."""

    def __init__(self, argv: list[str], **kwargs) -> None:
        self._argv, self._kwargs = argv, kwargs
        self._proc: subprocess.Popen | None = None
        self._error: BaseException | None = None
        self._abandoned = False
        self._lock = threading.Lock()  # held by the start while Popen runs
        # An event, not Thread.join: a join that a handler's exception interrupts marks the thread ended
        # while it still runs (Python 3.11's threading), and the next join returns at once.
        self._done = threading.Event()

    def begin(self) -> Starting:
        threading.Thread(target=self._start, name="start-process", daemon=True).start()
        return self

    def _start(self) -> None:
        with self._lock:
            try:
                if not self._abandoned:
                    self._proc = subprocess.Popen(self._argv, **self._kwargs)
            except BaseException as e:  # noqa: BLE001 - raised in the caller's thread (started())
                self._error = e
            finally:
                self._done.set()

    def started(self) -> subprocess.Popen:
        """The running process, once started; raises what ``Popen`` raised."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._proc is not None, "started() after process() gave the start up"
        return self._proc

    def process(self) -> subprocess.Popen | None:
        """The child, once a start under way has finished; None where it failed or had not begun (it never
        will now): for the code that ends it."""
        with self._lock:
            self._abandoned = True
            return self._proc
