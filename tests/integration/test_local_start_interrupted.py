"""A signal whose handler raises (Ctrl-C's KeyboardInterrupt, a supervisor's SIGTERM) can land while the
local provider is inside ``Popen``, after the worker's process was forked: the worker runs on. It is
recorded as any pod is, so `cancel` and `gc` find it; a group whose start is cut so ends the nodes
already started and the one the signal met. The child's start is held open between fork and exec
(tests/unit/test_procs.py's preexec_fn) so that the signal comes while the parent waits inside Popen."""

from __future__ import annotations

import threading

import pytest

from autoslm.procs import DEAD, GONE, Starting, pid_state
from autoslm.providers.local.provider import LocalProvider
from tests.fakes.cloud import wait_for
from tests.fakes.pods import pod_request
from tests.unit.test_procs import Stopped, holding_the_start, sigterm_during

SLEEPER = ["python", "-c", "import time; time.sleep(120)"]


class HeldProvider(LocalProvider):
    """The local provider, its ``held``-th start (0: the first) held between fork and exec until the signal
    was sent: the one place this test reaches in, where the process is made."""

    def __init__(self, *args, forked, held: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.forked, self.held, self.starts = forked, held, 0

    def _starting(self, argv, **kwargs) -> Starting:
        hold = self.starts == self.held
        self.starts += 1
        starting = Starting(argv, **kwargs, **({"preexec_fn": holding_the_start(self.forked)} if hold else {}))
        threading.Thread(target=reap, args=(starting,), daemon=True).start()
        return starting


def reap(starting: Starting) -> None:
    """This test's process is the workers' parent: it waits for each, as a launcher's exit would leave
    them to init, so that an ended worker is gone, not a zombie that terminate waits on."""
    try:
        starting.started().wait()
    except BaseException:  # noqa: BLE001 - a start that failed or was given up: nothing to wait for
        proc = starting.process()
        if proc is not None:
            proc.wait()


def ended(pid: int) -> bool:
    return pid_state(pid) in (GONE, DEAD)


def pids_of(provider: LocalProvider) -> list[int]:
    return [int(p.stem.split("-")[1]) for p in provider.pods_dir.glob("local-*.json")]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # preexec_fn beside threads: this test's own child
def test_a_signal_mid_start_leaves_a_recorded_worker_that_terminate_ends(tmp_path):
    provider = HeldProvider(home=tmp_path / "home", forked=tmp_path / "forked")
    request = pod_request("autoslm-r1-s0-a1", SLEEPER, {}, log_path=str(tmp_path / "home" / "logs" / "r1.log"))
    got = sigterm_during(lambda: provider.launch(request), tmp_path / "forked")
    assert isinstance(got, Stopped)  # the signal's exception went on, out of launch
    [handle] = provider.list_pods()  # the worker it started runs, and is known by its name
    assert handle.name == "autoslm-r1-s0-a1"
    [pid] = pids_of(provider)
    assert pid_state(pid) not in (GONE, DEAD)
    provider.terminate(handle)
    wait_for(lambda: ended(pid), timeout=30)
    assert provider.list_pods() == []


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_group_cut_mid_start_of_its_second_node_ends_both(tmp_path):
    provider = HeldProvider(home=tmp_path / "home", forked=tmp_path / "forked", held=1)
    request = pod_request("autoslm-r2-s0-a1", SLEEPER, {}, log_path=str(tmp_path / "home" / "logs" / "r2.log"), nodes=2)
    got = sigterm_during(lambda: provider.launch(request), tmp_path / "forked")
    assert isinstance(got, Stopped)
    pids = pids_of(provider)
    assert len(pids) == 2, "both nodes were recorded: the one started, and the one the signal met"
    wait_for(lambda: all(ended(pid) for pid in pids), timeout=30)
    assert provider.list_pods() == []
