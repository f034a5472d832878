"""The one HTTP client that provider code (RunPod, Vast, self-termination) talks to vendors through.

Every call has a timeout; 429, 5xx, connection errors and timeouts are retried with exponential
backoff that honours ``Retry-After`` where a retry protects a run (create, terminate, status); a
look at prices (``lookup=True``) is tried once, so a provider that cannot be reached (no DNS, a
refused connection) is said at once instead of after seconds of back-off. What is left after the retries becomes an ``autoslm.errors``
exception whose message names the provider and the operation and never the API key.

It must never: retry a request that may already have been applied (a create that timed out or got a
5xx) -- it raises ``MaybeApplied`` instead so the caller can look before it creates again; sleep or
read the clock except through the injected ``sleep``/``clock``; put a key, a header or a request body
into a message or a log line.

    ProviderError (autoslm.errors)
    ├── ProviderAuthError        401/403 (the statuses in ``auth_statuses``)
    ├── ProviderRateLimited      429 after the retries
    ├── ProviderUnavailable      5xx, timeout or network error after the retries
    │   └── MaybeApplied         a non-idempotent request that may have taken effect: look before retrying
    └── ApiStatusError           any other unexpected status: ``.status`` and ``.detail`` for the caller
"""

from __future__ import annotations

import email.utils
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import httpx

from autoslm.errors import ProviderAuthError, ProviderError, ProviderRateLimited, ProviderUnavailable
from autoslm.secrets import REDACTED, redact

log = logging.getLogger("autoslm.providers.http")

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
LOOKUP_CONNECT_S = 5.0  # a look at prices waits this long for a connection, not the client's full timeout


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try. Delays are deterministic (no jitter) so tests can assert them."""

    attempts: int = 5  # total tries, the first included
    backoff_s: float = 0.5  # first delay; multiplied by ``factor`` after each retry
    factor: float = 2.0
    max_backoff_s: float = 30.0
    max_retry_after_s: float = 120.0  # a server asking for longer than this gets this
    max_total_s: float = 300.0  # stop retrying once this much time (by ``clock``) has passed

    def backoff(self, retry_index: int) -> float:
        return min(self.backoff_s * self.factor**retry_index, self.max_backoff_s)


DEFAULT_RETRY = RetryPolicy()


class TryAgain(Exception):
    """One try's outcome that may be tried again. ``failure`` is what the caller gets once the tries or
    the time run out; ``words`` says the outcome in the retry log; ``retry_after`` is the wait the
    server asked for (seconds), if it asked."""

    def __init__(self, failure: Exception, words: str, retry_after: float | None = None):
        super().__init__(words)
        self.failure, self.words, self.retry_after = failure, words, retry_after


def with_retries(
    attempt: Callable[[int], Any],
    policy: RetryPolicy,
    *,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    what: str,
    who: str,
    once: bool = False,
) -> Any:
    """The one retry policy of every vendor's API, whatever its transport: call ``attempt(try_no)``
    until it returns. A ``TryAgain`` waits (the backoff, or the server's Retry-After up to
    ``max_retry_after_s``) and tries again while ``policy``'s tries and total time last, then raises its
    ``failure``; any other error (a refusal, ``MaybeApplied`` for a create that may have landed) goes to
    the caller at once. ``once``: a lookup, tried one time."""
    start = clock()
    retry_index = 0
    while True:
        try:
            return attempt(retry_index + 1)
        except TryAgain as e:
            delay = policy.backoff(retry_index) if e.retry_after is None else min(e.retry_after, policy.max_retry_after_s)
            if once or retry_index + 1 >= policy.attempts or clock() - start + delay > policy.max_total_s:
                raise e.failure from None
            log.info("%s: %s while %s; retrying in %.2fs", who, e.words, what, delay)
            sleep(delay)
            retry_index += 1


class MaybeApplied(ProviderUnavailable):
    """A non-idempotent request timed out or got a 5xx after it was sent: it may have been applied."""


class ApiStatusError(ProviderError):
    """The vendor answered with a status the caller has to interpret (400 no capacity, 404 gone, ...)."""

    def __init__(self, message: str, *, status: int, detail: str, body: Any = None):
        super().__init__(message)
        self.status = status
        self.detail = detail
        self.body = body  # parsed JSON (vendor shape) for the provider module; never printed


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date; None if absent/invalid."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    now_dt = datetime.fromtimestamp(now, timezone.utc) if now is not None else datetime.now(timezone.utc)
    return max(0.0, (when - now_dt).total_seconds())


class ApiClient:
    """A bearer-authenticated JSON client for one vendor API.

    ``provider`` (the vendor's title), ``key_env`` and ``url_env`` (the variables of its key and base
    URL) only shape messages.
    ``transport`` lets a unit test hand in an ``httpx.MockTransport``; integration tests point
    ``base_url`` at a fake server instead.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        provider: str,
        key_env: str,
        url_env: str | None = None,
        timeout: float | httpx.Timeout = 30.0,
        retry: RetryPolicy = DEFAULT_RETRY,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        transport: httpx.BaseTransport | None = None,
        user_agent: str = "autoslm",
    ):
        self.base_url = base_url.rstrip("/")
        self.provider = provider
        self.key_env = key_env
        self.url_env = url_env
        self.retry = retry
        self._sleep = sleep
        self._clock = clock
        self._key = api_key
        self._http = httpx.Client(
            base_url=self.base_url,
            # No key: no Authorization header at all (Vast's offer search is public; `plan` works without keys).
            headers={
                **({"Authorization": f"Bearer {api_key}"} if api_key else {}),
                "Accept": "application/json",
                "User-Agent": user_agent,
            },
            timeout=timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout),
            transport=transport,
            follow_redirects=False,  # a redirect could carry the Authorization header somewhere else
        )

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "ApiClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the one request path ----------------------------------------------------------------------

    # One function on purpose (about 95 lines): every failure kind (timeout, refused connection, 429, 5xx,
    # auth) decides retry-or-raise against the same attempt count, deadline and idempotency; pulled apart,
    # those rules drifted between callers before.
    def call(
        self,
        method: str,
        path: str,
        *,
        what: str,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        ok: Iterable[int] = (200, 201, 202, 204),
        idempotent: bool = True,
        auth_statuses: Iterable[int] = (401, 403),
        lookup: bool = False,
    ) -> httpx.Response:
        """Send one logical request, retrying what is safe to retry; return the response if its status is in ``ok``.

        ``what`` is a short phrase for messages ("creating pod autoslm-x"). With ``idempotent=False``
        a timeout or a 5xx is not retried but raised as ``MaybeApplied``; a 429 or a refused
        connection is still retried, since the server did not act on those. ``lookup=True`` (a look at
        offers or prices, which nothing waits on): one try, with a short connect timeout.
        """
        ok = frozenset(ok)
        auth_statuses = frozenset(auth_statuses)

        def attempt(attempt_no: int) -> httpx.Response:
            try:
                resp = self._http.request(
                    method, path, json=json, params=params, **({"timeout": self._lookup_timeout()} if lookup else {})
                )
            except httpx.TransportError as e:
                failure, give_up = self._no_answer(e, what, idempotent, attempt_no)
                raise TryAgain(give_up, failure) from None
            if resp.status_code in ok:
                return resp
            refused = self._refusal(resp, what, idempotent, auth_statuses)
            if refused is not None:
                raise refused
            after = parse_retry_after(resp.headers.get("Retry-After"))
            raise TryAgain(self._kept_failing(resp, what, attempt_no), f"HTTP {resp.status_code}", after)

        return with_retries(attempt, self.retry, clock=self._clock, sleep=self._sleep, what=what, who=self.provider, once=lookup)

    def _no_answer(self, e: httpx.TransportError, what: str, idempotent: bool, attempt_no: int) -> tuple[str, Exception]:
        """A request that got no answer: (the failure in words, the error to raise when giving up).
        Raises ``MaybeApplied`` at once where the server may have acted on a request that must not be
        sent twice; a connection that never opened did nothing on the server, so even a create retries."""
        if isinstance(e, httpx.TimeoutException):
            if not idempotent and not isinstance(e, (httpx.ConnectTimeout, httpx.PoolTimeout)):
                raise MaybeApplied(
                    f"{self.provider} did not answer in time while {what}; it may have acted on the request",
                    hint="autoslm looks the result up before trying again",
                ) from None
            return f"timed out ({type(e).__name__})", ProviderUnavailable(
                f"{self.provider} did not answer in time while {what} ({attempt_no} tries)",
                hint=f"check your network or {self.provider}'s status page, then try again",
            )
        if not isinstance(e, httpx.ConnectError) and not idempotent:
            raise MaybeApplied(
                f"the connection to {self.provider} broke while {what}; it may have acted on the request",
                hint="autoslm looks the result up before trying again",
            ) from None
        return f"network error ({type(e).__name__})", ProviderUnavailable(
            f"cannot reach {self.provider} at {self.base_url} while {what}: {self._clean(str(e)) or type(e).__name__}",
            hint="check your network" + (f" and {self.url_env}" if self.url_env else ""),
        )

    def _refusal(self, resp: httpx.Response, what: str, idempotent: bool, auth_statuses: frozenset[int]) -> Exception | None:
        """The error for an answer that must not be tried again; None for one that may (RETRY_STATUSES)."""
        status = resp.status_code
        if status in auth_statuses:
            return ProviderAuthError(
                f"{self.provider} refused the API key (HTTP {status}) while {what}: {self.detail(resp)}",
                hint=f"check {self.key_env}",
            )
        if status not in RETRY_STATUSES:
            detail = self.detail(resp)
            return ApiStatusError(
                f"{self.provider} answered HTTP {status} while {what}: {detail}",
                status=status,
                detail=detail,
                body=_json_or_none(resp),
            )
        if status >= 500 and not idempotent:
            return MaybeApplied(
                f"{self.provider} failed (HTTP {status}) while {what}; it may have acted on the request",
                hint="autoslm looks the result up before trying again",
            )
        return None

    def _kept_failing(self, resp: httpx.Response, what: str, attempt_no: int) -> Exception:
        """The error for a retryable answer that kept coming until the tries or the time ran out."""
        if resp.status_code == 429:
            return ProviderRateLimited(
                f"{self.provider} kept rate-limiting us (HTTP 429) while {what} ({attempt_no} tries)",
                hint="wait a minute and try again",
            )
        return ProviderUnavailable(
            f"{self.provider} kept failing (HTTP {resp.status_code}) while {what} ({attempt_no} tries): {self.detail(resp)}",
            hint=f"{self.provider} may be having an outage: try again later",
        )

    def _lookup_timeout(self) -> httpx.Timeout:
        t = self._http.timeout
        return httpx.Timeout(t.read, connect=min(t.connect or LOOKUP_CONNECT_S, LOOKUP_CONNECT_S))

    # -- messages ----------------------------------------------------------------------------------

    def _clean(self, text: str) -> str:
        if self._key:
            text = text.replace(self._key, REDACTED)
        return redact(text)

    def detail(self, resp: httpx.Response, limit: int = 300) -> str:
        """The vendor's human-readable reason, shortened and scrubbed of secrets."""
        body = _json_or_none(resp)
        text = ""
        if isinstance(body, dict):
            parts = [str(body[k]) for k in ("title", "detail", "error", "msg", "message") if body.get(k)]
            errors = body.get("errors")
            if isinstance(errors, list) and errors:
                parts.append("; ".join(str(e) for e in errors[:5]))
            text = ": ".join(dict.fromkeys(parts))  # dedupe, keep order
        if not text:
            text = (resp.text or "").strip().replace("\n", " ")
        if len(text) > limit:
            text = text[: limit - 3] + "..."
        return self._clean(text) or f"HTTP {resp.status_code}"


def _json_or_none(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return None


def check_pod_env(env: Mapping[str, str], api_key: str, provider: str) -> None:
    """Refuse to create a pod whose environment carries the account's API key (under any name): every
    vendor's account key that must not reach a pod, and the pod-scoped keys the vendors inject
    themselves after we create a pod (``vendors.table.never_in_pods``)."""
    from autoslm.vendors.table import never_in_pods

    names = never_in_pods()
    bad = sorted(k for k, v in env.items() if k in names or (api_key and api_key in str(v)))
    if bad:
        raise ProviderError(
            f"refusing to create a {provider} pod whose environment carries an API key ({', '.join(bad)})",
            hint="the worker terminates itself with the key the vendor injects; never pass the account key to a pod",
        )


def require_key(vendor) -> str:
    """A vendor's account key from ``vendor.key_env`` (or credentials.toml ``[vendor.key_section]``);
    ProviderAuthError if none. ``vendor``: a ``vendors.vendor.Vendor``."""
    from autoslm.secrets import provider_key

    key = provider_key(vendor.key_env, vendor.key_section or vendor.name)
    if not key:
        raise ProviderAuthError(
            f"no {vendor.title} API key: set {vendor.key_env}",
            hint=f"create one at {vendor.key_page}, or add [{vendor.key_section or vendor.name}] api_key to $AUTOSLM_HOME/credentials.toml",
        )
    return key
