"""Property tests of the edges' contract (issue 10): whatever arrives, the answer is defined.

- The binary port's codec (``kayos.replication.wire.frames.FrameDecoder``) fed random bytes, valid
  frames cut at random points, and valid frames with random bytes changed: it returns frames or
  raises ``ProtocolError``, never anything else; valid frames come back whole however they are cut.
- The HTTP body parsers (``kayos.node.http.bodies``), called as pure functions, fed random JSON
  values (hypothesis ``recursive``), produce-shaped bodies with random fields, and random bytes:
  they return a value or raise a ``KayosError`` (``InvalidRequest``/``ProtocolError``), never
  another exception.

Derandomized (``derandomize=True``): each run draws the same examples, so CI is stable and a
failure is reproduced by rerunning; hypothesis prints the falsifying example.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kayos.errors import KayosError, ProtocolError
from kayos.node.http.bodies import parse_body, parse_commit, parse_consume, parse_produce
from kayos.replication.wire import frames as fr

pytestmark = pytest.mark.unit

SETTINGS = settings(
    derandomize=True,
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

SAMPLE_FRAMES: list[fr.Frame] = [
    fr.Hello(2, "client-1", None, 0, "client"),
    fr.HelloOk(2, "a", 1),
    fr.Ping(3),
    fr.Produce(1, "q", (b"k", b"j"), (b"v", None), (0, 2**64 - 1), ({"h": b"x"}, None), -1, True),
    fr.WaitCommitted(2, 0, 17, 1000),
    fr.Batch(0, 5, 7, True, (5, 7), (b"q\x00k", b"q\x00j"), (b"v", None), None, None, {"m": 3}),
    fr.ErrorFrame(None, "invalid_request", "bad", None, 1),
    fr.CommitPoint(0, 9),
]
STREAM = b"".join(map(fr.encode, SAMPLE_FRAMES))
FRAME_TYPES = tuple(spec.frame_type for spec in fr.FRAME_TABLE)


def feed_all(chunks: list[bytes]) -> list[fr.Frame]:
    """Feeds every chunk; returns the frames, or raises ProtocolError (the only error allowed)."""
    decoder = fr.FrameDecoder()
    frames: list[fr.Frame] = []
    for chunk in chunks:
        frames += decoder.feed(chunk)
    return frames


@SETTINGS
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_random_bytes_give_frames_or_protocol_error(chunks: list[bytes]) -> None:
    try:
        frames = feed_all(chunks)
    except ProtocolError:
        return
    assert all(isinstance(frame, FRAME_TYPES) for frame in frames)


@SETTINGS
@given(st.lists(st.integers(0, len(STREAM)), max_size=12))
def test_valid_frames_cut_anywhere_come_back_whole(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(STREAM)]
    chunks = [STREAM[a:b] for a, b in itertools.pairwise(points)]
    assert feed_all(chunks) == SAMPLE_FRAMES


@SETTINGS
@given(
    st.lists(st.tuples(st.integers(0, len(STREAM) - 1), st.integers(0, 255)), min_size=1),
    st.lists(st.integers(0, len(STREAM)), max_size=6),
)
def test_damaged_frames_give_frames_or_protocol_error(
    changes: list[tuple[int, int]], cuts: list[int]
) -> None:
    damaged = bytearray(STREAM)
    for position, byte in changes:
        damaged[position] = byte
    points = [0, *sorted(cuts), len(damaged)]
    chunks = [bytes(damaged[a:b]) for a, b in itertools.pairwise(points)]
    try:
        feed_all(chunks)
    except ProtocolError:
        pass


# --- HTTP bodies ---------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    # Lone surrogates: JSON can carry them ("\\ud800"), UTF-8 cannot.
    | st.text(st.characters(categories=["Cs", "Ll", "Nd"]), max_size=6)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.text(max_size=8) | st.sampled_from(["\ud800", "h"]), children, max_size=4
        )
    ),
    max_leaves=24,
)
field_names = st.sampled_from(
    ["key", "value", "delete", "expiry_ms", "headers", "valeu", "txn", "messages", "hwm", "state"]
)
texts = st.text(max_size=8) | st.text(
    st.characters(categories=["Cs", "Ll"]), min_size=1, max_size=4
)
# Near-valid messages: the right fields, each with a random value (text more often than not).
near_valid = st.fixed_dictionaries(
    {"key": texts | json_scalars, "value": texts | json_scalars},
    optional={
        "delete": json_scalars,
        "expiry_ms": st.integers(-(2**65), 2**65) | json_scalars,
        "headers": st.dictionaries(texts, texts | json_scalars, max_size=3),
        "valeu": json_scalars,
    },
)
messages = st.dictionaries(field_names, json_values, max_size=5) | near_valid
produce_bodies = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"messages": st.lists(messages, max_size=4)},
        optional={"txn": json_values, "extra": json_values},
    ),
    st.fixed_dictionaries({"messages": st.lists(near_valid, min_size=1, max_size=3)}),
)


def defined(parse: Any, value: Any) -> None:
    try:
        parse(value)
    except KayosError:
        pass


@settings(SETTINGS, max_examples=1000)
@given(produce_bodies)
def test_produce_parser_answers_every_json_value(body: Any) -> None:
    defined(parse_produce, body)
    defined(parse_commit, body)
    raw = json.dumps(body).encode()
    defined(lambda data: parse_produce(parse_body(data, "application/json")), raw)
    packed = msgpack.packb(body, use_bin_type=True) if _packable(body) else b"\xc1"
    defined(lambda data: parse_produce(parse_body(data, "application/msgpack")), packed)


@SETTINGS
@given(
    st.dictionaries(st.sampled_from(["after", "upto", "limit", "wait_ms"]), st.text(max_size=30))
)
def test_consume_parameters_answer_every_query(query: dict[str, str]) -> None:
    defined(parse_consume, query)


@SETTINGS
@given(st.binary(max_size=200), st.sampled_from(["application/json", "application/msgpack"]))
def test_random_bodies_are_parsed_or_refused(raw: bytes, content_type: str) -> None:
    defined(lambda data: parse_produce(parse_body(data, content_type)), raw)


def _packable(value: Any) -> bool:
    """msgpack holds ints in [-2^63, 2^64) and text with a UTF-8 form."""
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return True
    if isinstance(value, str):
        return value.encode(errors="ignore") == value.encode(errors="surrogatepass")
    if isinstance(value, int):
        return -(2**63) <= value < 2**64
    if isinstance(value, list):
        return all(map(_packable, value))
    if isinstance(value, dict):
        return all(map(_packable, value)) and all(map(_packable, value.values()))
    return False
