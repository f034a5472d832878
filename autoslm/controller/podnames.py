"""Pod names that say whose they are: ``autoslm-<run>-s<seed>-a<attempt>-h<home id>``.

Every pod autoslm starts is named from this home's id, its run, its seed and its attempt, before
the create call, so that (1) a create whose answer was lost can be found again by name, and (2) `gc`
can tell, from a provider's own list and with no registry at all, which pods belong to this
$AUTOSLM_HOME and to which run. Neither vendor has labels in its create call that its list returns
(RunPod v2 has only the name; Vast has one free ``label``), so the name carries it all.

A name is what vendors store (a pod's name, a Hugging Face job's labels), so it keeps to Kubernetes'
label rule: at most 63 characters of ``[A-Za-z0-9_.-]``, starting and ending alphanumeric. ``<run>``
is the run id where it fits, else its first characters and a short hash of the whole id
(``run_key``); ``PodName.of_run`` and ``RunKeys`` tell which run a name is of, either way.

It must never: change a home's id once written (pods already running carry it).
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from autoslm.errors import UsageError
from autoslm.providers.base import NAME_MAX, POD_LABEL, is_label

_HOME_ID = re.compile(r"[0-9a-f]{8}")

_NAME = re.compile(rf"^{POD_LABEL}-(?P<run>.+)-s(?P<seed>\d+)-a(?P<attempt>\d+)(?:-h(?P<home>[0-9a-f]{{8}}))?$")

_DIGEST = 8  # hex characters of the run id's hash in a shortened run key


def _digest(run_id: str) -> str:
    return hashlib.sha256(run_id.encode()).hexdigest()[:_DIGEST]


def run_key(run_id: str, room: int = NAME_MAX) -> str:
    """The run as a name carries it, in at most ``room`` characters: its id where that keeps the label
    rule, else the id's first characters (others made dashes) and a hash of the whole id."""
    if len(run_id) <= room and is_label(run_id):
        return run_id
    head = re.sub(r"[^A-Za-z0-9_.-]+", "-", run_id)[: max(0, room - _DIGEST - 1)].strip("-_.")
    return f"{head}-{_digest(run_id)}" if head else _digest(run_id)


@dataclass(frozen=True)
class PodName:
    run: str  # the run's key (``run_key``): its id, or its id shortened with a hash
    seed: int
    attempt: int
    home: str | None  # None: a pod named before homes had ids

    def of_run(self, run_id: str) -> bool:
        """Whether this is a pod of that run (named by its whole id, or by its shortened key)."""
        return self.run == run_id or self.run.rpartition("-")[2] == _digest(run_id)


class RunKeys:
    """The runs of a registry by the key their pods are named with: which run a pod name is of."""

    def __init__(self, run_ids):
        self._runs: dict[str, str] = {}
        for run_id in run_ids:
            self._runs[run_id] = run_id
            self._runs.setdefault(_digest(run_id), run_id)

    def run_of(self, name: PodName) -> str | None:
        return self._runs.get(name.run) or self._runs.get(name.run.rpartition("-")[2])


def home_id(home: Path) -> str:
    """This home's id (8 hex digits), created on first use in $AUTOSLM_HOME/home-id."""
    path = Path(home) / "home-id"
    try:
        text = path.read_text().strip()
        if _HOME_ID.fullmatch(text):
            return text
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    new = os.urandom(4).hex()
    # O_EXCL: two first commands at once agree on one id; the loser reads the winner's once written.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return _written_id(path)
    with os.fdopen(fd, "w") as f:
        f.write(new + "\n")
    return new


def _written_id(path: Path) -> str:
    """The id another command has just created ``path`` to hold: it writes 9 bytes right after."""
    for _ in range(500):  # 5 s: far beyond a write's 9 bytes, even on a loaded machine
        text = path.read_text().strip()
        if _HOME_ID.fullmatch(text):
            return text
        time.sleep(0.01)
    raise UsageError(
        f"{path} holds no home id ({text[:20]!r})",
        hint="if no pod of this home runs, delete the file (the next command writes a new id); else write its id back",
    )


def pod_name(home: str, run_id: str, seed: int, attempt: int) -> str:
    """The attempt's pod name, within the label rule: the run shortened where the whole would not fit."""
    tail = f"-s{seed}-a{attempt}-h{home}"
    return f"{POD_LABEL}-{run_key(run_id, NAME_MAX - len(POD_LABEL) - 1 - len(tail))}{tail}"


def parse_pod_name(name: str) -> PodName | None:
    m = _NAME.match(name or "")
    if not m:
        return None
    return PodName(m["run"], int(m["seed"]), int(m["attempt"]), m["home"])
