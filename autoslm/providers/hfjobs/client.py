"""Hugging Face Jobs through huggingface_hub's Jobs API, as plain dicts and ``autoslm.errors``.

One ``HfApi(endpoint=..., token=...)`` object; only calls that both the controller's huggingface_hub
(2.x) and the pod image's (1.x) have: ``whoami``, ``run_job`` (with ``expose``; its answer's
``status.expose_urls`` in both; with ``network_group`` and ``network_aliases``, the job's ``network``), ``inspect_job``, ``cancel_job``,
``list_jobs(labels=...)``, ``list_jobs_hardware`` and ``fetch_job_logs``. Routes (both versions): POST/GET
``/api/jobs/{namespace}``, GET ``/api/jobs/{namespace}/{id}``, POST ``.../{id}/cancel``, GET
``.../{id}/logs`` (server-sent events), GET ``/api/jobs/hardware``, GET ``/api/whoami-v2``.

Every call has a deadline (huggingface_hub's own client waits without one); 429, 5xx, a refused
connection and a timeout are retried by ``http.with_retries``, the one policy (the list is sent here,
not through huggingface_hub's pagination, which retries on its own), except a create, which may
have been applied: it raises ``http.MaybeApplied`` so the caller looks for the job before sending it
again (``providers/createonce.py``). HTTP 402 (no prepaid credits) and 401/403 (a token without the
right to run jobs) are one line each, never retried. It must never put the token into a message.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from autoslm.errors import ProviderAuthError, ProviderRateLimited, ProviderRefused, ProviderUnavailable
from autoslm.providers.base import Billed
from autoslm.providers.http import (
    DEFAULT_RETRY,
    RETRY_STATUSES,
    ApiStatusError,
    MaybeApplied,
    RetryPolicy,
    TryAgain,
    parse_retry_after,
    with_retries,
)
from autoslm.secrets import REDACTED, redact
from autoslm.vendors.hfjobs import data


class _Late(Exception):
    """A call that did not answer within its deadline."""


class JobsClient:
    """The Jobs API of one Hub endpoint for one token. Tests pass ``sleep``/``clock`` and a fake's URL."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        namespace: str | None = None,
        timeout_s: float = 30.0,
        retry: RetryPolicy = DEFAULT_RETRY,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ):
        from huggingface_hub import HfApi

        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.retry = retry
        self._token = token
        self._sleep = sleep
        self._clock = clock
        self._namespace = namespace
        self.api = HfApi(endpoint=self.base_url, token=token)

    # -- the calls ---------------------------------------------------------------------------------

    def namespace(self) -> str:
        """The account the token belongs to: where its jobs are created and listed."""
        if self._namespace is None:
            me = self._call(lambda: self.api.whoami(), "reading the token's account")
            self._namespace = str(me["name"])
        return self._namespace

    def hardware(self, *, lookup: bool = False) -> list[dict]:
        """Every flavor with its accelerator and per-unit price, as the API lists them."""
        out = []
        for hw in self._call(lambda: self.api.list_jobs_hardware(), "listing the Jobs hardware", lookup=lookup):
            acc = hw.accelerator
            out.append(
                {
                    "name": hw.name,
                    "unit_cost_usd": float(hw.unit_cost_usd or 0),
                    "unit_label": str(hw.unit_label or "minute"),
                    "gpu": acc.model if acc else None,
                    "count": _int(acc.quantity) if acc else 0,
                    "vram_gb": _gb(acc.vram) if acc else None,
                    "ram_gb": _gb(hw.ram),
                }
            )
        return out

    def run(
        self,
        *,
        image: str,
        command: list[str],
        env: dict[str, str],
        secrets: dict[str, str],
        flavor: str,
        timeout_s: int,
        labels: dict[str, str],
        expose: list[int] | None = None,
        network_group: str | None = None,
        network_aliases: list[str] | None = None,
    ) -> dict:
        """Create a job. Sent once per call: a lost answer raises ``MaybeApplied``. ``expose``: ports reached
        through the Jobs proxy, each behind the Hub token (both versions' ``expose``; never ``expose_public``,
        which 1.x lacks and which would open the port to anyone). ``network_group``: the group the job joins,
        ``network_aliases`` the names it claims there."""
        ns = self.namespace()
        extra: dict[str, Any] = {"expose": list(expose)} if expose else {}
        if network_group:
            extra["network_group"] = network_group
            if network_aliases:
                extra["network_aliases"] = list(network_aliases)
        return _job(
            self._call(
                lambda: self.api.run_job(
                    image=image,
                    command=command,
                    env=env,
                    secrets=secrets,
                    flavor=flavor,
                    timeout=int(timeout_s),
                    name=labels.get(data.LABEL_POD),
                    labels=labels,
                    namespace=ns,
                    **extra,
                ),
                f"creating job {labels.get(data.LABEL_POD, '')} ({flavor})",
                idempotent=False,
            )
        )

    def inspect(self, job_id: str) -> dict | None:
        """The job, or None when the API no longer knows it."""
        ns = self.namespace()
        try:
            return _job(self._call(lambda: self.api.inspect_job(job_id=job_id, namespace=ns), f"reading job {job_id}"))
        except ApiStatusError as e:
            if e.status == 404:
                return None
            raise

    def cancel(self, job_id: str) -> None:
        """Cancel a job; one that is gone or already finished is success."""
        ns = self.namespace()
        try:
            self._call(lambda: self.api.cancel_job(job_id=job_id, namespace=ns), f"cancelling job {job_id}")
        except ApiStatusError as e:
            if e.status == 404:
                return
            if e.status in (400, 409, 422):
                job = self.inspect(job_id)
                if job is None or job["stage"] in data.FINISHED_STAGES:
                    return
            raise

    def logs(self, job_id: str, *, follow: bool = False) -> Iterator[str]:
        """The job's log, line by line (``fetch_job_logs``): what it has written so far, or, with ``follow``,
        on until the job ends (huggingface_hub's stream, its own reconnects). A job the API no longer knows
        has none."""
        from huggingface_hub.errors import HfHubHTTPError

        ns = self.namespace()
        what = f"reading job {job_id}'s log"
        try:
            if not follow:
                yield from self._call(lambda: list(self.api.fetch_job_logs(job_id=job_id, namespace=ns, follow=False)), what)
                return
            yield from self.api.fetch_job_logs(job_id=job_id, namespace=ns, follow=True)
        except ApiStatusError as e:
            if e.status != 404:
                raise
        except HfHubHTTPError as e:  # the stream's own answer (follow): said as the calls' are
            status = e.response.status_code if e.response is not None else 0
            if status != 404:
                raise self._refusal(status, self._detail(e), what, True) or self._kept_failing(
                    status, self._detail(e), what
                ) from None

    def list(self, labels: dict[str, str]) -> list[dict]:
        """Every job of the account carrying all these labels, any stage. An endpoint without the Jobs API
        (404: a Hub mirror, a private Hub) holds no jobs."""
        ns = self.namespace()
        try:
            return [_job(j) for j in self._call(lambda: self._list_jobs(ns, labels), "listing jobs")]
        except ApiStatusError as e:
            if e.status == 404:
                return []
            raise

    def _list_jobs(self, namespace: str, labels: dict[str, str]) -> list:
        """``list_jobs``'s request, every page, once: huggingface_hub's own pagination retries a 5xx five
        times with waits up to 8 s and logs each (minutes, and a page of lines, under ``_call``'s
        retries), and ``with_retries`` is the one policy."""
        from huggingface_hub import JobInfo
        from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

        url: str | None = f"{self.base_url}/api/jobs/{namespace}"
        params: list[tuple[str, str]] | None = [("label", f"{k}={v}") for k, v in labels.items()]
        headers = build_hf_headers(token=self._token)
        jobs = []
        while url:
            r = get_session().get(url, params=params, headers=headers, timeout=self.timeout_s)
            hf_raise_for_status(r)
            jobs += [JobInfo(**j, endpoint=self.base_url) for j in r.json()]
            url, params = r.links.get("next", {}).get("url"), None  # the next page's link holds the query
        return jobs

    # -- one call, retried where safe -------------------------------------------------------------

    def _call(self, fn: Callable[[], Any], what: str, *, idempotent: bool = True, lookup: bool = False) -> Any:
        """``fn`` (a huggingface_hub call) under the vendors' one retry policy (providers/http.with_retries)."""
        from huggingface_hub.errors import HfHubHTTPError

        def attempt(_try_no: int) -> Any:
            try:
                return self._bounded(fn)
            except HfHubHTTPError as e:
                status = e.response.status_code if e.response is not None else 0
                detail = self._detail(e)
                refused = self._refusal(status, detail, what, idempotent)
                if refused is not None:
                    raise refused from None
                after = parse_retry_after(e.response.headers.get("Retry-After")) if e.response is not None else None
                raise TryAgain(self._kept_failing(status, detail, what), f"HTTP {status}", after) from None
            except _Late:
                if not idempotent:
                    raise MaybeApplied(
                        f"{data.TITLE} did not answer in time while {what}; it may have acted on the request",
                        hint="autoslm looks the result up before trying again",
                    ) from None
                failure = ProviderUnavailable(
                    f"{data.TITLE} did not answer within {self.timeout_s:g}s while {what}",
                    hint="check your network, then try again",
                )
                raise TryAgain(failure, "no answer in time") from None
            except Exception as e:  # noqa: BLE001 - huggingface_hub's transport errors (httpx or httpx2)
                if not _is_transport(e):
                    raise
                if not idempotent and not _never_sent(e):
                    raise MaybeApplied(
                        f"the connection to {data.TITLE} broke while {what}; it may have acted on the request",
                        hint="autoslm looks the result up before trying again",
                    ) from None
                failure = ProviderUnavailable(
                    f"cannot reach {data.TITLE} at {self.base_url} while {what}: {type(e).__name__}",
                    hint=f"check your network and {data.URL_ENV} / {data.HUB_ENDPOINT_ENV}",
                )
                raise TryAgain(failure, f"network error ({type(e).__name__})") from None

        return with_retries(attempt, self.retry, clock=self._clock, sleep=self._sleep, what=what, who=data.TITLE, once=lookup)

    @staticmethod
    def _kept_failing(status: int, detail: str, what: str) -> Exception:
        """The error for a retryable answer that kept coming until the tries or the time ran out."""
        if status == 429:
            return ProviderRateLimited(
                f"{data.TITLE} kept rate-limiting us (HTTP 429) while {what}", hint="wait a minute and try again"
            )
        return ProviderUnavailable(
            f"{data.TITLE} kept failing (HTTP {status}) while {what}: {detail}",
            hint=f"{data.TITLE} may be having an outage: try again later",
        )

    def _refusal(self, status: int, detail: str, what: str, idempotent: bool) -> Exception | None:
        if status == 402:
            return ProviderRefused(
                f"{data.TITLE} refused to start a job: the account has no prepaid credits (HTTP 402)",
                hint=f"add credits at {data.BILLING_WHERE}, or choose another compute.provider",
            )
        if status == 401:
            return ProviderAuthError(f"{data.TITLE} refused {data.KEY_ENV} (HTTP 401) while {what}", hint=f"check {data.KEY_ENV}")
        if status == 403:
            return ProviderAuthError(
                f"{data.KEY_ENV} may not run {data.TITLE} (HTTP 403) while {what}: {detail}",
                hint=f"create a token with the Jobs permission (write access) at {data.KEY_WHERE}",
            )
        if status in RETRY_STATUSES and not (status >= 500 and not idempotent):
            return None
        if status >= 500:
            return MaybeApplied(
                f"{data.TITLE} failed (HTTP {status}) while {what}; it may have acted on the request",
                hint="autoslm looks the result up before trying again",
            )
        return ApiStatusError(f"{data.TITLE} answered HTTP {status} while {what}: {detail}", status=status, detail=detail)

    def _bounded(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` with a deadline: huggingface_hub's shared client has none."""
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = fn()
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                box["error"] = e

        worker = threading.Thread(target=run, name="hfjobs-call", daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            raise _Late()
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def _detail(self, e: Exception) -> str:
        text = str(getattr(e, "server_message", None) or "") or str(e).split("\n")[0]
        text = text.replace(self._token, REDACTED) if self._token else text
        text = redact(text).strip()
        return (text[:297] + "...") if len(text) > 300 else text or "no detail"


def _job(j) -> dict:
    """A ``JobInfo`` as the fields the provider reads."""
    status = getattr(j, "status", None)
    durations = getattr(j, "durations", None)
    return {
        "id": str(j.id),
        "stage": str(getattr(getattr(status, "stage", ""), "value", getattr(status, "stage", "")) or "").upper(),
        "message": str(getattr(status, "message", None) or ""),
        "labels": dict(getattr(j, "labels", None) or {}),
        "flavor": str(getattr(j, "flavor", "") or ""),
        "environment": dict(getattr(j, "environment", None) or {}),
        "urls": [str(u) for u in (getattr(status, "expose_urls", None) or [])],
        "created_at": j.created_at.timestamp() if getattr(j, "created_at", None) else None,
        "running_s": getattr(durations, "running_secs", None) if durations else None,
        "scheduling_s": getattr(durations, "scheduling_secs", None) if durations else None,
        "network_group": getattr(getattr(j, "network", None), "group", None),
    }


def billed(job: dict) -> Billed | None:
    """When the job is billed, from its own durations: from when it began to run (its creation plus its
    time scheduling) for as long as it ran. None where the API gives no durations (billed as ever)."""
    created, scheduling, running = job["created_at"], job["scheduling_s"], job["running_s"]
    if created is None or (job["stage"] not in data.STAGES_NOT_RUN and (scheduling is None or running is None)):
        return None
    if scheduling is None or running is None:
        return Billed(None)  # waiting for a machine, or ended before it ran: nothing billed
    since = created + float(scheduling)
    return Billed(since, since + float(running) if job["stage"] in data.FINISHED_STAGES else None)


def _int(text) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        return 0


def _gb(text) -> float | None:
    """ "24 GB" -> 24.0; None when it is not a size."""
    try:
        return float(str(text).split()[0])
    except (ValueError, IndexError):
        return None


def _transport_modules():
    mods = []
    for name in ("httpx", "httpx2"):
        try:
            mods.append(__import__(name))
        except ImportError:
            pass
    return mods


def _is_transport(e: Exception) -> bool:
    return any(isinstance(e, m.TransportError) for m in _transport_modules())


def _never_sent(e: Exception) -> bool:
    """A connection that never opened: the server did nothing, so even a create may be sent again."""
    return any(isinstance(e, (m.ConnectError, m.ConnectTimeout, m.PoolTimeout)) for m in _transport_modules())
