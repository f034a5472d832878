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
import contextlib
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
    """The pid of this run's live daemon (stopped or not), or None."""
    try:
        pid = int(pidfile(home, run_id).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if _is_daemon(pid, run_id) else None


def _is_daemon(pid: int, run_id: str) -> bool:
    """Whether ``pid`` is a live daemon of this run (not a zombie, not a reused pid)."""
    from autoslm.controller.registry import pid_state

    if pid_state(pid) in ("gone", "dead"):
        return False  # a zombie (killed, not yet reaped by the process that started it) supervises nothing
    proc = Path(f"/proc/{pid}")
    if not proc.is_dir():
        return True  # no /proc to ask (macOS): the signal is all we know
    try:
        cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
    except FileNotFoundError:
        return False  # it ended while we looked
    except OSError:
        return True
    return "autoslm.controller.daemon" in cmdline and run_id in cmdline  # else the pid was reused


def supervising(home: Path, run_id: str, registry, now: float) -> int | None:
    """The pid of the run's daemon if it supervises the run, else None: not when it is gone, stopped
    (SIGSTOP, a debugger), or holds the run's lease with a stale heartbeat, nor when it has not held
    the lease for longer than a start takes (a supervisor taken over, or hung before it ever looked)."""
    from autoslm.controller.registry import pid_state
    from autoslm.controller.supervisor import LEASE_HUNG_S, LEASE_STALE_S, LEASE_TTL_S

    pid = running_pid(home, run_id)
    if pid is None or pid_state(pid) == "stopped":
        return None
    info = registry.lease_info(run_id)
    if info is not None and info["pid"] == pid:
        return None if registry.lease_is_stale(run_id, LEASE_TTL_S, LEASE_STALE_S, LEASE_HUNG_S) else pid
    try:  # it holds no lease: starting (waiting to take over a stale holder), or it lost it
        since = pidfile(home, run_id).stat().st_mtime
    except OSError:
        return pid
    return pid if now - since < LEASE_HUNG_S + LEASE_STALE_S else None


def pollfile(home: Path, run_id: str) -> Path:
    return supervisor_dir(home) / f"{run_id}.poll"


def _remembered_poll(home: Path, run_id: str) -> float | None:
    """The poll interval the run's first supervisor was given, for one started again after a crash."""
    try:
        return float(pollfile(home, run_id).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def start(home: Path, run_id: str, poll_s: float | None = None, *, replace: bool = False) -> int:
    """Start the run's daemon unless one runs already (``replace``: even then, for one that no longer
    supervises: it takes the run's lease over once stale); returns its pid."""
    pid = running_pid(home, run_id)
    if pid is not None and not replace:
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
    write_pidfile(home, run_id, proc.pid)
    return proc.pid


def write_pidfile(home: Path, run_id: str, pid: int) -> None:
    """Name the run's daemon (atomically: a reader never sees half a pid)."""
    path = pidfile(home, run_id)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{pid}\n")
    os.replace(tmp, path)


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
        return _supervise_run(supervisor, run, poll_s)
    finally:
        with contextlib.suppress(Exception):  # a registry gone bad: the lease expires on its own
            supervisor.let_go(args.run_id)
        if running_pid(home, args.run_id) in (None, os.getpid()):
            pidfile(home, args.run_id).unlink(missing_ok=True)
            pollfile(home, args.run_id).unlink(missing_ok=True)


def _supervise_run(supervisor, run, poll_s: float) -> int:
    """Tick the run under its kept lease until it ends. Exits when another process took the lease
    over (a supervisor that froze and was replaced: it writes nothing more) or when another awake
    supervisor of this run holds it."""
    from autoslm.controller.registry import TERMINAL, LeaseLost, RegistryCorrupt, RegistryLocked, RegistryReadOnly, run_state
    from autoslm.errors import AutoslmError

    registry, home = supervisor.registry, supervisor.home
    ended_looks = unexpected = 0
    stale = False  # the registry failed us: open it again before the next tick
    said = None  # the registry trouble last logged (said once, not every poll)
    held = False
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
            replicas = supervisor.tick(run, keep=True)
        except LeaseLost:
            _log(f"{run.run_id}: another process took this run over while this supervisor was stalled; "
                 "exiting without acting on what it saw")
            return 0
        except (RegistryReadOnly, RegistryLocked, RegistryCorrupt) as e:
            # Not ours to fix, and no reason to stop: the pods still need watching once it is back.
            if str(e) != said:
                _log(f"{run.run_id}: {e}; waiting for it (every {poll_s:g}s)")
                said = str(e)
            stale = True
            if not _wait(supervisor, run.run_id, poll_s):
                return 0
            continue
        except AutoslmError as e:  # a provider or store outage: the run still needs us next time
            _log(f"{run.run_id}: {e}")
            if not _wait(supervisor, run.run_id, poll_s):
                return 0
            continue
        except Exception as e:  # noqa: BLE001 - an unexpected failure must not leave the run unwatched
            unexpected += 1
            stale = True
            _log(f"{run.run_id}: unexpected {type(e).__name__}: {e}")
            if unexpected >= 60:  # e.g. a registry damaged under us: say so and stop, gc still works
                _log(f"{run.run_id}: giving up after {unexpected} unexpected errors in a row; `autoslm gc` ends its pods")
                return 1
            if not _wait(supervisor, run.run_id, max(poll_s, 5.0)):
                return 0
            continue
        unexpected = 0
        if said is not None:
            _log(f"{run.run_id}: the registry can be written again; supervising")
            said = None
        if supervisor.holds(run.run_id) and not held:
            held = True
            write_pidfile(home, run.run_id, os.getpid())  # this one supervises now (maybe in place of a frozen one)
        elif not supervisor.holds(run.run_id):
            other = _awake_supervisor(registry, run.run_id)
            if other is not None:
                write_pidfile(home, run.run_id, other)
                _log(f"{run.run_id}: supervisor {other} holds the run and is awake; exiting")
                return 0
        state = run_state(replicas)
        now = time.time()
        # A create that may still land counts as a pod: it is adopted and ended when it does.
        pods_left = [r.pod_id or r.intent_name for r in replicas
                     if r.pod_id or (r.intent_name and r.intent_until and now < r.intent_until)]
        if state in TERMINAL:
            ended_looks += 1
        in_flight = any(not r.pod_id and r.intent_name and r.intent_until and now < r.intent_until for r in replicas)
        if state in TERMINAL and not (pods_left and (ended_looks < 30 or in_flight)):
            error = next((r.error for r in replicas if r.error), None)
            _log(f"{run.run_id}: {state}" + (f" ({error})" if error else "") + "; supervisor exits")
            return 0
        # (ended, but a teardown has not gone through yet: keep at it)
        if not _wait(supervisor, run.run_id, poll_s):
            return 0


def _wait(supervisor, run_id: str, poll_s: float) -> bool:
    """Sleep until the next look, beating the kept lease every LEASE_BEAT_S; False when it was taken over."""
    from autoslm.controller.registry import LeaseLost
    from autoslm.controller.supervisor import LEASE_BEAT_S

    end = time.monotonic() + poll_s
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return True
        time.sleep(min(left, LEASE_BEAT_S))
        try:
            if time.monotonic() < end:
                supervisor.beat(run_id)
        except LeaseLost:
            _log(f"{run_id}: another process took this run over while this supervisor was stalled; exiting")
            return False
        except Exception:  # noqa: BLE001 - a registry in trouble: the next tick says so
            pass


def _awake_supervisor(registry, run_id: str) -> int | None:
    """The pid of another supervisor of this run that holds its lease, awake and beating, or None."""
    from autoslm.controller.supervisor import LEASE_HUNG_S, LEASE_STALE_S, LEASE_TTL_S

    info = registry.lease_info(run_id)
    if not info or not info["standing"] or info["stopped"] or not info["pid"] or info["pid"] == os.getpid():
        return None
    if not _is_daemon(info["pid"], run_id) or registry.lease_is_stale(run_id, LEASE_TTL_S, LEASE_STALE_S, LEASE_HUNG_S):
        return None
    return info["pid"]


if __name__ == "__main__":
    sys.exit(main())
