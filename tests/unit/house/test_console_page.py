"""The reader of a page's console blocks (tests/support/docs/console_page.py), which the getting
started page's test runs: markers, steps, and how shown output matches printed output."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.docs.console_page import (
    PageError,
    Step,
    console_blocks,
    first_missing,
    line_pattern,
    match_in_order,
)

pytestmark = pytest.mark.unit


def page(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "page.md"
    path.write_text(text, encoding="utf-8")
    return path


def test_marked_blocks_are_read_with_their_mode_and_steps(tmp_path: Path) -> None:
    text = (
        "# Page\n"
        "<!-- run: background -->\n```console\n$ make run\nstarted\n```\n"
        "```sh\nnot a console block\n```\n"
        "<!-- run -->\n```console\n$ kayos produce q k v\nq: seq 1\n$ kayos ctl status\n```\n"
        "<!-- run: ctrl-c -->\n```console\n^C\nstopped\n```\n"
        "<!-- run: skip, depends on timing -->\n```console\n$ anything\n```\n"
    )
    blocks = console_blocks(page(tmp_path, text))
    assert [(b.line, b.mode) for b in blocks] == [
        (3, "background"),
        (11, "run"),
        (17, "ctrl-c"),
        (22, "skip"),
    ]
    assert blocks[1].steps == (
        Step("kayos produce q k v", ("q: seq 1",)),
        Step("kayos ctl status", ()),
    )
    assert blocks[2].steps == (Step("^C", ("stopped",)),)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("```console\n$ ls\n```\n", "without a <!-- run"),
        ("<!-- run: sometimes -->\n```console\n$ ls\n```\n", "unknown mode 'sometimes'"),
        ("<!-- run: skip -->\n```console\n$ ls\n```\n", "says why"),
        ("<!-- run -->\n```console\n$ ls\n", "never closed"),
    ],
)
def test_an_unmarked_or_badly_marked_block_is_refused(
    tmp_path: Path, text: str, problem: str
) -> None:
    with pytest.raises(PageError, match=problem):
        console_blocks(page(tmp_path, text))


def test_what_differs_between_runs_matches_anything_of_its_kind() -> None:
    shown = "  node b: http://127.0.0.1:7102  pid 41018 (incarnation 5d1c0e4b7a9f2316) ..."
    pattern = line_pattern(shown)
    assert pattern is not None
    assert pattern.fullmatch(
        "node b: http://127.0.0.1:23315 pid 7 (incarnation a85d0969e18a6db6) and more"
    )
    assert not pattern.fullmatch("node c: http://127.0.0.1:23315 pid 7 (incarnation ab) x")
    timing = line_pattern("cluster: HEALTHY (epoch 1), heard 0.1s ago")
    assert timing is not None
    assert timing.fullmatch("cluster: HEALTHY (epoch 12), heard 10.25s ago")
    assert line_pattern("...") is None


def test_seqs_counts_and_words_must_be_as_shown() -> None:
    seq = line_pattern("demo: seq 2")
    assert seq is not None
    assert seq.fullmatch("demo: seq 2")
    assert not seq.fullmatch("demo: seq 3")
    words = line_pattern("cluster: HEALTHY, fully replicated")
    assert words is not None
    assert not words.fullmatch("cluster: DEGRADED, fully replicated")


def test_shown_lines_must_appear_in_their_order() -> None:
    printed = ["a 1", "noise", "b 2", "c 3"]
    assert match_in_order(("a 1", "...", "c 3"), printed) == 4
    assert match_in_order(("b 2",), printed, start=3) is None
    assert match_in_order(("c 3", "a 1"), printed) is None
    assert first_missing(("c 3", "a 1"), printed) == "a 1"
    assert first_missing(("a 1",), printed) is None
