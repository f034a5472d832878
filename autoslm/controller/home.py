"""One home's control plane: its run registry and a supervisor over the providers and stores.

The SDK's ``Client`` and the background supervisor (``controller/daemon.py``) both build theirs here,
so a detached run is ticked by exactly the code that ticks it in the foreground. Providers and stores
are built lazily, once each: a provider's key is read only when a run needs that provider. So is the
supervisor's code (imported by ``supervisor_of``): a command that only reads the registry and the store
(``status`` of a run its background supervisor keeps, or of one that ended) never loads it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from autoslm.controller.registry import Registry
from autoslm.providers.base import Provider
from autoslm.secrets import autoslm_home
from autoslm.store import Store, open_store

if TYPE_CHECKING:
    from autoslm.controller.supervisor import Supervisor


def default_providers() -> Callable[[str], Provider]:
    from autoslm.providers import get_provider

    cache: dict[str, Provider] = {}

    def get(name: str) -> Provider:
        if name not in cache:
            cache[name] = get_provider(name)
        return cache[name]

    return get


def default_stores() -> Callable[[str], Store]:
    cache: dict[str, Store] = {}

    def get(uri: str) -> Store:
        if uri not in cache:
            cache[uri] = open_store(uri)
        return cache[uri]

    return get


def open_home(
    home: Path | str | None = None,
    *,
    providers: Callable[[str], Provider] | None = None,
    stores: Callable[[str], Store] | None = None,
    clock: Callable[[], float] = time.time,
    log: Callable[[str], None] = lambda msg: None,
) -> Supervisor:
    """The supervisor of ``home`` (default ``$AUTOSLM_HOME``); its ``registry`` is the home's registry."""
    path = home_path(home)
    return supervisor_of(
        path, Registry(path, clock=clock), providers or default_providers(), stores or default_stores(), clock, log
    )


def home_path(home: Path | str | None = None) -> Path:
    """``home``, or ``$AUTOSLM_HOME`` (default ``~/.autoslm``)."""
    return Path(home).expanduser() if home else autoslm_home()


def supervisor_of(
    home: Path,
    registry: Registry,
    providers: Callable[[str], Provider],
    stores: Callable[[str], Store],
    clock: Callable[[], float] = time.time,
    log: Callable[[str], None] = lambda msg: None,
) -> Supervisor:
    """The supervisor of ``home`` over its ``registry`` (its code imported here, when a command first needs it)."""
    from autoslm.controller.supervisor import Supervisor

    return Supervisor(registry, providers, stores, home, clock=clock, log=log)
