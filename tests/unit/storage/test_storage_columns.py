"""``ShardStore.commit_columns``: a batch given as columns (keys, values, expiries, headers)
instead of one ``Put``/``Delete`` per entry (docs/storage-format.md, "Commit").

Goal: a batch committed as columns leaves exactly what the same batch committed as ops leaves
(the same file bytes, index and results), is checked exactly as strictly (the same error, and
nothing written), and keeps the promises of a commit: explicit seqs, ``last_seq``, metadata and
group commit.
"""

from __future__ import annotations

import random
import threading
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import example, given, note, settings
from hypothesis import strategies as st

from kayos import limits
from kayos.clock import ManualClock
from kayos.errors import InvalidRequest, LimitExceeded
from kayos.storage.engine import (
    CommitResult,
    Delete,
    Op,
    Put,
    ShardStore,
    StoreOptions,
    ops_to_columns,
    prepare_columns,
)
from tests.support.storage import (
    JOIN_TIMEOUT_S,
    TEST_STORE_UUID,
    HeldFileOps,
    WaitWatchingCondition,
)

pytestmark = pytest.mark.unit

if TYPE_CHECKING:
    from pathlib import Path

    from kayos.storage.disk.fileops import FileOps

Outcome = tuple[Any, ...]


def open_store(path: Path, name: str, fileops: FileOps | None = None) -> ShardStore:
    options = StoreOptions(store_uuid=TEST_STORE_UUID)
    if fileops is None:
        return ShardStore.open(str(path / name), clock=ManualClock(), options=options)
    return ShardStore.open(str(path / name), fileops=fileops, clock=ManualClock(), options=options)


def file_bytes(store: ShardStore) -> bytes:
    with open(store.path, "rb") as handle:
        return handle.read()


def state(store: ShardStore) -> tuple[Any, ...]:
    """Everything a commit leaves behind: the file, the key index, the successor map, the
    counters and what a scan (deletes and expired entries included) sees."""
    succ = store._index.succ
    with store.snapshot() as snapshot:
        entries = [tuple(e) for page in snapshot.pages(include_expired=True) for e in page]
    return (
        file_bytes(store),
        list(store._index.iter_latest()),
        [succ.get(seq) for seq in range(store.last_seq + 2)],
        store.stats(),
        store.meta,
        entries,
    )


def attempt(commit: Any, *args: Any, **kwargs: Any) -> Outcome:
    try:
        return tuple(commit(*args, **kwargs))
    except (InvalidRequest, LimitExceeded) as exc:
        return (type(exc).__name__, str(exc))


# --- equivalence with commit(ops) -----------------------------------------------------------------


def random_batch(rng: random.Random, keys: list[bytes]) -> list[Op]:
    """Puts (small, empty, out-of-line values; expiries; headers, empty ones too), deletes and
    keys that repeat within the batch and across batches; now and then one bad entry."""
    ops: list[Op] = []
    for _ in range(rng.choice([0, 1, 2, 7, 60, 400])):
        key = rng.choice(keys)
        if rng.random() < 0.1:
            ops.append(Delete(key))
            continue
        value = rng.choice(
            [b"", b"v%d" % rng.randrange(100), b"L" * rng.choice([2048, 2049, 6000])]
        )
        expiry = rng.choice([0, 0, 0, 1, 1_700_000_000_000])
        headers = rng.choice([None, None, {}, {"h": b"1"}])
        ops.append(Put(key, value, expiry, headers))
    if ops and rng.random() < 0.05:
        bad = rng.choice([Put(b"", b"x"), Put(b"k", b"x", -1), Put(b"k" * 5000, b"x")])
        ops.insert(rng.randrange(len(ops)), bad)
    return ops


def random_options(rng: random.Random, store: ShardStore, count: int) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if rng.random() < 0.2:
        options["meta"] = {rng.choice(["a", "b"]): rng.choice([None, 1, b"z"])}
    if rng.random() < 0.3:
        start = store.last_seq + rng.choice([0, 1, 1, 5])  # 0: no longer above the last seq
        options["seqs"] = [start + 3 * index for index in range(count)]
        if rng.random() < 0.5:
            options["last_seq"] = (options["seqs"][-1] if count else store.last_seq) + 2
    elif not count and rng.random() < 0.5:
        options["claim_seq"] = True
    return options


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
@example(seed=0)
def test_commit_columns_leaves_what_commit_leaves(tmp_path_factory: Any, seed: int) -> None:
    """Random batches committed as ops into one store and as columns into another give the same
    results and errors, and the same file bytes, index, successor map and scans."""
    note(f"reproduce with seed={seed}")
    print(f"seed={seed}")
    path = tmp_path_factory.mktemp("columns")
    rng = random.Random(seed)
    keys = [b"k%d" % n for n in range(rng.choice([3, 40, 3000]))]
    by_ops, by_columns = open_store(path, "ops"), open_store(path, "columns")
    try:
        for _ in range(rng.randint(1, 12)):
            ops = random_batch(rng, keys)
            options = random_options(rng, by_ops, len(ops))
            columns = ops_to_columns(ops)
            assert attempt(by_ops.commit, ops, **options) == attempt(
                by_columns.commit_columns, *columns, **options
            )
        assert state(by_ops) == state(by_columns)
    finally:
        by_ops.close()
        by_columns.close()


def test_columns_may_be_tuples_and_leave_the_callers_columns_alone(tmp_path: Path) -> None:
    store = open_store(tmp_path, "shard")
    keys, values = (b"a", b"b"), (b"1", b"2")
    expiries, headers = [0, 5], [None, {"h": b"x"}]
    try:
        assert store.commit_columns(keys, values, expiries, headers) == CommitResult(1, 2, 1)
        assert (keys, values, expiries, headers) == (
            (b"a", b"b"),
            (b"1", b"2"),
            [0, 5],
            [None, {"h": b"x"}],
        )
        entry = store.get(b"b", now_ms=1)
        assert entry is not None
        assert (entry.value, entry.expiry_ms, entry.headers) == (b"2", 5, {"h": b"x"})
    finally:
        store.close()


# --- deletes, expiries, headers ------------------------------------------------------------------


def test_a_none_value_deletes_its_key_and_has_no_expiry_or_headers(tmp_store: ShardStore) -> None:
    tmp_store.commit_columns([b"a", b"b"], [b"1", b"2"])
    result = tmp_store.commit_columns([b"a", b"c"], [None, b"3"], [7, 9], [{"ignored": b"1"}, None])
    assert result == CommitResult(3, 4, 2)
    assert tmp_store.get(b"a") is None
    with tmp_store.snapshot() as snapshot:
        entries = [e for page in snapshot.pages(include_expired=True) for e in page]
    tombstone = next(e for e in entries if e.key == b"a")
    assert (tombstone.seq, tombstone.value, tombstone.deleted) == (3, None, True)
    assert (tombstone.expiry_ms, tombstone.headers, tombstone.prev_seq) == (0, None, 1)
    assert [e.key for e in entries] == [b"b", b"a", b"c"]
    # The delete's own size is its key's: its ignored headers add nothing.
    assert tmp_store.stats()["payload_bytes"] == 2 * 2 + 1 + 2


def test_expiries_and_headers_are_stored_per_entry(
    tmp_store: ShardStore, clock: ManualClock
) -> None:
    now_ms = int(clock.now_s() * 1000)
    tmp_store.commit_columns(
        [b"soon", b"never", b"tagged", b"untagged"],
        [b"1", b"2", b"3", b"4"],
        [now_ms + 1000, 0, 0, 0],
        [None, None, {"kind": b"x"}, {}],
    )
    assert tmp_store.get(b"soon") is not None
    clock.advance(2.0)
    assert tmp_store.get(b"soon") is None
    tagged, untagged = tmp_store.get(b"tagged"), tmp_store.get(b"untagged")
    assert tagged is not None
    assert untagged is not None
    assert (tagged.headers, untagged.headers) == ({"kind": b"x"}, None)
    # Empty headers are none: the same entry as ``Put(key, value)``.
    expected = prepare_columns([b"tagged"], [b"3"], None, [{"kind": b"x"}]).sizes[0]
    assert expected > len(b"tagged") + 1
    assert tmp_store.stats()["payload_bytes"] == 5 + 6 + expected + 9


# --- explicit seqs and last_seq ------------------------------------------------------------------


def test_explicit_seqs_and_last_seq(tmp_store: ShardStore) -> None:
    assert tmp_store.commit_columns([b"a", b"b"], [b"1", b"2"], seqs=[5, 7], last_seq=10) == (
        CommitResult(5, 10, 1)
    )
    assert [e.seq for e in tmp_store.scan()] == [5, 7]
    assert tmp_store.last_seq == 10
    assert tmp_store.commit_columns([b"c"], [b"3"]) == CommitResult(11, 11, 2)
    assert tmp_store.commit_columns([], [], last_seq=20) == CommitResult(12, 20, 3)
    assert tmp_store.commit_columns([], [], claim_seq=True) == CommitResult(21, 21, 4)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"seqs": [3]}, "seqs and ops differ in length"),
        ({"seqs": [4, 4]}, "strictly increasing"),
        ({"seqs": [4, 3]}, "strictly increasing"),
        ({"seqs": [2, 3]}, "not above last seq 2"),
        ({"seqs": [5, 6], "last_seq": 5}, "below the explicit seq 6"),
        ({"last_seq": 2}, "last_seq 2 is not above last seq 2"),
        ({"claim_seq": True}, "claim_seq is for a commit without ops"),
        ({"seqs": [3, 3 + limits.seq_gap_max]}, "seq_gap_max"),
    ],
)
def test_bad_seqs_are_refused_and_change_nothing(
    tmp_store: ShardStore, options: dict[str, Any], message: str
) -> None:
    tmp_store.commit_columns([b"a", b"b"], [b"1", b"2"])
    before = state(tmp_store)
    with pytest.raises(InvalidRequest, match=message):
        tmp_store.commit_columns([b"c", b"d"], [b"3", b"4"], **options)
    assert state(tmp_store) == before


# --- validation -----------------------------------------------------------------------------------

_BIG_HEADERS = {"h": b"x" * (limits.headers_bytes_max + 1)}

BAD_BATCHES: list[tuple[str, tuple[Any, ...], type[Exception], str]] = [
    ("empty key", ([b"a", b""], [b"1", b"2"]), InvalidRequest, "non-empty bytes"),
    ("str key", ([b"a", "b"], [b"1", b"2"]), InvalidRequest, "non-empty bytes"),
    ("long key", ([b"k" * (limits.key_bytes_max + 1)], [b"1"]), LimitExceeded, "key of"),
    ("str value", ([b"a"], ["1"]), InvalidRequest, "values must be bytes"),
    ("big value", ([b"a"], [b"v" * (limits.value_bytes_max + 1)]), LimitExceeded, "value of"),
    ("negative expiry", ([b"a"], [b"1"], [-1]), InvalidRequest, "expiry_ms must be >= 0"),
    ("u64 expiry", ([b"a"], [b"1"], [2**64]), InvalidRequest, "expiry_ms must be <="),
    ("delete's u64 expiry", ([b"a"], [None], [2**64]), InvalidRequest, "expiry_ms must be <="),
    ("float expiry", ([b"a"], [b"1"], [1.5]), InvalidRequest, "expiry_ms must be an int"),
    ("big headers", ([b"a"], [b"1"], None, [_BIG_HEADERS]), LimitExceeded, "headers of"),
    ("short values", ([b"a", b"b"], [b"1"]), InvalidRequest, "differ in length"),
    ("short expiries", ([b"a", b"b"], [b"1", b"2"], [0]), InvalidRequest, "differ in length"),
    ("too many", ([b"k"] * (limits.batch_entries_max + 1), [b"1"] * 2), LimitExceeded, "batch of"),
    (
        "too many bytes",
        ([b"a%d" % n for n in range(20)], [b"v" * limits.value_bytes_max] * 20),
        LimitExceeded,
        "bytes exceeds",
    ),
    # Entry order decides: the value of entry 0 is reported before the key of entry 1.
    (
        "first error",
        ([b"a", b""], [b"v" * (limits.value_bytes_max + 1), b"1"]),
        LimitExceeded,
        "value of",
    ),
]


@pytest.mark.parametrize(
    ("columns", "error", "message"),
    [pytest.param(c, e, m, id=name) for name, c, e, m in BAD_BATCHES],
)
def test_bad_columns_are_refused_and_change_nothing(
    tmp_store: ShardStore, columns: tuple[Any, ...], error: type[Exception], message: str
) -> None:
    tmp_store.commit_columns([b"a"], [b"0"])
    before = state(tmp_store)
    with pytest.raises(error, match=message):
        tmp_store.commit_columns(*columns)
    assert state(tmp_store) == before


@pytest.mark.parametrize(
    "ops",
    [
        [Put(b"a", b"1"), Put(b"", b"2")],
        [Put(b"a", b"v" * (limits.value_bytes_max + 1)), Put(b"", b"2")],
        [Put(b"a", b"1", -5), Delete(b"k" * (limits.key_bytes_max + 1))],
        [Delete(b"a"), Put(b"b", b"1", 0, _BIG_HEADERS)],
        [Put(b"", b"1"), "not an op"],
        [Put(b"a", b"1"), "not an op", Put(b"", b"1")],
    ],
    ids=["key", "value-then-key", "expiry-then-key", "headers", "bad-before-unknown", "unknown"],
)
def test_commit_and_commit_columns_refuse_a_batch_with_the_same_error(
    tmp_path: Path, ops: list[Any]
) -> None:
    """``commit`` checks its ops through the columns path; the error is the one an entry-by-entry
    check meets first, whichever way the batch comes in."""
    store = open_store(tmp_path, "shard")
    try:
        refused = attempt(store.commit, ops)
        assert refused[0] in ("InvalidRequest", "LimitExceeded")
        if all(isinstance(op, Put | Delete) for op in ops):
            assert attempt(store.commit_columns, *ops_to_columns(ops)) == refused
        assert store.last_seq == 0
    finally:
        store.close()


def test_validated_columns_skip_the_checks_but_are_measured(tmp_store: ShardStore) -> None:
    """``validated=True`` trusts the caller's checks (the head checks before queueing) and still
    measures each entry for the counters and leaf cuts."""
    columns = ([b"a", b"bb"], [b"123", b"4"], None, [None, {"h": b"x"}])
    checked = prepare_columns(*columns)
    result = tmp_store.commit_columns(*columns, validated=True)
    assert result == CommitResult(1, 2, 1)
    assert tmp_store.stats()["payload_bytes"] == checked.payload_bytes == sum(checked.sizes)


# --- group commit ---------------------------------------------------------------------------------


def test_a_group_of_column_batches_equals_the_batches_one_at_a_time(tmp_path: Path) -> None:
    """Three batches queued behind a held commit are written as one group: each optional column
    (expiries, headers) present in only some of them, a key repeated across them, deletes and an
    out-of-line value. The entries, index and counters match the same batches committed one by
    one; only the commit numbers differ."""
    now_ms = 1_700_000_000_000
    batches: list[tuple[Any, ...]] = [
        ([b"a", b"b"], [b"1", b"2"], None, None),
        ([b"c", b"a"], [b"3", b"4"], [now_ms + 10, 0], None),
        ([b"b", b"d", b"e"], [None, b"L" * 3000, b"5"], None, [None, None, {"h": b"x"}]),
    ]
    held = HeldFileOps()
    grouped = open_store(tmp_path, "grouped", held)
    watched = WaitWatchingCondition()
    grouped._cv = watched
    one_by_one = open_store(tmp_path, "one-by-one")
    results: dict[int, CommitResult] = {}

    def run(number: int) -> None:
        results[number] = grouped.commit_columns(*batches[number])

    try:
        held.hold_next = True
        leader = threading.Thread(target=grouped.commit_columns, args=([b"first"], [b"0"]))
        leader.start()
        assert held.held.wait(JOIN_TIMEOUT_S)
        followers = [threading.Thread(target=run, args=(n,)) for n in range(len(batches))]
        for number, thread in enumerate(followers):
            thread.start()
            watched.wait_for_waiters(number + 1)  # queued in this order
        held.release.set()
        for thread in [leader, *followers]:
            thread.join(JOIN_TIMEOUT_S)
        assert not any(thread.is_alive() for thread in [leader, *followers])
        assert {result.commit_no for result in results.values()} == {2}
        one_by_one.commit_columns([b"first"], [b"0"])
        for number, batch in enumerate(batches):
            alone = one_by_one.commit_columns(*batch)
            assert (alone.first_seq, alone.last_seq) == results[number][:2]
        grouped_state, alone_state = state(grouped), state(one_by_one)
        assert grouped_state[1:3] == alone_state[1:3]  # index and successor map
        assert grouped_state[5] == alone_state[5]  # every entry, flags and prevs included
        for name in ("entry_count", "payload_bytes", "superseded_count", "superseded_bytes"):
            assert grouped_state[3][name] == alone_state[3][name], name
    finally:
        held.release.set()
        grouped.close()
        one_by_one.close()


# --- fixes ------------------------------------------------------------------------------------


def test_pages_refuses_a_page_size_below_one(tmp_store: ShardStore) -> None:
    """``page_entries=0`` could never hand out a page (it used to loop for ever)."""
    tmp_store.commit_columns([b"a"], [b"1"])
    with tmp_store.snapshot() as snapshot:
        for size in (0, -1):
            with pytest.raises(InvalidRequest, match="page_entries"):
                snapshot.pages(page_entries=size)
        assert [len(page) for page in snapshot.pages(page_entries=1)] == [1]


def test_a_successor_map_that_cannot_grow_fails_the_commit_before_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The successor map is grown before the commit is written: when that fails, nothing is
    durable (before, the commit was on disk while its in-memory state was never installed)."""
    store = open_store(tmp_path, "shard")
    try:
        store.commit_columns([b"a"], [b"1"])
        before = file_bytes(store)

        def refuse(seq: int) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(store._index.succ, "ensure", refuse)
        with pytest.raises(OSError, match="No space"):
            store.commit_columns([b"a"], [b"2"])
        assert file_bytes(store) == before
        assert store.last_seq == 1
        monkeypatch.undo()
        assert store.commit_columns([b"a"], [b"3"]) == CommitResult(2, 2, 2)
    finally:
        store.close()
    reopened = open_store(tmp_path, "shard")
    try:
        entry = reopened.get(b"a")
        assert entry is not None
        assert (entry.seq, entry.value, entry.prev_seq) == (2, b"3", 1)
    finally:
        reopened.close()
