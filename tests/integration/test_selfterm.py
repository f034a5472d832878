"""A pod ending itself checks what the vendor answered, and falls back when the answer is a refusal.

.venv/bin/python -m pytest tests/integration/test_selfterm.py -q
"""

from __future__ import annotations

import pytest

from autoslm.engine.pod.selfterm import terminate_own_pod
from autoslm.errors import ProviderError
from autoslm.providers.http import RetryPolicy
from autoslm.providers.runpod.provider import RunPodProvider
from autoslm.providers.vast.provider import VastProvider
from tests.fakes.pods import pod_request
from tests.fakes.runpod import fake_runpod  # noqa: F401 - pytest fixture
from tests.fakes.vast import fake_vast  # noqa: F401 - pytest fixture

pytestmark = pytest.mark.worker  # also runs on the worker image's pins (make test-image)

SLEEP = ["python", "-c", "import time; time.sleep(60)"]
FAST = RetryPolicy(attempts=2, backoff_s=0.01)


def _pod(provider, name="autoslm-st-s0-a1"):
    return provider.launch(pod_request(name, SLEEP, gpu_types=("RTX 4090",)))


def test_vast_http_200_success_false_falls_back_to_stop(fake_vast):  # noqa: F811
    vast = VastProvider(fake_vast.api_key, base_url=fake_vast.url, retry=FAST, sleep=lambda s: None)
    h = _pod(vast)
    inst = fake_vast.instance(h.pod_id)
    env = {"CONTAINER_ID": h.pod_id, "CONTAINER_API_KEY": inst.container_key, "AUTOSLM_VAST_URL": fake_vast.url}
    fake_vast.fail_next(1, 200, method="DELETE", body={"success": False, "error": "forbidden", "msg": "not allowed"})
    what = terminate_own_pod(env, retry=FAST, sleep=lambda s: None)
    assert what.startswith("stopped Vast instance") and "not allowed" in what
    assert inst.actual_status == "stopped" and not inst.process.alive()


def test_vast_refusing_both_raises_so_the_controller_takes_over(fake_vast):  # noqa: F811
    vast = VastProvider(fake_vast.api_key, base_url=fake_vast.url, retry=FAST, sleep=lambda s: None)
    h = _pod(vast)
    inst = fake_vast.instance(h.pod_id)
    env = {"CONTAINER_ID": h.pod_id, "CONTAINER_API_KEY": inst.container_key, "AUTOSLM_VAST_URL": fake_vast.url}
    fake_vast.fail_next(1, 200, method="DELETE", body={"success": False, "msg": "no"})
    fake_vast.fail_next(1, 200, method="PUT", body={"success": False, "msg": "also no"})
    with pytest.raises(ProviderError, match="refused both"):
        terminate_own_pod(env, retry=FAST, sleep=lambda s: None)


def test_runpod_delete_refused_for_the_pod_key_falls_back_to_the_terminate_action(fake_runpod):  # noqa: F811
    rp = RunPodProvider(fake_runpod.api_key, base_url=fake_runpod.url, retry=FAST, sleep=lambda s: None)
    h = _pod(rp)
    pod = fake_runpod.pod(h.pod_id)
    env = {"RUNPOD_POD_ID": h.pod_id, "RUNPOD_API_KEY": pod.pod_key, "AUTOSLM_RUNPOD_URL": fake_runpod.url}
    fake_runpod.fail_next(1, 403, method="DELETE")  # the undocumented case: the scoped key may not DELETE
    what = terminate_own_pod(env, retry=FAST, sleep=lambda s: None)
    assert what.startswith("terminated RunPod pod") and "DELETE" in what
    assert pod.deleted


def test_runpod_a_2xx_that_did_nothing_is_not_taken_at_its_word(fake_runpod):  # noqa: F811
    rp = RunPodProvider(fake_runpod.api_key, base_url=fake_runpod.url, retry=FAST, sleep=lambda s: None)
    h = _pod(rp)
    pod = fake_runpod.pod(h.pod_id)
    env = {"RUNPOD_POD_ID": h.pod_id, "RUNPOD_API_KEY": pod.pod_key, "AUTOSLM_RUNPOD_URL": fake_runpod.url}
    fake_runpod.fail_next(1, 204, method="DELETE")  # answered "done" without doing it
    what = terminate_own_pod(env, retry=FAST, sleep=lambda s: None)
    assert "still there" in what and pod.deleted  # read back, then the terminate action did it
