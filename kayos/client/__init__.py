"""The Kayos client: ``AsyncClient`` (asyncio) and ``Client`` (blocking), plus the value types
they share with embedded mode. Imported lazily so ``kayos.client.types`` does not pull in aiohttp.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kayos.client.aio import AsyncClient
    from kayos.client.sync import Client
    from kayos.client.types import (
        CommitInfo,
        GroupInfo,
        Item,
        Message,
        Page,
        ShardSeqs,
        Transaction,
    )

_HOMES = {
    "AsyncClient": "kayos.client.aio",
    "Client": "kayos.client.sync",
    "CommitInfo": "kayos.client.types",
    "GroupInfo": "kayos.client.types",
    "Item": "kayos.client.types",
    "Message": "kayos.client.types",
    "Page": "kayos.client.types",
    "ShardSeqs": "kayos.client.types",
    "Transaction": "kayos.client.types",
}

__all__ = [
    "AsyncClient",
    "Client",
    "CommitInfo",
    "GroupInfo",
    "Item",
    "Message",
    "Page",
    "ShardSeqs",
    "Transaction",
]

assert set(__all__) == {*_HOMES}, "every public name has one home"


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
