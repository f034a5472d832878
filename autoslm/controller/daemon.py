"""The background supervisor of a detached run: it ticks the run, under its lease, until the run ends
and its pods are gone (a succeeded run's pod may still run lm-eval after the hand-back: it is watched
until the worker exits or a limit ends it).

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

It supervises as the holder of the run's (or sweep's) supervisor lease (``role_key``, beside the
run's own lease in the registry), beaten every ``LEASE_BEAT_S``. A command that finds the daemon gone, stopped or
not beating starts another (``supervising``, ``start(replace=True)``), which takes that lease over
once stale; the old one, resumed, finds it taken (or a tick's lease taken while it looked) and exits
without acting on what it saw. A daemon that finds another one awake with the lease exits at once.

It must never: exit while its run is live because a provider or the store failed once (it logs and
tries again next poll); die of a registry that turned read-only, locked or unreadable (it says so,
keeps polling, and opens the file again: SQLite keeps a file it opened read-only so, even once it is
writable; the first tick after that adopts or ends, from the providers' lists, whatever was created
meanwhile); exit while a create of its run may still land; run beside a second daemon for the same run;
forget its poll interval when it dies (a supervisor a command starts again polls as the first did).
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


def role_key(run_id: str) -> str:
    """The key of a run's or sweep's supervisor lease (beside its action lease, in the same table): who
    supervises it."""
    return f"{run_id}#supervisor"


def supervising(home: Path, run_id: str, registry, now: float) -> int | None:
    """The pid of the run's daemon if it supervises the run, else None: not when it is gone, stopped
    (SIGSTOP, a debugger), or holds the run's supervisor lease with a stale heartbeat, nor when it has
    not held that lease for longer than a start takes (taken over, or hung before it ever looked)."""
    from autoslm.controller.registry import pid_state
    from autoslm.controller.tick import LEASE_HUNG_S, LEASE_STALE_S, LEASE_TTL_S

    pid = running_pid(home, run_id)
    if pid is None or pid_state(pid) == "stopped":
        return None
    info = registry.lease_info(role_key(run_id))
    if info is not None and info["pid"] == pid:
        return None if registry.lease_is_stale(role_key(run_id), LEASE_TTL_S, LEASE_STALE_S, LEASE_HUNG_S) else pid
    try:  # it holds no supervisor lease: starting (waiting to take over a stale holder), or it lost it
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
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(home), start_new_session=True
        )
    # Written here, at once, so whoever looks next (a command, a test's cleanup) finds the daemon.
    write_pidfile(home, run_id, proc.pid)
    return proc.pid


def write_pidfile(home: Path, run_id: str, pid: int) -> None:
    """Name the run's daemon (atomically: a reader never sees half a pid)."""
    from autoslm.store.atomic import write_atomic

    write_atomic(pidfile(home, run_id), f"{pid}\n".encode())


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
        # As the holder of its supervisor lease, which it beats while it waits (a sweep's steps also
        # run under the sweep's own lease, a run's ticks under the run's).
        role = _take_role(supervisor, args.run_id, poll_s)
        if role is None:
            return 0
        try:
            code = supervise(
                registry,
                args.run_id,
                lambda: _look_as(supervisor, role, once, poll_s, sweep=bool(name)),
                poll_s,
                sleep=lambda s: _wait(role, s) or _stop(args.run_id),
            )
        except _TakenOver:
            return 0
        finally:
            role.release()
        if role.lost or (supervisor.lost and not name):
            return code  # another supervises (or will): its poll interval stays for it
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
        return (
            " the sweep",
            lambda poll_s: sweeps.once(supervisor, ref, poll_s),
            lambda: bool(members) and members[0].spec.compute.is_local,
        )
    found = registry.find_runs(ref)
    if len(found) != 1:
        return "no such run" if not found else "ambiguous run id"
    run = found[0]
    return "", _run_once(supervisor, run), lambda: run.spec.compute.is_local


def _run_once(supervisor, run):
    """One look at a run: None while it needs watching, else how it ended. An ended run whose teardown
    has not gone through (a pod left, a create that may still land) is looked at again, and so is a
    succeeded one whose pod runs lm-eval after the hand-back (until the worker exits or a limit ends it)."""
    from autoslm.controller.podspec import store_lag_s
    from autoslm.controller.reconcile import after_hand_back
    from autoslm.controller.state import holds_pod, run_state

    ended_looks = 0
    beat_timeout = run.spec.limits.heartbeat_timeout_s + store_lag_s(run.spec)

    def once(_poll_s: float) -> str | None:
        nonlocal ended_looks
        replicas = supervisor.tick(run)
        state = run_state(replicas)
        if state.live:
            return None
        ended_looks += 1
        now = time.time()
        in_flight = any(not r.pod_id and holds_pod(r, now) for r in replicas)
        harness = any(after_hand_back(r, now, beat_timeout) for r in replicas)
        if any(holds_pod(r, now) for r in replicas) and (ended_looks < 30 or in_flight or harness):
            return None  # ended, but a teardown has not gone through yet (or lm-eval runs): keep at it
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


class _Role:
    """This daemon's supervisor lease on a run: beaten every LEASE_BEAT_S; lost once another took it."""

    def __init__(self, registry, fence):
        self.registry, self.fence, self.at = registry, fence, time.monotonic()
        self.lost = False

    def beat(self) -> bool:
        """Beat it when due; False when another process took it over (this daemon must stop)."""
        from autoslm.controller.registry import LeaseLost
        from autoslm.controller.supervisor import LEASE_BEAT_S, LEASE_TTL_S

        if time.monotonic() - self.at < LEASE_BEAT_S:
            return True
        try:
            self.registry.beat(self.fence, LEASE_TTL_S)
        except LeaseLost:
            self.lost = True
            return False
        except Exception:  # noqa: BLE001 - a registry in trouble: the tick says so, and it beats again later
            return True
        self.at = time.monotonic()
        return True

    def release(self) -> None:
        with contextlib.suppress(Exception):  # a registry gone bad: the lease expires on its own
            self.registry.release_lease(self.fence.run_id, self.fence.owner)


def _take_role(supervisor, run_id: str, poll_s: float) -> _Role | None:
    """Become the run's supervisor: take its supervisor lease, from a stale holder too (stopped here
    for LEASE_STALE_S, silent for LEASE_HUNG_S). None when another supervisor holds it awake."""
    from autoslm.controller.supervisor import LEASE_BEAT_S, LEASE_HUNG_S, LEASE_STALE_S, LEASE_TTL_S
    from autoslm.errors import AutoslmError

    registry, said, trouble = supervisor.registry, False, None
    while True:
        try:
            if trouble is not None:
                registry.reopen()  # SQLite keeps a file it opened read-only so, even once it is writable
            fence = registry.take_lease(
                role_key(run_id), supervisor.owner, LEASE_TTL_S, stale_s=LEASE_STALE_S, hung_s=LEASE_HUNG_S, standing=True
            )
            if trouble is not None:
                _log(f"{run_id}: the registry can be written again")
                trouble = None
            if fence is not None:
                write_pidfile(supervisor.home, run_id, os.getpid())  # this one supervises now
                if said:
                    _log(f"{run_id}: supervising in place of a stopped or silent supervisor (pid {os.getpid()})")
                return _Role(registry, fence)
            other = _awake_supervisor(registry, run_id)
            if other is not None:
                write_pidfile(supervisor.home, run_id, other)
                _log(f"{run_id}: supervisor {other} supervises it and is awake; exiting")
                return None
            if not said:
                _log(f"{run_id}: its supervisor is stopped or silent; taking over once its heartbeat is stale")
                said = True
        except AutoslmError as e:  # a registry locked or read-only for now: wait for it (said once)
            if str(e) != trouble:
                _log(f"{run_id}: {e}; waiting for it")
            trouble = str(e)
        time.sleep(min(poll_s, LEASE_BEAT_S))


def _awake_supervisor(registry, run_id: str) -> int | None:
    """The pid of another supervisor of this run that holds its supervisor lease, awake and beating."""
    from autoslm.controller.tick import LEASE_HUNG_S, LEASE_STALE_S, LEASE_TTL_S

    info = registry.lease_info(role_key(run_id))
    if not info or info["stopped"] or not info["pid"] or info["pid"] == os.getpid():
        return None
    if not _is_daemon(info["pid"], run_id) or registry.lease_is_stale(role_key(run_id), LEASE_TTL_S, LEASE_STALE_S, LEASE_HUNG_S):
        return None
    return info["pid"]


class _TakenOver(Exception):
    """This supervisor's lease was taken over while it waited: it stops."""


def _stop(run_id: str):
    _taken_over(run_id)
    raise _TakenOver(run_id)


def _look_as(supervisor, role: _Role, once, poll_s: float, *, sweep: bool = False) -> str | None:
    """One look as the supervisor: not at all once its supervisor lease was taken over, and the last
    one when a run's own lease was taken over while it looked (it wrote nothing). A sweep's look ticks
    several runs, any of which a command may tick meanwhile: only its supervisor lease says it lost."""
    if not role.beat():
        return _TAKEN_OVER
    ended = once(poll_s)
    return _TAKEN_OVER if supervisor.lost and not sweep else ended


_TAKEN_OVER = "another process took it over while this supervisor was stalled; exiting without acting on what it saw"


def _taken_over(run_id: str) -> int:
    _log(f"{run_id}: {_TAKEN_OVER}")
    return 0


def _wait(role: _Role, poll_s: float) -> bool:
    """Sleep until the next look, beating the supervisor lease; False when it was taken over."""
    from autoslm.controller.supervisor import LEASE_BEAT_S

    end = time.monotonic() + poll_s
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, LEASE_BEAT_S))
        if not role.beat():
            return False
    return True


if __name__ == "__main__":
    sys.exit(main())
