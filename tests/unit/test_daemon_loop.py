"""The one loop of every background supervisor (controller/daemon.supervise), a run's or a sweep's: a
registry that turns read-only or locked is waited out and opened again, an outage is tried again, and
only the work's end (exit 0) or a registry it may not use (exit 1) ends it."""

from __future__ import annotations

from pathlib import Path

from autoslm.controller.daemon import supervise
from autoslm.controller.registry import RegistryLocked
from autoslm.errors import ProviderError


class FakeRunRegistry:
    """The SQLite run registry (controller/registry/) as the loop sees it: read-only or not, writable or not."""

    def __init__(self, path: Path, writable: list[bool], newer: bool = False):
        self.path, self._writable, self.newer, self.reopened = path, list(writable), newer, 0

    @property
    def read_only(self) -> bool:
        return self.newer

    def writable(self) -> bool:
        return self._writable.pop(0) if len(self._writable) > 1 else self._writable[0]

    def reopen(self) -> None:
        self.reopened += 1


def test_a_read_only_then_locked_registry_is_waited_out_and_the_work_finishes(tmp_path, capsys):
    (tmp_path / "registry.db").write_text("")
    reg = FakeRunRegistry(tmp_path / "registry.db", writable=[False, False, True])
    looks = iter([RegistryLocked("locked by pid 7"), ProviderError("the provider is down"), None, "succeeded"])

    def once():
        x = next(looks)
        if isinstance(x, Exception):
            raise x
        return x

    slept = []
    assert supervise(reg, "sw", once, 0.5, sleep=slept.append) == 0
    log = capsys.readouterr().out
    assert "read-only now" in log and "locked by pid 7" in log and "the provider is down" in log
    assert "can be written again" in log and "sw: succeeded; supervisor exits" in log
    assert reg.reopened == 3  # after each registry trouble: SQLite keeps a file opened read-only so
    assert slept == [0.5] * 5  # twice read-only, once locked, the outage, one look with work left


def test_a_registry_from_a_newer_autoslm_or_gone_ends_the_supervisor(tmp_path, capsys):
    (tmp_path / "registry.db").write_text("")
    assert (
        supervise(FakeRunRegistry(tmp_path / "registry.db", [True], newer=True), "r", lambda: None, 0.1, sleep=lambda s: None)
        == 1
    )
    assert supervise(FakeRunRegistry(tmp_path / "gone.db", [True]), "r", lambda: None, 0.1, sleep=lambda s: None) == 1
    log = capsys.readouterr().out
    assert "newer autoslm" in log and "is gone" in log
