"""The documentation site builds with `mkdocs build --strict` (mkdocs.yml): no broken link or
anchor, no page left out of the navigation, every docstring readable; and the generated pages hold
what the code has (every `kayos` command on the CLI page). Skipped, saying why, without the docs
extra (`pip install -e '.[docs]'`, which `make dev` installs), unless KAYOS_REQUIRE_DOCS=1 (CI,
.ci/run) makes that a failure."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from kayos.cli.main import cli, load_chaos
from tests.support.layout import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

# A strict build of the whole site takes 10-25 s on the shared two-core box.
BUILD_TIMEOUT_S = 300


def need_mkdocs() -> None:
    missing = [
        name
        for name in ("mkdocs", "material", "mkdocstrings_handlers.python", "mkdocs_click")
        if importlib.util.find_spec(name.split(".")[0]) is None
    ]
    if not missing:
        return
    reason = f"the docs extra is not installed (no {', '.join(missing)}): pip install -e '.[docs]'"
    if os.environ.get("KAYOS_REQUIRE_DOCS") == "1":
        pytest.fail(f"KAYOS_REQUIRE_DOCS=1 but {reason}")
    pytest.skip(reason)


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    need_mkdocs()
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
        cwd=config.parent,
        env=env,
    )
    print(done.stdout, done.stderr)
    return done


def command_paths(command: click.Command, prefix: str) -> list[str]:
    """The heading id mkdocs-click gives each command under ``command``: kayos-ctl-queue-alter."""
    paths = [prefix]
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None
            paths += command_paths(sub, f"{prefix}-{name}")
    return paths


def test_the_site_builds_strictly_with_every_generated_page(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = build(REPO_ROOT / "mkdocs.yml", site)
    assert done.returncode == 0, done.stderr[-4000:]
    for page in ("configuration", "metrics", "ports", "python-api", "cli"):
        assert (site / "reference" / page / "index.html").is_file(), page
    cli_page = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    commands = [p for p in command_paths(cli, "kayos") if not p.startswith("kayos-chaos")]
    commands += command_paths(load_chaos(), "kayos-chaos")
    missing = [path for path in commands if f'id="{path}"' not in cli_page]
    assert not missing, f"commands missing from the CLI page: {missing}"
    api = (site / "reference" / "python-api" / "index.html").read_text(encoding="utf-8")
    for name in ("kayos.client.sync.Client", "kayos.client.aio.AsyncClient", "kayos.errors"):
        assert f'id="{name}"' in api, name
    assert 'href="#kayos.errors.LimitExceeded"' in api  # the exception tree links each class


def test_a_link_to_a_heading_that_is_not_there_fails_the_build(tmp_path: Path) -> None:
    shutil.copytree(REPO_ROOT / "docs", tmp_path / "docs")
    shutil.copy(REPO_ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    index = tmp_path / "docs" / "index.md"
    index.write_text(
        index.read_text(encoding="utf-8") + "\n[gone](manager.md#no-such-heading)\n",
        encoding="utf-8",
    )
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-heading" in done.stdout + done.stderr
