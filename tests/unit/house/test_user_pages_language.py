"""The pages a user reads say what Kayos does, not how it was built: no work-log language
(sessions, issue numbers, helpers, reviews, TODOs, branches, "we tried", the people who built
it). One test per page; a failure names each offending file:line and the phrase.

The pages: README.md, every docs/guide/*.md, and the operator's pages docs/deploy.md,
docs/operations.md, docs/performance.md and docs/campaigns.md (the last two are dated logs of
measurements: their dates and figures stay, the story of the work does not)."""

from __future__ import annotations

import re

import pytest

from tests.support.layout import REPO_ROOT

pytestmark = pytest.mark.unit

OPERATOR_PAGES = (
    "README.md",
    "docs/deploy.md",
    "docs/operations.md",
    "docs/performance.md",
    "docs/campaigns.md",
)

# Each phrase, as a pattern; case-insensitive unless it starts with (?-i). "session" is matched in
# lower case only, so AWS's "Session Manager" and Spark's SparkSession pass; "lead" only as a
# person ("the lead"), never the verb ("the node it does not lead").
WORK_LOG = (
    r"(?-i:\bsessions?\b)",
    r"\bissues? #?\d+",
    r"\bhelpers?\b",
    r"\breview(s|ed|er|ers|ing)?\b",
    r"\b(TODO|FIXME|XXX)\b",
    r"\bwe tried\b",
    r"\blast stop\b",
    r"\bthe lead\b",
    r"\blead's\b",
    r"\bengineers?\b",
    r"\bbranch(es)?\b",
    r"\bnext steps?\b",
)
PATTERN = re.compile("|".join(f"(?:{p})" for p in WORK_LOG), re.IGNORECASE)


def user_pages() -> list[str]:
    guide = sorted(p.relative_to(REPO_ROOT).as_posix() for p in REPO_ROOT.glob("docs/guide/*.md"))
    return [*OPERATOR_PAGES, *guide]


def work_log_lines(text: str, name: str) -> list[str]:
    """``name:line: "phrase" in: <line>`` for every work-log phrase of ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for match in PATTERN.finditer(line):
            found.append(f'{name}:{number}: "{match.group(0)}" in: {line.strip()[:120]}')
    return found


@pytest.mark.parametrize("name", user_pages())
def test_user_page_has_no_work_log_language(name: str) -> None:
    page = REPO_ROOT / name
    assert page.is_file(), f"{name} is missing"
    problems = work_log_lines(page.read_text(encoding="utf-8"), name)
    assert not problems, "work-log language on a user page:\n" + "\n".join(problems)


def test_the_guide_is_among_the_pages_checked() -> None:
    assert "docs/guide/getting-started.md" in user_pages()


@pytest.mark.parametrize(
    "line",
    [
        "This session added retries.",
        "As issue 26 asks, the page is new.",
        "Measured on this branch against main.",
        "TODO: explain",
        "We tried a bigger window first.",
        "The lead merges it.",
        "Five other engineers' tests ran meanwhile.",
    ],
)
def test_a_work_log_phrase_is_found_and_named(line: str) -> None:
    assert work_log_lines(f"# Page\n{line}\n", "page.md")[0].startswith("page.md:2: ")


@pytest.mark.parametrize(
    "line",
    [
        "Connect with AWS Session Manager.",
        "spark = SparkSession.builder.getOrCreate()",
        "The manager splices it out of every chain it does not lead.",
        "The leader polls every node.",
    ],
)
def test_ordinary_words_are_left_alone(line: str) -> None:
    assert work_log_lines(line, "page.md") == []
