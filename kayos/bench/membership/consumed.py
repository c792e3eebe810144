"""After ``kayos bench grow``'s moves: is every acknowledged message consumed, and in order?
(issue 13's acceptance: "every acknowledged message consumed in order after"; docs/operations.md,
"What a move costs the producers").

Each producer thread sends its messages one at a time, message ``n`` to queue ``n mod Q``, with
the key ``<thread>-<n>``, and the next only once the last was answered: so within one queue a
thread's acknowledged messages must come out of a consumer group in increasing ``n``. The check
writes an end marker to each queue (acks=all), consumes the queue with a fresh group from the
start until the marker (committing each snapshot's boundary), and compares with the keys the
producers recorded as acknowledged (``Producers.acked``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kayos.client.sync import Client
from kayos.errors import OperationTimeoutError

GROUP = "bench-grow-check"
END_KEY = "_end"
EXAMPLES_MAX = 5
CONSUME_WAIT_S = 1.0


def _thread_and_n(key: str) -> tuple[str, int] | None:
    thread, _, n = key.rpartition("-")
    return (thread, int(n)) if thread and n.isdigit() else None


def order_verdict(
    acked: Iterable[tuple[str, str]], consumed: Mapping[str, Sequence[str]]
) -> dict[str, Any]:
    """``acked``: (queue, key) of each acknowledged message; ``consumed``: each queue's keys in
    the order its consumer group got them. ``lost``: acknowledged keys never consumed;
    ``out_of_order``: acknowledged keys consumed before an earlier message of the same thread in
    the same queue; ``consumed_in_order``: both 0."""
    positions: dict[str, dict[str, int]] = {}
    for queue, keys in consumed.items():
        found = positions.setdefault(queue, {})
        for index, key in enumerate(keys):
            found.setdefault(key, index)
    lost: list[str] = []
    runs: dict[tuple[str, str], list[tuple[int, int]]] = {}
    count = 0
    for queue, key in acked:
        count += 1
        where = positions.get(queue, {}).get(key)
        parsed = _thread_and_n(key)
        if where is None:
            lost.append(key)
        elif parsed is not None:
            runs.setdefault((queue, parsed[0]), []).append((parsed[1], where))
    disordered: list[str] = []
    for (_queue, thread), run in runs.items():
        latest = -1
        for n, where in sorted(run):
            if where < latest:
                disordered.append(f"{thread}-{n}")
            latest = max(latest, where)
    return {
        "acked_messages": count,
        "consumed_messages": sum(len(keys) for keys in consumed.values()),
        "lost": len(lost),
        "out_of_order": len(disordered),
        "consumed_in_order": not lost and not disordered,
        "lost_examples": sorted(lost)[:EXAMPLES_MAX],
        "out_of_order_examples": sorted(disordered)[:EXAMPLES_MAX],
    }


def consume_until_marker(client: Client, queue: str, timeout_s: float) -> list[str]:
    """Writes ``END_KEY`` to ``queue`` (acks=all) and consumes the queue with ``GROUP`` from the
    start until it comes; returns the keys consumed before it, in order."""
    client.produce(queue, END_KEY, "end", acks="all")
    keys: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for page in client.consume(queue, GROUP, wait_s=CONSUME_WAIT_S):
            for message in page.messages:
                key = message.key.decode()
                if key == END_KEY:
                    return keys
                keys.append(key)
            if page.end:
                client.commit(queue, GROUP, page.boundary, shard=page.shard)
                break
    raise OperationTimeoutError(f"{queue}: the end marker was not consumed within {timeout_s} s")


def check_consumed(
    urls: list[str], queues: Sequence[str], acked: Sequence[tuple[str, str]], timeout_s: float
) -> dict[str, Any]:
    """Consumes every queue to its end marker and returns ``order_verdict``."""
    with Client(urls, name="bench-grow-check") as client:
        consumed = {queue: consume_until_marker(client, queue, timeout_s) for queue in queues}
    return order_verdict(acked, consumed)
