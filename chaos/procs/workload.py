"""The load a campaign keeps up while faults happen: producer and consumer threads, each with its
own ``kayos.Client``, recording every call they make into one ``Recorder``.

Producers write acks=all, keyed (a small key space per queue, so versions supersede one another
and de-dup is exercised), with a value unique to each call, some deletes and some all-or-nothing
transactions of distinct keys. Each consumer owns one (queue, group): it takes a snapshot page by
page, records it, and commits the snapshot's boundary; nothing else reads that group.

A queue over several shards (docs/node-api.md, "Queues over several shards") is recorded as one
history queue per shard, ``<queue>/<shard>`` (a name no Kayos queue can have): each shard has its
own seqs, so the checker's per-queue properties hold per shard. A transaction keeps to one
shard's keys, and a consumer then owns one (queue, group, shard).
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass

from chaos.history import Commit, Produce, Recorder, Snapshot
from kayos import Client
from kayos.client.types import Item, Page

# Keys per queue: few enough that versions of a key often supersede each other.
keys_per_queue = 24
# Share of produce calls that are transactions (2..txn_items_max distinct keys), and deletes.
txn_share = 0.2
txn_items_max = 4
delete_share = 0.05
# A consumer's page size and long-poll when nothing is new.
page_size = 200
consume_wait_s = 0.5
# Joining a worker thread once told to stop: one call's retries (the client's own bound) at most.
join_timeout_s = 120.0


def history_queue(queue: str, shard: int | None) -> str:
    """The queue name the history records: ``<queue>/<shard>`` for one shard of a queue with
    several, else the queue's own name."""
    return queue if shard is None else f"{queue}/{shard}"


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode()


@dataclass
class Stats:
    ok: int = 0
    unknown: int = 0


class Producer(threading.Thread):
    def __init__(
        self, number: int, seeds: list[str], queues: list[str], recorder: Recorder, seed: int
    ) -> None:
        super().__init__(name=f"chaos-producer-{number}", daemon=True)
        self.number = number
        self.seeds = seeds
        self.queues = queues
        self.recorder = recorder
        self.rng = random.Random(f"{seed}-producer-{number}")
        self.stop = threading.Event()
        self.stats = Stats()
        self.calls = 0

    def _items(self) -> tuple[list[tuple[str, str | None]], bool]:
        self.calls += 1
        value = f"p{self.number}-{self.calls}"
        roll = self.rng.random()
        if roll < txn_share:
            count = self.rng.randint(2, txn_items_max)
            keys = self.rng.sample(range(keys_per_queue), count)
            return [(f"k{key}", f"{value}.{i}") for i, key in enumerate(keys)], True
        key = f"k{self.rng.randrange(keys_per_queue)}"
        if roll < txn_share + delete_share:
            return [(key, None)], False
        return [(key, value)], False

    def run(self) -> None:
        with Client(self.seeds, name=self.name) as client:
            while not self.stop.is_set():
                queue = self.rng.choice(self.queues)
                items, txn = self._items()
                recorded = queue
                if len(client.topology.shards_for(queue)) > 1:
                    # One batch commits in one shard: keep the keys of the first key's shard.
                    shard = client.topology.shard_for_key(queue, items[0][0].encode())
                    items = [
                        item
                        for item in items
                        if client.topology.shard_for_key(queue, item[0].encode()) == shard
                    ]
                    recorded = history_queue(queue, shard)
                invoked = self.recorder.tick()
                try:
                    first, last = client.produce_batch(
                        queue, [Item(k, v) for k, v in items], acks="all", txn=txn
                    )
                except Exception as error:  # any failure leaves the outcome unknown
                    self.stats.unknown += 1
                    outcome, first, last, why = "unknown", 0, 0, f"{type(error).__name__}: {error}"
                else:
                    self.stats.ok += 1
                    outcome, why = "ok", ""
                completed = self.recorder.tick()
                self.recorder.add(
                    Produce(
                        invoked,
                        recorded,
                        tuple(items),
                        txn,
                        "all",
                        outcome,  # type: ignore[arg-type]
                        first,
                        last,
                        invoked,
                        completed,
                        self.recorder.now_s(),
                        why[:300],
                    )
                )


class Consumer(threading.Thread):
    def __init__(
        self,
        queue: str,
        group: str,
        seeds: list[str],
        recorder: Recorder,
        shard: int | None = None,
    ) -> None:
        suffix = "" if shard is None else f"-{shard}"
        super().__init__(name=f"chaos-consumer-{queue}-{group}{suffix}", daemon=True)
        self.queue = queue
        # One shard of a queue with several (None: the queue's only shard).
        self.shard = shard
        self.recorded = history_queue(queue, shard)
        self.group = group
        self.seeds = seeds
        self.recorder = recorder
        self.stop = threading.Event()
        # Set by the campaign for the drain: stop once a finished snapshot reaches this seq.
        self.drain_to: int | None = None
        self.drained = threading.Event()
        self.snapshots = 0
        self.errors = 0

    def _snapshot(self, client: Client) -> Snapshot | None:
        invoked = self.recorder.tick()
        first: Page | None = None
        messages: list[tuple[int, str, str | None]] = []
        finished = False
        why = ""
        try:
            for page in client.consume(
                self.queue, self.group, page_size=page_size, wait_s=consume_wait_s, shard=self.shard
            ):
                first = first or page
                messages.extend((m.seq, m.key.decode(), _text(m.value)) for m in page.messages)
                finished = page.end
        except Exception as error:
            self.errors += 1
            why = f"{type(error).__name__}: {error}"[:300]
        if first is None:
            return None
        completed = self.recorder.tick()
        snapshot = Snapshot(
            invoked,
            self.recorded,
            self.group,
            first.shard,
            first.hwm,
            first.boundary,
            tuple(messages),
            finished,
            invoked,
            completed,
            self.recorder.now_s(),
            why,
        )
        self.recorder.add(snapshot)
        self.snapshots += 1
        return snapshot

    def _commit(self, client: Client, hwm: int) -> None:
        invoked = self.recorder.tick()
        try:
            client.commit(self.queue, self.group, hwm, shard=self.shard)
        except Exception as error:
            self.errors += 1
            outcome, why = "unknown", f"{type(error).__name__}: {error}"[:300]
        else:
            outcome, why = "ok", ""
        completed = self.recorder.tick()
        self.recorder.add(
            Commit(
                invoked,
                self.recorded,
                self.group,
                hwm,
                outcome,  # type: ignore[arg-type]
                invoked,
                completed,
                self.recorder.now_s(),
                why,
            )
        )

    def run(self) -> None:
        with Client(self.seeds, name=self.name) as client:
            while not self.stop.is_set():
                snapshot = self._snapshot(client)
                if snapshot is None or not snapshot.finished:
                    continue
                if snapshot.boundary > snapshot.hwm:
                    self._commit(client, snapshot.boundary)
                target = self.drain_to
                if target is not None and snapshot.boundary >= target:
                    self.drained.set()
                    return
