"""Artifact stores: where a run's heartbeats, checkpoints, adapter and metrics live.

``open_store(uri)`` opens one from a URI, the only thing the worker is told about its store:
``file:///abs/dir`` (LocalStore) or ``hf://owner/repo`` (HfStore, a Hugging Face dataset repo).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from autoslm.errors import UsageError
from autoslm.store.artifacts import RunArtifacts
from autoslm.store.base import Store

__all__ = ["RunArtifacts", "Store", "open_store"]


def open_store(uri: str, **kwargs) -> Store:
    """The store a URI names. Anything but ``file://`` and ``hf://`` is refused, never taken for a
    relative folder: a mistyped URI must not quietly write artifacts into the current directory."""
    if uri.startswith("file://"):
        from autoslm.store.local import LocalStore

        return LocalStore(Path(unquote(urlparse(uri).path)))
    if uri.startswith("hf://"):
        from autoslm.store.hf import HfStore

        return HfStore(uri[len("hf://") :].strip("/"), **kwargs)
    raise UsageError(f"unknown store URI {uri!r}", hint="give file:///absolute/dir or hf://owner/repo")
