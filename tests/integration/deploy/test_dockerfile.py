"""The Dockerfile's steps, run without docker (no engine on this project's machines): its install
step (`RUN pip install ...`) in a fresh virtualenv, in a directory holding exactly what its COPY
lines copy, and then its ENTRYPOINT with its CMD, and with each command the compose file runs,
from that virtualenv; its other RUN lines (the user and /data) as root in a throwaway overlay of
this machine's own root (Debian, as the image's base is), with `unshare` and `chroot`, leaving
the machine's own files as they were. Every RUN line is one or the other. The install reaches the
package index (skipped, saying why, when it cannot); the overlay needs root."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.deploy.units import DEPLOY
from tests.support.layout import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
COMPOSE_FILE = DEPLOY / "docker" / "compose.yaml"
# pip fetching and building Kayos's dependencies: about 25 s on the 2-core box.
INSTALL_TIMEOUT_S = 480
# A command's --help, or the overlay's few commands.
COMMAND_TIMEOUT_S = 60
# What pip prints when the index cannot be reached at all (not when a requirement is wrong).
NO_NETWORK = re.compile(
    r"NewConnectionError|Temporary failure in name resolution|Network is unreachable|"
    r"No matching distribution found for setuptools"
)


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    found: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        line = pending + line
        if line.endswith("\\"):
            pending = line[:-1].rstrip() + " "
            continue
        pending = ""
        word, _, rest = line.partition(" ")
        found.append((word.upper(), rest.strip()))
    return found


def the(instruction: str) -> list[str]:
    return [rest for word, rest in instructions() if word == instruction]


def runs() -> tuple[list[str], list[str]]:
    """The RUN lines: the install steps (pip) and the rest (as root, in the image's root)."""
    lines = the("RUN")
    installs = [line for line in lines if line.startswith("pip ")]
    return installs, [line for line in lines if line not in installs]


def build_context(tmp_path: Path) -> Path:
    """The WORKDIR with what the COPY lines copy from the repository root (the build context)."""
    (workdir,) = the("WORKDIR")
    target = tmp_path / "image" / workdir.lstrip("/")
    target.mkdir(parents=True)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for line in the("COPY"):
        *sources, dest = shlex.split(line)
        for source in sources:
            origin = REPO_ROOT / source
            where = target / dest / (origin.name if dest.endswith("/") else "")
            if origin.is_dir():
                shutil.copytree(origin, where, ignore=skip)
            else:
                shutil.copy(origin, where)
    return target


def clean_env(venv: Path) -> dict[str, str]:
    """No PYTHONPATH (so the installed copy is what runs) and the venv first on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    return env


def test_every_run_line_is_one_the_tests_below_run() -> None:
    installs, rest = runs()
    assert installs
    assert rest
    assert all(line.split()[0] in ("groupadd", "useradd", "mkdir", "chown") for line in rest)


def test_the_install_step_in_a_fresh_venv_gives_the_entry_point_and_every_compose_command(
    tmp_path: Path,
) -> None:
    workdir = build_context(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=COMMAND_TIMEOUT_S)
    env = clean_env(venv)
    installs, _ = runs()
    for line in installs:
        done = subprocess.run(
            ["sh", "-c", line], cwd=workdir, env=env, capture_output=True, text=True,
            timeout=INSTALL_TIMEOUT_S, check=False,
        )  # fmt: skip
        if done.returncode != 0 and NO_NETWORK.search(done.stdout + done.stderr):
            pytest.skip(f"the package index is out of reach here: {done.stderr.strip()[-300:]}")
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    where = subprocess.run(
        [str(venv / "bin/python"), "-c", "import kayos; print(kayos.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
        check=True,
    )  # fmt: skip
    assert where.stdout.startswith(str(venv)), where.stdout
    (entrypoint,) = [json.loads(line) for line in the("ENTRYPOINT")]
    (cmd,) = [json.loads(line) for line in the("CMD")]
    lines = re.findall(r"command: \[(.*)\]", COMPOSE_FILE.read_text())
    commands = {line.split('"')[1] for line in lines}
    assert commands == {"node", "manager", "kestrel"}
    for argv in [entrypoint + cmd, *([*entrypoint, c, "--help"] for c in sorted(commands))]:
        done = subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=COMMAND_TIMEOUT_S, check=False,
        )  # fmt: skip
        assert done.returncode == 0, (argv, done.stderr[-2000:])
        assert "Usage:" in done.stdout, argv


# In a private mount namespace: a tmpfs, an overlay of / over it, the RUN lines in a chroot of
# the overlay; then what they made, read from inside (the tmpfs goes with the namespace).
OVERLAY_SCRIPT = """
set -eu
scratch="$1"; workdir="$2"; line="$3"
mount -t tmpfs tmpfs "$scratch"
mkdir "$scratch/upper" "$scratch/work" "$scratch/root"
layers="lowerdir=/,upperdir=$scratch/upper,workdir=$scratch/work"
mount -t overlay overlay -o "$layers" "$scratch/root"
mkdir -p "$scratch/root$workdir"
chroot "$scratch/root" /bin/sh -c "cd $workdir && $line"
echo "passwd: $(grep '^kayos:' "$scratch/root/etc/passwd")"
echo "group: $(grep '^kayos:' "$scratch/root/etc/group")"
echo "data: $(stat -c '%u:%g %F %a' "$scratch/root/data")"
"""


def overlay_unavailable() -> str | None:
    if sys.platform != "linux" or os.geteuid() != 0:
        return "the image's root steps run in an overlay of / and a chroot: root only"
    for tool in ("unshare", "chroot", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    for name, path in (("user", "/etc/passwd"), ("group", "/etc/group")):
        text = Path(path).read_text()
        if re.search(r"^kayos:|^[^:]*:[^:]*:10001:", text, re.MULTILINE):
            return f"this machine already has a kayos {name} or id 10001, which the step adds"
    return None


def test_the_user_and_data_steps_run_as_root_in_a_throwaway_root(tmp_path: Path) -> None:
    reason = overlay_unavailable()
    if reason is not None:
        pytest.skip(reason)
    before = {path: Path(path).read_text() for path in ("/etc/passwd", "/etc/group")}
    (workdir,) = the("WORKDIR")
    _, rest = runs()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private",
         "sh", "-c", OVERLAY_SCRIPT, "overlay", str(scratch), workdir, " && ".join(rest)],
        capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False,
    )  # fmt: skip
    if "overlay" in done.stderr and "mount" in done.stderr and done.returncode != 0:
        pytest.skip(f"no overlay mount of / here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    seen = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    (user,) = the("USER")
    name, _, uid, gid, _, home, shell = seen["passwd"].split(":")
    assert (name, uid, gid, home, shell) == (user, "10001", "10001", "/data", "/usr/sbin/nologin")
    assert seen["group"].split(":")[:3] == [user, "x", "10001"]
    assert seen["data"] == "10001:10001 directory 755"
    assert {path: Path(path).read_text() for path in before} == before
    assert not Path("/data").exists() or Path("/data").stat().st_uid != 10001
