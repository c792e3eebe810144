"""GET key options of the Kestrel memcache front (spec §3.1-§3.3).

Every row of the spec's GET table is parsed here, together with the §3.2 refusals and the order in
which Kestrel checks them. ``kestrel_compat.wire.get_options`` is pure, so these tests need no
connection.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kayos.errors import InvalidRequest
from kestrel_compat.wire.get_options import (
    GetKey,
    GetOptions,
    GetOptionsError,
    format_get_key,
    parse_get_key,
)
from kestrel_compat.wire.memcache_commands import (
    CLIENT_ERROR_CLOSE,
    CLIENT_ERROR_KEEP,
    SILENT_CLOSE,
    ErrorClass,
)

pytestmark = pytest.mark.unit


def key(
    queue: str,
    *,
    timeout_ms: int | None = None,
    open: bool = False,
    close: bool = False,
    abort: bool = False,
    peek: bool = False,
) -> GetKey:
    options = GetOptions(timeout_ms=timeout_ms, open=open, close=close, abort=abort, peek=peek)
    return GetKey(queue=queue, options=options)


# One row per form of the spec §3.3 table, each with and without `t=`, in more than one order.
ACCEPTED: list[tuple[str, GetKey]] = [
    # none, t=N
    ("q", key("q")),
    ("q/t=500", key("q", timeout_ms=500)),
    ("q/t=0", key("q", timeout_ms=0)),
    # peek [t=N]
    ("q/peek", key("q", peek=True)),
    ("q/peek/t=5", key("q", peek=True, timeout_ms=5)),
    ("q/t=5/peek", key("q", peek=True, timeout_ms=5)),
    # open [t=N]
    ("q/open", key("q", open=True)),
    ("q/t=500/open", key("q", open=True, timeout_ms=500)),
    ("q/open/t=500", key("q", open=True, timeout_ms=500)),
    # close (± t=)
    ("q/close", key("q", close=True)),
    ("q/close/t=10", key("q", close=True, timeout_ms=10)),
    # close/open, in either order
    ("q/close/open", key("q", close=True, open=True)),
    ("q/open/close", key("q", close=True, open=True)),
    ("q/t=500/close/open", key("q", close=True, open=True, timeout_ms=500)),
    # abort (± t=)
    ("q/abort", key("q", abort=True)),
    ("q/abort/t=10", key("q", abort=True, timeout_ms=10)),
    # repeated options are the same option
    ("q/open/open", key("q", open=True)),
    ("q/peek/peek", key("q", peek=True)),
]

# §3.1: parts that are not options are ignored; option words are exact and case-sensitive.
IGNORED: list[tuple[str, GetKey]] = [
    ("q/xyz", key("q")),
    ("q/OPEN", key("q")),
    ("q/Peek", key("q")),
    ("q/open ", key("q")),
    ("q/T=5", key("q")),
    ("q/", key("q")),
    ("q//", key("q")),
    ("q//open", key("q", open=True)),
    ("q/xyz/open/zzz", key("q", open=True)),
    ("Q", key("Q")),
    ("a+b", key("a+b")),
    ("a.b", key("a.b")),
    ("é", key("é")),
    ("q\r", key("q\r")),
]

# §3.1: t= is a Java int of relative milliseconds; the last one wins.
TIMEOUTS: list[tuple[str, GetKey]] = [
    ("q/t=5/t=7", key("q", timeout_ms=7)),
    ("q/t=7/t=5", key("q", timeout_ms=5)),
    ("q/t=-5", key("q", timeout_ms=-5)),
    ("q/t=+5", key("q", timeout_ms=5)),
    ("q/t=0005", key("q", timeout_ms=5)),
    ("q/t=2147483647", key("q", timeout_ms=2147483647)),
    ("q/t=-2147483648", key("q", timeout_ms=-2147483648)),
]

# §3.2 (and §1.3): refusals with the exact error class, in Kestrel's order of checks.
REFUSED: list[tuple[str, ErrorClass]] = [
    # A key of slashes splits into nothing: CLIENT_ERROR, connection kept.
    ("/", CLIENT_ERROR_KEEP),
    ("//", CLIENT_ERROR_KEEP),
    ("///", CLIENT_ERROR_KEEP),
    # An empty queue name: CLIENT_ERROR and close.
    ("", CLIENT_ERROR_CLOSE),
    ("/open", CLIENT_ERROR_CLOSE),
    ("/t=5", CLIENT_ERROR_CLOSE),
    ("//open", CLIENT_ERROR_CLOSE),
    # Forbidden combinations: CLIENT_ERROR and close.
    ("q/peek/open", CLIENT_ERROR_CLOSE),
    ("q/open/peek", CLIENT_ERROR_CLOSE),
    ("q/peek/close", CLIENT_ERROR_CLOSE),
    ("q/abort/open", CLIENT_ERROR_CLOSE),
    ("q/close/abort", CLIENT_ERROR_CLOSE),
    ("q/peek/abort", CLIENT_ERROR_CLOSE),
    ("q/close/open/peek", CLIENT_ERROR_CLOSE),
    ("q/t=5/abort/peek", CLIENT_ERROR_CLOSE),
    # t= that is not a Java int: closed with nothing sent.
    ("q/t=", SILENT_CLOSE),
    ("q/t=x", SILENT_CLOSE),
    ("q/t=1.5", SILENT_CLOSE),
    ("q/t= 5", SILENT_CLOSE),
    ("q/t=1_000", SILENT_CLOSE),
    ("q/t=2147483648", SILENT_CLOSE),
    ("q/t=-2147483649", SILENT_CLOSE),
    ("q/t=5/t=x", SILENT_CLOSE),
    ("q/t=x/t=5", SILENT_CLOSE),
    # A bad t= is found while reading the options, before the name and conflicts are checked.
    ("q/peek/open/t=x", SILENT_CLOSE),
    ("/t=x", SILENT_CLOSE),
    ("/open/t=x", SILENT_CLOSE),
]


@pytest.mark.parametrize(("text", "expected"), ACCEPTED + IGNORED + TIMEOUTS)
def test_accepted_keys(text: str, expected: GetKey) -> None:
    """Spec §3.1 and every row of the §3.3 table: the key parses to this queue and these options."""
    assert parse_get_key(text) == expected


@pytest.mark.parametrize(("text", "error_class"), REFUSED)
def test_refused_keys(text: str, error_class: ErrorClass) -> None:
    """Spec §3.2 and §1.3: refused keys get exactly this reply and close decision."""
    with pytest.raises(GetOptionsError) as caught:
        parse_get_key(text)
    assert caught.value.error_class == error_class


def test_refusals_are_invalid_requests() -> None:
    """Spec §3.2: a refused key is a Kayos InvalidRequest, so generic handlers can catch it."""
    with pytest.raises(InvalidRequest):
        parse_get_key("q/peek/open")


@pytest.mark.parametrize(
    ("flags", "fetches", "removes"),
    [
        ({}, True, True),
        ({"peek": True}, True, False),
        ({"open": True}, True, True),
        ({"close": True}, False, False),
        ({"close": True, "open": True}, True, True),
        ({"abort": True}, False, False),
    ],
)
def test_fetches_and_removes(flags: dict[str, bool], fetches: bool, removes: bool) -> None:
    """Spec §3.3: close alone and abort fetch nothing; peek fetches without removing."""
    for timeout_ms in (None, 0, 500):
        options = GetOptions(timeout_ms=timeout_ms, **flags)
        assert options.fetches is fetches
        assert options.removes is removes


_WORDS = ("open", "close", "abort", "peek")


def _conflicting(given: set[str]) -> bool:
    transaction = bool(given & {"open", "close"})
    return (bool(given & {"peek", "abort"}) and transaction) or {"peek", "abort"} <= given


@pytest.mark.parametrize("with_timeout", [False, True])
def test_every_flag_combination(with_timeout: bool) -> None:
    """Spec §3.2: exactly the forbidden combinations are refused, in any order; others parse."""
    for size in range(len(_WORDS) + 1):
        for combination in itertools.combinations(_WORDS, size):
            given = set(combination)
            parts = [*combination, "t=9"] if with_timeout else list(combination)
            for order in itertools.permutations(parts):
                outcome = _parse_or_error("/".join(("q", *order)))
                if _conflicting(given):
                    assert outcome == CLIENT_ERROR_CLOSE
                    continue
                assert isinstance(outcome, GetKey)
                assert outcome.queue == "q"
                options = outcome.options
                assert {w for w in _WORDS if getattr(options, w)} == given
                assert options.timeout_ms == (9 if with_timeout else None)


def test_forbidden_options_cannot_be_built() -> None:
    """Spec §3.2: a GetOptions with a forbidden combination is a programming error."""
    for flags in ({"peek": True, "open": True}, {"abort": True, "close": True}):
        with pytest.raises(AssertionError):
            GetOptions(**flags)
    with pytest.raises(AssertionError):
        GetOptions(peek=True, abort=True)


_QUEUE_NAMES = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0xFF, exclude_characters="/"),
    min_size=1,
    max_size=20,
)


@st.composite
def _options(draw: st.DrawFn) -> GetOptions:
    timeout_ms = draw(st.none() | st.integers(min_value=-(2**31), max_value=2**31 - 1))
    form = draw(st.sampled_from(["none", "peek", "open", "close", "close/open", "abort"]))
    return GetOptions(
        timeout_ms=timeout_ms,
        open=form in ("open", "close/open"),
        close=form in ("close", "close/open"),
        abort=form == "abort",
        peek=form == "peek",
    )


@given(queue=_QUEUE_NAMES, options=_options())
def test_format_then_parse_round_trips(queue: str, options: GetOptions) -> None:
    """Spec §3.1: any legal queue and option set survives the key syntax unchanged."""
    assert parse_get_key(format_get_key(queue, options)) == GetKey(queue=queue, options=options)


@given(text=st.text(alphabet=st.sampled_from("q/opencloseabrtpk=0123456789-x "), max_size=30))
def test_any_key_parses_or_is_refused(text: str) -> None:
    """Spec §3.2: every key either parses or raises GetOptionsError with a §1.3 error class."""
    outcome = _parse_or_error(text)
    if isinstance(outcome, ErrorClass):
        assert outcome in (CLIENT_ERROR_KEEP, CLIENT_ERROR_CLOSE, SILENT_CLOSE)
    else:
        assert outcome.queue != ""
        assert "/" not in outcome.queue


def _parse_or_error(text: str) -> GetKey | ErrorClass:
    try:
        return parse_get_key(text)
    except GetOptionsError as error:
        return error.error_class
