"""What the vendors rented through a REST API and an account key share (RunPod, Vast): the retrying
client (``http.ApiClient``), the window in which a create may still land and create-once
(``createonce.py``), and construction from the environment. Each vendor's provider names itself and
its API class, and says how it finds its live pods by name (``_live_named``)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, ClassVar

import httpx

from autoslm import catalog
from autoslm.providers.base import PodHandle
from autoslm.providers.createonce import CreateOnce, window_s
from autoslm.providers.http import DEFAULT_RETRY, ApiClient, RetryPolicy, require_key
from autoslm.vendors.vendor import Vendor


class RestProvider:
    """A vendor's pods through its REST API. Construct with ``from_env()`` in the product; tests pass
    ``base_url``, ``sleep``, ``clock`` and ``transport``."""

    name: ClassVar[str]  # the registry's name
    vendor: ClassVar[Vendor]
    title: ClassVar[str]  # how messages name the vendor
    default_url: ClassVar[str]
    key_env: ClassVar[str]
    url_env: ClassVar[str]
    api_class: ClassVar[type]  # speaks the vendor's JSON over an ApiClient

    def __init__(
        self,
        api_key: str,
        base_url: str | None = None,
        *,
        timeout: float | httpx.Timeout = 30.0,
        retry: RetryPolicy = DEFAULT_RETRY,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        transport: httpx.BaseTransport | None = None,
        min_cuda: str | None = catalog.WORKER_MIN_CUDA,
    ):
        self._key = api_key
        self._sleep = sleep
        self.retry = retry
        self.min_cuda = min_cuda
        self.client = ApiClient(
            base_url or self.default_url,
            api_key,
            provider=self.title,
            key_env=self.key_env,
            url_env=self.url_env,
            timeout=timeout,
            retry=retry,
            sleep=sleep,
            clock=clock,
            transport=transport,
        )
        self.api = self.api_class(self.client)
        read = timeout.read if isinstance(timeout, httpx.Timeout) else timeout
        self.create_window_s = window_s(retry, float(read or 30.0))
        self.once = CreateOnce(
            self.title,
            retry,
            sleep,
            self._live_named,
            lambda pod: str(pod["id"]),
            lambda pod_id: self.terminate(PodHandle(self.name, pod_id)),
        )

    @classmethod
    def from_env(cls, **kwargs: Any):
        """The key from the vendor's variable (or credentials.toml), the base URL from its URL variable."""
        key = require_key(cls.vendor)
        kwargs.setdefault("base_url", os.environ.get(cls.url_env) or cls.default_url)
        return cls(key, **kwargs)

    def close(self) -> None:
        self.client.close()

    def _live_named(self, name: str) -> list[dict]:
        raise NotImplementedError

    def terminate(self, handle: PodHandle) -> None:
        raise NotImplementedError
