"""What a process on this host is: gone, dead (a zombie, or exiting), stopped, or alive.

The one liveness check: the registry's leases, the supervisors' pidfiles and the local provider's
pods all ask it. Linux answers from ``/proc/PID/stat``; without /proc (macOS) a pid that answers a
signal is alive.
"""

from __future__ import annotations

import os
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
