"""The reward check's child process, bounded, from the side of the process that starts it: started
as ``python -m autoslm.envs.reward_check <folder>`` in a session of its own, given ``CHECK_LIMIT_S``
for the import and again for the call (faulthandler says where it was), ``MEMORY_LIMIT_BYTES`` of
memory, the last ``STDERR_KEEP_BYTES`` of its stderr kept, and ended with everything it started
(``end_all``: its process group, and any process carrying the check's mark in its environment). A child
that gives no answer is said in one line (``_no_answer``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path

from autoslm.envs.reward_refs import RewardRef

# The import may take this long, and then the one call on a row. A reward function scores a whole
# batch at every training step, so one row is far below this.
CHECK_LIMIT_S = 10
# Besides those two limits, how long the child may take to start (an interpreter and this module)
# before it is killed; it never needs this unless the machine is swamped.
CHECK_START_S = 10
# The child's memory (RLIMIT_DATA: heap and private mappings): a reward scoring one row needs far less.
MEMORY_LIMIT_BYTES = 2 * 1024**3
# Of the child's stderr only the end is kept (the last line names what went wrong).
STDERR_KEEP_BYTES = 64 * 1024
# The environment variable every process the child starts inherits: how the check finds them at the end.
MARK = "AUTOSLM_REWARD_CHECK"


class _Tail:
    """The last ``keep`` bytes of a stream, read by a thread of its own until the stream closes."""

    def __init__(self, stream, keep: int = STDERR_KEEP_BYTES):
        self.keep, self.data = keep, bytearray()
        self._thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self._thread.start()

    def _drain(self, stream) -> None:
        with stream:
            while chunk := stream.read1(65536):
                self.data += chunk
                if len(self.data) > 2 * self.keep:
                    del self.data[: -self.keep]

    def text(self, wait_s: float = 5.0) -> str:
        self._thread.join(wait_s)  # the stream closes when the child and all it started are gone
        return bytes(self.data[-self.keep :]).decode(errors="replace")


def check_in_child(path: Path, ref: RewardRef, payload: bytes, limit_s: float) -> tuple[str | None, str | None]:
    """(problem, warning) of one check, run in a child process that is ended, with all it started, here."""
    with tempfile.TemporaryDirectory(prefix="autoslm-reward-check-") as tmp:
        box = Path(tmp)
        (box / "in.pickle").write_bytes(payload)
        mark = uuid.uuid4().hex
        env = dict(os.environ, **{MARK: mark})
        # This checkout, last: the child imports autoslm the way this process did, whatever its sys.path was.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(Path(__file__).resolve().parents[2])) if p)
        child = subprocess.Popen(
            [sys.executable, "-m", "autoslm.envs.reward_check", str(box)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )  # its own group: whatever the file starts goes with it
        tail = _Tail(child.stderr)
        expired = False
        try:
            child.wait(timeout=2 * limit_s + CHECK_START_S)
        except subprocess.TimeoutExpired:
            expired = True
        finally:
            end_all(child, mark)
        said = tail.text()
        if (box / "out.json").exists():
            out = json.loads((box / "out.json").read_text())
            return out["problem"], out.get("warning")
        return _no_answer(path, ref, box, limit_s, expired, said, child.returncode), None


def end_all(child: subprocess.Popen, mark: str) -> None:
    """Kill ``child``'s process group and every process carrying ``mark`` in its environment (one that
    left the group with ``setsid``, or was orphaned), until none is left; then reap ``child``."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (OSError, AttributeError):
        child.kill()
    needle = f"{MARK}={mark}".encode() + b"\0"
    for _ in range(100):  # a process killed cannot fork again: each pass only finds what the last one missed
        found = [pid for pid in _marked(needle) if pid != os.getpid()]
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    child.wait()


def _marked(needle: bytes) -> list[int]:
    """The live processes whose environment holds ``needle`` (none where there is no /proc)."""
    out = []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        try:
            data = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue  # gone, or another user's
        if (b"\0" + data).find(b"\0" + needle) >= 0:
            out.append(pid)
    return out


def _no_answer(path: Path, ref: RewardRef, box: Path, limit_s: float, expired: bool, said: str, code: int) -> str:
    """The line for a child that ended without an answer: past its limit, or its process ended."""
    importing = not (box / "imported").exists()
    stack = (box / "stack.txt").read_text(errors="replace") if (box / "stack.txt").exists() else ""
    if expired or stack.strip():  # faulthandler writes only when a stage ran past its limit
        line = _stuck_at(stack, path)
        at = f" (it was at line {line})" if line else ""
        if importing:
            return (
                f"{ref.shown}: importing the file did not finish within {limit_s:g} s{at}: fix the loop in the "
                "file's top-level code, or make its import faster"
            )
        return (
            f"{ref.shown} did not return within {limit_s:g} s when called on the first row of the data{at}: "
            "fix the loop, or make it faster (it scores a whole batch at every training step)"
        )
    lines = said.strip().splitlines()
    last = f": {' '.join(lines[-1].split())[:300]}" if lines else ""
    stage = "importing the file" if importing else "calling it on the first row of the data"
    how = f"killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else f"exit code {code}"
    return f"{ref.shown}: {stage} ended the process ({how}){last}; a reward file must return its scores, never end its process"


def _stuck_at(stack: str, path: Path) -> int | None:
    """The line of ``path`` the innermost frame of the user's file was at, from faulthandler's dump."""
    for m in re.finditer(r'File "(.*)", line (\d+)', stack):  # most recent call first
        if Path(m.group(1)) == Path(path):
            return int(m.group(2))
    return None
