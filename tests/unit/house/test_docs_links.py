"""Every relative Markdown link in the project's pages resolves: the file it names exists, and a
``#fragment`` names a heading of the target page (or of the same page, for ``#x``), by GitHub's
anchor rules. Web and mail links are not followed.

Pages: README.md, CONTRIBUTING.md, deploy/README.md, every ``docs/*.md`` and every
``docs/guide/*.md`` (a new page is picked up by the globs). One test per page, so a failure names
the page and lists its broken links. A link to a page the documentation site generates at build
time (kayos/cli/reference/pages.py) resolves when the generator names it; the site's strict build
checks its anchors."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from kayos.cli.reference.pages import PAGES
from tests.support.layout import REPO_ROOT

pytestmark = pytest.mark.unit

ROOT = REPO_ROOT
FIXED_PAGES = ("README.md", "CONTRIBUTING.md", "deploy/README.md")

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
ATX_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")  # closing #s optional
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target); the target may be <bracketed> and carry a "title".
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]"  # the text, one level of nested brackets allowed
    r"\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)"  # (target "title")
)
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
HTML_TAG = re.compile(r"<[^>]+>")
EXTERNAL = ("http://", "https://", "mailto:")
# The pages the site's build generates, as paths on disk they would have.
GENERATED = {(ROOT / "docs" / path).resolve() for path in PAGES}


def pages() -> list[str]:
    """The pages checked, relative to the repository root."""
    found = sorted(
        path.relative_to(ROOT).as_posix()
        for pattern in ("*.md", "guide/*.md")
        for path in (ROOT / "docs").glob(pattern)
    )
    return [*FIXED_PAGES, *found]


def prose_lines(text: str) -> list[str]:
    """The page's lines outside fenced code blocks (a fenced line becomes empty)."""
    lines: list[str] = []
    fence: str | None = None
    for line in text.splitlines():
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)[0] * len(match.group(1))
            lines.append("")
        elif fence is not None:
            if line.strip().startswith(fence) and set(line.strip()) <= {fence[0]}:
                fence = None
            lines.append("")
        else:
            lines.append(line)
    return lines


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: its rendered text, lowercased, every character but
    letters, digits, spaces, '-' and '_' dropped, spaces made '-'."""
    text = INLINE_CODE.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text stays
    text = HTML_TAG.sub("", text)
    text = text.replace("*", "")  # emphasis markers ('_' stays, as in `head_lease_ms`)
    text = "".join(ch for ch in text.lower() if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every fragment that reaches a place in ``page``: its headings' anchors (a repeated one
    gets '-1', '-2', ... as GitHub numbers them) and explicit HTML anchors."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in prose_lines(page.read_text(encoding="utf-8")):
        found.update(HTML_ANCHOR.findall(line))
        match = ATX_HEADING.match(line)
        if match is None:
            continue
        anchor = github_anchor(match.group(2))
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link in ``page`` outside code blocks and code spans."""
    found: list[tuple[int, str]] = []
    for number, line in enumerate(prose_lines(page.read_text(encoding="utf-8")), start=1):
        without_code = INLINE_CODE.sub("", line)
        targets = [m.group(1) for m in INLINE_LINK.finditer(without_code)]
        definition = REFERENCE_DEFINITION.match(without_code)
        if definition:
            targets.append(definition.group(1))
        found.extend((number, target.strip("<>")) for target in targets)
    return found


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with each relative link of ``page``, one line each (named from ``root``)."""
    problems: list[str] = []
    for number, target in links(page):
        if target.lower().startswith(EXTERNAL):
            continue
        path_part, _, fragment = target.partition("#")
        linked = (page.parent / unquote(path_part)).resolve() if path_part else page
        where = f"{page.relative_to(root).as_posix()}:{number}: ({target})"
        if linked in GENERATED and root == ROOT:
            continue
        if not linked.exists():
            problems.append(f"{where} names a missing file")
        elif fragment and linked.suffix == ".md" and unquote(fragment) not in anchors(linked):
            problems.append(f"{where}: no heading of {linked.name} has the anchor #{fragment}")
    return problems


@pytest.mark.parametrize("name", pages())
def test_every_relative_link_resolves(name: str) -> None:
    page = ROOT / name
    assert page.is_file(), f"{name} is missing"
    problems = broken_links(page)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_anchors_follow_githubs_rules(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Kayos: the `ctl` tool (v2) ##\n"
        "## C# clients\n"
        "## Learners\n"
        "```\n# not a heading\n```\n"
        "## Learners\n"
        "### `head_lease_ms`, **bold** and [a link](x.md)\n"
        '<a id="by-hand"></a>\n',
        encoding="utf-8",
    )
    assert anchors(page) == {
        "kayos-the-ctl-tool-v2",
        "c-clients",
        "learners",
        "learners-1",
        "head_lease_ms-bold-and-a-link",
        "by-hand",
    }


def test_a_broken_link_and_a_missing_anchor_are_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Here\n"
        "[ok](other.md#other-page) [ok](#here) [web](https://example.com/x.md#y)\n"
        "`[in code](nowhere.md)`\n"
        "[gone](nowhere.md) [bad anchor](other.md#elsewhere) [self](#there)\n",
        encoding="utf-8",
    )
    problems = broken_links(page, tmp_path)
    assert [p.split(": (")[1].split(")")[0] for p in problems] == [
        "nowhere.md",
        "other.md#elsewhere",
        "#there",
    ]
