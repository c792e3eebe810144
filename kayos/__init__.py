"""Kayos: a fault-tolerant, durable, de-duplicating message queue cluster.

The public names below are imported on first use, so ``import kayos`` stays cheap (no aiohttp, no
storage engine) for tools that need only a part of it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kayos.client.aio import AsyncClient
    from kayos.client.sync import Client
    from kayos.client.types import CommitInfo, GroupInfo, Item, Message, Page, Transaction
    from kayos.embedded import EmbeddedQueue, open_queue

__version__ = "0.1.0"

_HOMES = {
    "AsyncClient": "kayos.client.aio",
    "Client": "kayos.client.sync",
    "CommitInfo": "kayos.client.types",
    "EmbeddedQueue": "kayos.embedded",
    "GroupInfo": "kayos.client.types",
    "Item": "kayos.client.types",
    "Message": "kayos.client.types",
    "Page": "kayos.client.types",
    "Transaction": "kayos.client.types",
    "open_queue": "kayos.embedded",
}

__all__ = [
    "AsyncClient",
    "Client",
    "CommitInfo",
    "EmbeddedQueue",
    "GroupInfo",
    "Item",
    "Message",
    "Page",
    "Transaction",
    "__version__",
    "open_queue",
]

assert set(__all__) == {*_HOMES, "__version__"}, "every public name has one home"


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
