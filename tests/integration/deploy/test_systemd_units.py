"""`systemd-analyze verify` passes every unit in deploy/systemd with no warning at all (it exits 0
on an unknown key or a bad value, and only says so): in a scratch root that holds the units in
/etc/systemd/system, the machine's own systemd units (the targets they name) and a stand-in for
/opt/kayos/venv/bin/kayos, so the check needs no install. Skipped, saying why, without
systemd-analyze (Debian's systemd; deploy/ensure-deploy-tools.sh installs it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.deploy.units import ALL_UNITS, INSTALLED_KAYOS, need_tool

pytestmark = pytest.mark.integration

# Where systemd keeps its own units (sysinit.target, network-online.target, ...) on Debian.
SYSTEM_UNITS = Path("/usr/lib/systemd/system")
# systemd-analyze answers in well under a second; far above that is a hang.
VERIFY_TIMEOUT_S = 60


def scratch_root(tmp_path: Path, units: list[Path]) -> Path:
    root = tmp_path / "root"
    (root / "etc/systemd/system").mkdir(parents=True)
    for unit in units:
        shutil.copy(unit, root / "etc/systemd/system" / unit.name)
    shutil.copytree(SYSTEM_UNITS, root / SYSTEM_UNITS.relative_to("/"), symlinks=True)
    kayos = root / INSTALLED_KAYOS.lstrip("/")
    kayos.parent.mkdir(parents=True)
    kayos.write_text("#!/bin/sh\n")
    kayos.chmod(0o755)
    return root


def verify(root: Path, names: list[str]) -> subprocess.CompletedProcess[str]:
    analyze = need_tool("systemd-analyze", "systemd")
    if not SYSTEM_UNITS.is_dir():
        pytest.skip(f"no {SYSTEM_UNITS} to take systemd's own units from")
    return subprocess.run(
        [analyze, "verify", f"--root={root}", "--man=no", *names],
        capture_output=True,
        text=True,
        timeout=VERIFY_TIMEOUT_S,
        check=False,
        cwd=root,
    )


def instance_of(unit: Path) -> str:
    """The name systemd loads: a template with an instance (kayos-node@a.service)."""
    return unit.name.replace("@.", "@a.")


def test_every_unit_passes_systemd_analyze_verify_without_a_warning(tmp_path: Path) -> None:
    root = scratch_root(tmp_path, list(ALL_UNITS))
    done = verify(root, [instance_of(unit) for unit in ALL_UNITS])
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == ""


def test_verify_as_run_here_reports_a_mistyped_key(tmp_path: Path) -> None:
    """The check above can fail: the same run on a unit with a typo says so on stderr."""
    broken = tmp_path / "kayos-node@.service"
    broken.write_text(ALL_UNITS[0].read_text().replace("RestartSec=", "RestartSecs="))
    root = scratch_root(tmp_path, [broken])
    done = verify(root, [instance_of(broken)])
    assert "RestartSecs" in done.stderr
