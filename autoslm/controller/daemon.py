"""The background supervisor of a detached run: it ticks the run, under its lease, until the run ends.

    python -m autoslm.controller.daemon RUN_ID [--poll-s SECONDS]

A sweep's id in place of RUN_ID supervises the sweep: its runs, and the start of its queued members
(controller/sweeps.py), with one process for all of them.

``autoslm launch --detach`` (and the SDK's ``launch(detach=True)``, and a Ctrl-C that detaches a
followed launch) starts one per run, in a session of its own (``start_new_session``): closing the
terminal or the laptop's lid does not end it, and neither does the shell's SIGHUP. It keeps a pidfile
and a log under ``$AUTOSLM_HOME/supervisors/``. So the deadline, ``max_usd``, hung-worker and
relaunch decisions happen while no command runs. Commands still tick too, under the same lease: the
daemon is the guarantee, not the only actor. At most one daemon per run (the pidfile says which).

It must never: exit while its run is live because a provider or the store failed once (it logs and
tries again next poll); die of a registry that turned read-only, locked or unreadable (it says so,
keeps polling, and opens the file again: SQLite keeps a file it opened read-only so, even once it is
writable; the first tick after that adopts or ends, from the providers' lists, whatever was created
meanwhile); exit while a create of its run may still land; run beside a second daemon for the same run.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_POLL_S = {"local": 1.0, "cloud": 10.0}


def supervisor_dir(home: Path) -> Path:
    return Path(home) / "supervisors"


def pidfile(home: Path, run_id: str) -> Path:
    return supervisor_dir(home) / f"{run_id}.pid"


def logfile(home: Path, run_id: str) -> Path:
    return supervisor_dir(home) / f"{run_id}.log"


def running_pid(home: Path, run_id: str) -> int | None:
    """The pid of this run's live daemon, or None."""
    try:
        pid = int(pidfile(home, run_id).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    proc = Path(f"/proc/{pid}")
    if not proc.is_dir():
        return pid  # no /proc to ask (macOS): the signal is all we know
    try:
        # A zombie (killed, not yet reaped by the process that started it) answers the signal, has an
        # empty cmdline, and supervises nothing.
        if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return None
        cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
    except FileNotFoundError:
        return None  # it ended while we looked
    except (OSError, IndexError):
        return pid
    if "autoslm.controller.daemon" not in cmdline or run_id not in cmdline:
        return None  # the pid was reused by something else (or is gone)
    return pid


def pollfile(home: Path, run_id: str) -> Path:
    return supervisor_dir(home) / f"{run_id}.poll"


def _remembered_poll(home: Path, run_id: str) -> float | None:
    """The poll interval the run's first supervisor was given, for one started again after a crash."""
    try:
        return float(pollfile(home, run_id).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def start(home: Path, run_id: str, poll_s: float | None = None) -> int:
    """Start the run's daemon unless one runs already; returns its pid."""
    pid = running_pid(home, run_id)
    if pid is not None:
        return pid
    supervisor_dir(home).mkdir(parents=True, exist_ok=True)
    if poll_s is None:
        poll_s = _remembered_poll(home, run_id)
    else:
        pollfile(home, run_id).write_text(f"{poll_s}\n")
    argv = [sys.executable, "-m", "autoslm.controller.daemon", run_id]
    if poll_s is not None:
        argv += ["--poll-s", str(poll_s)]
    env = {**os.environ, "AUTOSLM_HOME": str(home)}
    # The package must stay importable from the daemon's cwd (a source checkout run with -m from its root).
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with open(logfile(home, run_id), "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=str(home), start_new_session=True)
    # Written here, at once, so whoever looks next (a command, a test's cleanup) finds the daemon.
    pidfile(home, run_id).write_text(f"{proc.pid}\n")
    return proc.pid


def _log(msg: str) -> None:
    from autoslm.secrets import redact

    sys.stdout.write(time.strftime("%Y-%m-%d %H:%M:%S ") + redact(msg) + "\n")
    sys.stdout.flush()


def _claim(home: Path, run_id: str) -> bool:
    """Write our pidfile unless another live daemon holds it."""
    path = pidfile(home, run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            holder = running_pid(home, run_id)
            if holder == os.getpid():
                return True  # the parent wrote our pid when it started us
            if holder is not None:
                return False
            path.unlink(missing_ok=True)  # a dead daemon's pidfile
            continue
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}\n")
        return True
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autoslm.controller.daemon")
    parser.add_argument("run_id")
    parser.add_argument("--poll-s", type=float, default=None)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

    from autoslm.controller.home import open_home
    from autoslm.controller.registry import TERMINAL, RegistryCorrupt, RegistryLocked, RegistryReadOnly, run_state
    from autoslm.errors import AutoslmError

    supervisor = open_home(log=_log)
    home, registry = supervisor.home, supervisor.registry
    if not _claim(home, args.run_id):
        _log(f"{args.run_id}: another supervisor runs already; exiting")
        return 0
    try:
        from autoslm.controller import sweeps

        if sweeps.SweepBook(registry).get(args.run_id) is not None:  # a sweep: one loop over its runs
            poll_s = args.poll_s or DEFAULT_POLL_S["cloud"]
            _log(f"{args.run_id}: supervising the sweep (pid {os.getpid()}, every {poll_s:g}s)")
            return sweeps.supervise(supervisor, args.run_id, poll_s, _log)
        found = registry.find_runs(args.run_id)
        if len(found) != 1:
            _log(f"{args.run_id}: {'no such run' if not found else 'ambiguous run id'} in {registry.path}; supervisor exits")
            return 1
        run = found[0]
        poll_s = args.poll_s or DEFAULT_POLL_S["local" if run.spec.compute.providers == ["local"] else "cloud"]
        _log(f"{run.run_id}: supervising (pid {os.getpid()}, every {poll_s:g}s)")
        ended_looks = unexpected = 0
        stale = False  # the registry failed us: open it again before the next tick
        said = None  # the registry trouble last logged (said once, not every poll)
        while True:
            try:
                if stale:
                    registry.reopen()
                    stale = False
                if not registry.path.exists():
                    _log(f"{run.run_id}: the registry {registry.path} is gone; supervisor exits")
                    return 1
                if registry.read_only:  # a newer autoslm wrote it: this one may not act on the run
                    _log(f"{run.run_id}: the registry is from a newer autoslm (read-only here); supervisor exits")
                    return 1
                if not registry.writable():
                    raise RegistryReadOnly(f"the run registry {registry.path} is read-only now (it cannot be written)")
                replicas = supervisor.tick(run)
            except (RegistryReadOnly, RegistryLocked, RegistryCorrupt) as e:
                # Not ours to fix, and no reason to stop: the pods still need watching once it is back.
                if str(e) != said:
                    _log(f"{run.run_id}: {e}; waiting for it (every {poll_s:g}s)")
                    said = str(e)
                stale = True
                time.sleep(poll_s)
                continue
            except AutoslmError as e:  # a provider or store outage: the run still needs us next time
                _log(f"{run.run_id}: {e}")
                time.sleep(poll_s)
                continue
            except Exception as e:  # noqa: BLE001 - an unexpected failure must not leave the run unwatched
                unexpected += 1
                stale = True
                _log(f"{run.run_id}: unexpected {type(e).__name__}: {e}")
                if unexpected >= 60:  # e.g. a registry damaged under us: say so and stop, gc still works
                    _log(f"{run.run_id}: giving up after {unexpected} unexpected errors in a row; `autoslm gc` ends its pods")
                    return 1
                time.sleep(max(poll_s, 5.0))
                continue
            unexpected = 0
            if said is not None:
                _log(f"{run.run_id}: the registry can be written again; supervising")
                said = None
            state = run_state(replicas)
            now = time.time()
            # A create that may still land counts as a pod: it is adopted and ended when it does.
            pods_left = [r.pod_id or r.intent_name for r in replicas
                         if r.pod_id or (r.intent_name and r.intent_until and now < r.intent_until)]
            if state in TERMINAL:
                ended_looks += 1
            in_flight = any(not r.pod_id and r.intent_name and r.intent_until and now < r.intent_until for r in replicas)
            if state in TERMINAL and pods_left and (ended_looks < 30 or in_flight):
                time.sleep(poll_s)  # ended, but a teardown has not gone through yet: keep at it
                continue
            if state in TERMINAL:
                error = next((r.error for r in replicas if r.error), None)
                _log(f"{run.run_id}: {state}" + (f" ({error})" if error else "") + "; supervisor exits")
                return 0
            time.sleep(poll_s)
    finally:
        if running_pid(home, args.run_id) in (None, os.getpid()):
            pidfile(home, args.run_id).unlink(missing_ok=True)
            pollfile(home, args.run_id).unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
