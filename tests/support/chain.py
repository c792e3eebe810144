"""Feeding events to the pure chain logic (``kayos.replication.chain.step``) in tests."""

from __future__ import annotations

from kayos.replication import chain
from kayos.replication.chain import Progress, step


def run(progress: Progress, *events: chain.Event) -> tuple[Progress, list[chain.Action]]:
    """Steps ``progress`` through ``events``; the state after and every action, in order."""
    actions: list[chain.Action] = []
    for event in events:
        progress, more = step(progress, event)
        actions.extend(more)
    return progress, actions
