"""``kayos ctl secret``: rotating the cluster secret without stopping anything (docs/security.md,
"Rotating the cluster secret").

The topology file is rewritten in the order of the document's table, and after each step every
node and manager member it names is told to read its secrets again (a message signed with a
secret it accepts at that point); the next step begins only once every one answered with the
secrets expected. ``secrets_in_toml`` and ``rotation_state`` are pure.
"""

from __future__ import annotations

import os
import re
import secrets
import tomllib
from collections.abc import Callable
from typing import Any

import click

from kayos import limits
from kayos.cli.address import use_tls
from kayos.cli.ctl.options import signing_topology_option
from kayos.errors import InvalidRequest, KayosError
from kayos.identity import ClusterIdentity, secret_print, write_private
from kayos.local.http import http_json
from kayos.signing import sign

_SECRET_KEY = re.compile(r"\s*(secret|next_secret|previous_secret)\s*=")


def secrets_in_toml(text: str, secret: bytes, other_key: str | None, other: bytes | None) -> str:
    """The TOML ``text`` with its ``secret`` (and ``next_secret``/``previous_secret``) lines
    replaced by ``secret`` and, when ``other_key`` is given, ``other_key = other``; every other
    line as it was. Checked by parsing again: ``InvalidRequest`` if the keys are not one line each
    before the first table."""
    lines = text.splitlines(keepends=True)
    tables = next((i for i, line in enumerate(lines) if line.lstrip().startswith("[")), len(lines))
    kept: list[str] = []
    at: int | None = None
    for line in lines[:tables]:
        if _SECRET_KEY.match(line):
            at = len(kept) if at is None else at
        else:
            kept.append(line)
    if at is None:
        raise InvalidRequest("the topology file has no secret to rotate (run kayos init)")
    new = [f'secret = "{secret.hex()}"\n']
    if other_key is not None and other is not None:
        new.append(f'{other_key} = "{other.hex()}"\n')
    kept[at:at] = new
    written = "".join(kept + lines[tables:])
    expected = {
        key: value
        for key, value in tomllib.loads(text).items()
        if key not in ("secret", "next_secret", "previous_secret")
    }
    expected["secret"] = secret.hex()
    if other_key is not None and other is not None:
        expected[other_key] = other.hex()
    if tomllib.loads(written) != expected:
        raise InvalidRequest("cannot rewrite the secrets of this file (one key per line, please)")
    return written


def rotation_state(data: dict[str, Any]) -> str:
    """``before`` (one secret), ``accepting`` (``next_secret``) or ``switched``
    (``previous_secret``): where a rotation stands in the file."""
    if "next_secret" in data:
        return "accepting"
    if "previous_secret" in data:
        return "switched"
    return "before"


def _targets(data: dict[str, Any], scheme: str) -> list[tuple[str, str]]:
    """(id, reload URL) of every node and manager member of the file."""
    out = [
        (str(name), f"{scheme}://{t['host']}:{int(t['http_port'])}/v1/admin/secrets")
        for name, t in data.get("nodes", {}).items()
    ]
    out += [
        (str(name), f"{scheme}://{t['host']}:{int(t['http_port'])}/v1/manager/secrets")
        for name, t in data.get("managers", {}).items()
    ]
    return out


def reload_everywhere(
    data: dict[str, Any],
    signer: ClusterIdentity,
    expect: Callable[[dict[str, Any]], bool],
    echo: Callable[[str], None],
) -> None:
    """Tells every node and member to read its secrets again, signed by ``signer``; raises
    ``click.ClickException`` naming those that failed or answered other secrets than ``expect``
    wants (the step is safe to run again)."""
    from kayos import tlsconfig

    failed: list[str] = []
    timeout_s = limits.ctl_status_timeout_ms_default / 1000
    for member, url in _targets(data, tlsconfig.scheme()):
        body = {"node": member}
        message = {"body": body, "mac": sign(signer, "secrets", body)}
        try:
            status, answer = http_json(url, method="POST", body=message, timeout_s=timeout_s)
        except OSError as exc:
            failed.append(f"{member}: {exc}")
            continue
        if status != 200 or not isinstance(answer, dict) or not expect(answer):
            failed.append(f"{member}: {status} {answer}")
            continue
        echo(f"  {member}: proving {answer['proving']}, accepting {answer['accepted']}")
    if failed:
        raise click.ClickException(
            "not every member took the new secrets (run the command again once they are up): "
            + "; ".join(failed)
        )


def _load(path: str) -> tuple[str, dict[str, Any], ClusterIdentity]:
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    data = tomllib.loads(text)
    identity = ClusterIdentity.from_data(data)
    if identity is None or identity.is_placeholder:
        raise InvalidRequest(f"{path} has no cluster secret (run kayos init)")
    return text, data, identity


def _key(data: dict[str, Any], name: str) -> bytes:
    return bytes.fromhex(str(data[name]))


def rotate_start(path: str, echo: Callable[[str], None]) -> None:
    """Steps 1 and 2 of the document's table (step 1 is skipped when the file is at it)."""
    text, data, identity = _load(path)
    state = rotation_state(data)
    if state == "switched":
        raise click.ClickException("a rotation is switched already: run rotate finish")
    old = identity.secret
    if state == "before":
        new = secrets.token_bytes(limits.cluster_secret_bytes)
        write_private(path, secrets_in_toml(text, old, "next_secret", new))
        text, data, _ = _load(path)
    new = _key(data, "next_secret")
    echo(f"step 1: every member accepts {secret_print(new)} beside {secret_print(old)}")
    signer = ClusterIdentity(identity.cluster_id, old)
    reload_everywhere(data, signer, lambda a: secret_print(new) in a.get("accepted", ()), echo)
    write_private(path, secrets_in_toml(text, new, "previous_secret", old))
    _, data, _ = _load(path)
    echo(f"step 2: every member proves {secret_print(new)}")
    reload_everywhere(data, signer, lambda a: a.get("proving") == secret_print(new), echo)
    echo("started: every member proves the new secret and accepts both; run rotate finish")


def rotate_finish(path: str, echo: Callable[[str], None]) -> None:
    """The document's last step: the old secret is dropped everywhere."""
    text, data, identity = _load(path)
    if rotation_state(data) != "switched":
        raise click.ClickException("no rotation is switched: run rotate start first")
    new = identity.secret
    write_private(path, secrets_in_toml(text, new, None, None))
    _, data, _ = _load(path)
    signer = ClusterIdentity(identity.cluster_id, new)
    reload_everywhere(data, signer, lambda a: a.get("accepted") == [secret_print(new)], echo)
    echo(f"finished: every member proves and accepts {secret_print(new)} only")


@click.group()
def secret() -> None:
    """The cluster secret (docs/security.md, "Rotating the cluster secret")."""


@secret.group()
def rotate() -> None:
    """Rotate the cluster secret without downtime: start, then finish."""


def _run(step: Callable[[str, Callable[[str], None]], None], topology_path: str) -> None:
    use_tls(os.environ, topology_path)
    try:
        step(topology_path, click.echo)
    except (KayosError, OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc


@rotate.command()
@signing_topology_option
def start(topology_path: str) -> None:
    """Write a new secret into the topology file, have every node and manager member accept it,
    then prove with it (links already open stay open)."""
    _run(rotate_start, topology_path)


@rotate.command()
@signing_topology_option
def finish(topology_path: str) -> None:
    """Drop the old secret from the topology file and every node and manager member."""
    _run(rotate_finish, topology_path)


def register(group: click.Group) -> None:
    group.add_command(secret)
