"""The background supervisor of a detached run: it ticks the run, under its lease, until the run ends.

    python -m autoslm.controller.daemon RUN_ID [--poll-s SECONDS]

A sweep's id in place of RUN_ID supervises the sweep: its runs, and the start of its queued members
(controller/sweeps.py), with one process for all of them. Runs and sweeps share one loop
(``supervise``): only what one look does differs.

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
meanwhile); exit while a create of its run may still land; run beside a second daemon for the same run;
forget its poll interval when it dies (a supervisor a command starts again polls as the first did).
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

    supervisor = open_home(log=_log)
    home, registry = supervisor.home, supervisor.registry
    if not _claim(home, args.run_id):
        _log(f"{args.run_id}: another supervisor runs already; exiting")
        return 0
    finished = False
    try:
        kind = _kind(supervisor, args.run_id)
        if isinstance(kind, str):
            _log(f"{args.run_id}: {kind} in {registry.path}; supervisor exits")
            return 1
        name, once, local = kind
        poll_s = args.poll_s or _remembered_poll(home, args.run_id) or DEFAULT_POLL_S["local" if local() else "cloud"]
        # Kept until the work is done: a supervisor started again after a crash polls as this one did.
        pollfile(home, args.run_id).write_text(f"{poll_s}\n")
        _log(f"{args.run_id}: supervising{name} (pid {os.getpid()}, every {poll_s:g}s)")
        code = supervise(registry, args.run_id, lambda: once(poll_s), poll_s)
        finished = code == 0
        return code
    finally:
        if running_pid(home, args.run_id) in (None, os.getpid()):
            pidfile(home, args.run_id).unlink(missing_ok=True)
            if finished:
                pollfile(home, args.run_id).unlink(missing_ok=True)


def _kind(supervisor, ref: str):
    """What the id names: (" the sweep" or "", one look returning None or how it ended, whether it runs
    here: asked only when no poll interval was given), or why nothing."""
    from autoslm.controller import sweeps

    registry = supervisor.registry
    rec = sweeps.SweepBook(registry).get(ref)
    if rec is not None:  # a sweep: one loop over its runs and the start of its queued members
        members = sweeps.SweepBook(registry).members(ref)
        return (" the sweep", lambda poll_s: sweeps.once(supervisor, ref, poll_s),
                lambda: bool(members) and _spec_is_local(members[0].spec_json))
    found = registry.find_runs(ref)
    if len(found) != 1:
        return "no such run" if not found else "ambiguous run id"
    run = found[0]
    return "", _run_once(supervisor, run), lambda: run.spec.compute.is_local


def _spec_is_local(spec_json: str) -> bool:
    from autoslm.spec import JobSpec

    return JobSpec.from_json(spec_json).compute.is_local


def _run_once(supervisor, run):
    """One look at a run: None while it needs watching, else how it ended. An ended run whose teardown
    has not gone through (a pod left, a create that may still land) is looked at again."""
    from autoslm.controller.state import holds_pod, run_state

    ended_looks = 0

    def once(_poll_s: float) -> str | None:
        nonlocal ended_looks
        replicas = supervisor.tick(run)
        state = run_state(replicas)
        if state.live:
            return None
        ended_looks += 1
        now = time.time()
        in_flight = any(not r.pod_id and holds_pod(r, now) for r in replicas)
        if any(holds_pod(r, now) for r in replicas) and (ended_looks < 30 or in_flight):
            return None  # ended, but a teardown has not gone through yet: keep at it
        error = next((r.error for r in replicas if r.error), None)
        return f"{state}" + (f" ({error})" if error else "")

    return once


def supervise(registry, name: str, once, poll_s: float, sleep=time.sleep) -> int:
    """The one loop of every background supervisor, a run's or a sweep's: ``once()`` until it says how
    the work ended (exit 0). A registry that is read-only, locked or unreadable is waited out and opened
    again (SQLite keeps a file it opened read-only so); a provider or store outage is logged and tried
    again; only a registry from a newer autoslm, a registry gone, or 60 unexpected errors in a row end it."""
    from autoslm.controller.registry import RegistryCorrupt, RegistryLocked, RegistryReadOnly
    from autoslm.errors import AutoslmError

    unexpected = 0
    stale = False  # the registry failed us: open it again before the next look
    said = None  # the registry trouble last logged (said once, not every poll)
    while True:
        try:
            if stale:
                registry.reopen()
                stale = False
            if not registry.path.exists():
                _log(f"{name}: the registry {registry.path} is gone; supervisor exits")
                return 1
            if registry.read_only:  # a newer autoslm wrote it: this one may not act on the work
                _log(f"{name}: the registry is from a newer autoslm (read-only here); supervisor exits")
                return 1
            if not registry.writable():
                raise RegistryReadOnly(f"the run registry {registry.path} is read-only now (it cannot be written)")
            ended = once()
        except (RegistryReadOnly, RegistryLocked, RegistryCorrupt) as e:
            # Not ours to fix, and no reason to stop: the pods still need watching once it is back.
            if str(e) != said:
                _log(f"{name}: {e}; waiting for it (every {poll_s:g}s)")
                said = str(e)
            stale = True
            sleep(poll_s)
            continue
        except AutoslmError as e:  # a provider or store outage: the work still needs us next time
            _log(f"{name}: {e}")
            sleep(poll_s)
            continue
        except Exception as e:  # noqa: BLE001 - an unexpected failure must not leave the work unwatched
            unexpected += 1
            stale = True
            _log(f"{name}: unexpected {type(e).__name__}: {e}")
            if unexpected >= 60:  # e.g. a registry damaged under us: say so and stop, gc still works
                _log(f"{name}: giving up after {unexpected} unexpected errors in a row; `autoslm gc` ends its pods")
                return 1
            sleep(max(poll_s, 5.0))
            continue
        unexpected = 0
        if said is not None:
            _log(f"{name}: the registry can be written again; supervising")
            said = None
        if ended is not None:
            _log(f"{name}: {ended}; supervisor exits")
            return 0
        sleep(poll_s)


if __name__ == "__main__":
    sys.exit(main())
