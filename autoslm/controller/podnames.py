"""Pod names that say whose they are: ``autoslm-<run_id>-s<seed>-a<attempt>-h<home id>``.

Every pod autoslm starts is named from this home's id, its run id, its seed and its attempt, before
the create call, so that (1) a create whose answer was lost can be found again by name, and (2) `gc`
can tell, from a provider's own list and with no registry at all, which pods belong to this
$AUTOSLM_HOME and to which run. Neither vendor has labels in its create call that its list returns
(RunPod v2 has only the name; Vast has one free ``label``), so the name carries it all.

It must never: change a home's id once written (pods already running carry it).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from autoslm.errors import UsageError
from autoslm.providers.base import POD_LABEL

_HOME_ID = re.compile(r"[0-9a-f]{8}")

_NAME = re.compile(rf"^{POD_LABEL}-(?P<run>.+)-s(?P<seed>\d+)-a(?P<attempt>\d+)(?:-h(?P<home>[0-9a-f]{{8}}))?$")


@dataclass(frozen=True)
class PodName:
    run_id: str
    seed: int
    attempt: int
    home: str | None  # None: a pod named before homes had ids


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
    return f"{POD_LABEL}-{run_id}-s{seed}-a{attempt}-h{home}"


def parse_pod_name(name: str) -> PodName | None:
    m = _NAME.match(name or "")
    if not m:
        return None
    return PodName(m["run"], int(m["seed"]), int(m["attempt"]), m["home"])
