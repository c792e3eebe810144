"""systemd units and the tools that check the deploy files: a unit's settings, its ``ExecStart``
rendered for an instance as systemd would run it (specifiers, an environment file's variables),
then moved into a scratch root (a host's ``/etc/kayos`` and ``/var/lib/kayos`` under a directory,
the virtualenv's ``kayos`` the one under test)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
from pathlib import Path

import pytest

from tests.support.layout import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy"
UNITS = DEPLOY / "systemd"
# The unit files (templates named with "@"), by the command each runs.
NODE_UNIT = UNITS / "kayos-node@.service"
MANAGER_UNIT = UNITS / "kayos-manager@.service"
KESTREL_UNIT = UNITS / "kayos-kestrel.service"
ALL_UNITS = (NODE_UNIT, MANAGER_UNIT, KESTREL_UNIT)
# Where the units expect the installed command (docs/deploy.md, "Installing").
INSTALLED_KAYOS = "/opt/kayos/venv/bin/kayos"
# The host paths the units name, moved under a host's scratch root when rendered.
HOST_PATHS = ("/etc/kayos/", "/var/lib/kayos/")


def settings(path: Path) -> dict[str, dict[str, list[str]]]:
    """Section -> key -> every value given (systemd lets a key repeat), comments dropped and
    backslash-continued lines joined."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip()
        pending = ""
        if not line or line.startswith(("#", ";")):
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, equals, value = line.partition("=")
        assert equals, f"{path.name}: not a setting: {raw!r}"
        assert current is not None, f"{path.name}: a setting before any section: {raw!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def setting(path: Path, section: str, key: str) -> str:
    values = settings(path).get(section, {}).get(key, [])
    assert len(values) == 1, f"{path.name}: [{section}] {key} given {len(values)} times"
    return values[0]


def read_environment_file(path: Path) -> dict[str, str]:
    """``KEY=value`` lines, as systemd's ``EnvironmentFile=`` reads them (no quotes used here)."""
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            found[key.strip()] = value.strip()
    return found


def exec_start(
    path: Path, instance: str = "", environment: dict[str, str] | None = None
) -> list[str]:
    """The unit's ``ExecStart`` as systemd runs it for ``instance``: ``%i`` and ``%%`` replaced,
    then split into words, ``${VAR}`` one word and ``$VAR`` split on whitespace. Any other
    specifier, prefix or ``$`` use is refused, so the rendering never guesses."""
    line = setting(path, "Service", "ExecStart")
    assert line[0] not in "-@:+!", f"{path.name}: ExecStart prefixes are not rendered here"
    specifiers = re.findall(r"%.", line)
    assert set(specifiers) <= {"%i", "%%"}, f"{path.name}: unrendered specifiers {specifiers}"
    assert "%i" not in line or instance, f"{path.name} is a template: give an instance"
    line = line.replace("%i", instance).replace("%%", "%")
    environment = environment or {}
    words: list[str] = []
    for word in shlex.split(line):
        braced, bare = re.fullmatch(r"\$\{(\w+)\}", word), re.fullmatch(r"\$(\w+)", word)
        if braced:
            words.append(environment[braced.group(1)])
        elif bare:
            words.extend(environment[bare.group(1)].split())
        else:
            assert "$" not in word, f"{path.name}: unrendered variable in {word!r}"
            words.append(word)
    return words


def in_root(argv: list[str], root: Path, kayos: str) -> list[str]:
    """``argv`` with the installed command replaced by ``kayos`` and the host paths moved under
    ``root``; an absolute path the units do not name is refused."""
    moved = []
    for word in argv:
        if word == INSTALLED_KAYOS:
            word = kayos
        elif word.startswith(HOST_PATHS):
            word = str(root) + word
        else:
            assert not word.startswith("/"), f"a host path the rendering does not know: {word}"
        moved.append(word)
    return moved


def need_tool(tool: str, package: str) -> str:
    """The tool's path; else the test skips saying what to install, or fails where
    KAYOS_REQUIRE_DEPLOY_TOOLS=1 (CI, which installs it: deploy/ensure-deploy-tools.sh)."""
    path = shutil.which(tool)
    if path is not None:
        return path
    reason = f"{tool} is not installed (apt-get install {package}; deploy/ensure-deploy-tools.sh)"
    if os.environ.get("KAYOS_REQUIRE_DEPLOY_TOOLS") == "1":
        pytest.fail(f"KAYOS_REQUIRE_DEPLOY_TOOLS=1 but {reason}")
    pytest.skip(reason)
