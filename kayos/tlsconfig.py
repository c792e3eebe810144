"""TLS for every listener and link: the ``[tls]`` table of a topology file, the server and client
``ssl.SSLContext`` built from it, their reload on SIGHUP, and the check that a member bound beyond
loopback runs with TLS (docs/security.md, "TLS").

A reload loads the new files into the same context objects: a listener keeps its context, and
connections made after the reload get the new certificate while open ones keep theirs.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import ssl
import time
from dataclasses import dataclass
from typing import Any

from kayos import limits
from kayos.errors import InvalidRequest

log = logging.getLogger("kayos.tls")

TLS_KEYS = frozenset({"ca", "cert", "key", "client_auth"})


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Where one member's certificate, key and trusted CA are; ``client_auth``: peers must show a
    certificate signed by ``ca`` (mutual TLS)."""

    ca: str
    cert: str
    key: str
    client_auth: bool = False

    @classmethod
    def from_table(cls, table: Any, member: str, base_dir: str) -> TlsFiles:
        """The ``[tls]`` table of a topology file for member ``member``: ``{node}`` in a path is
        its id, a relative path is read from ``base_dir``. ``InvalidRequest`` for a bad table."""
        if not isinstance(table, dict):
            raise InvalidRequest("bad [tls]: not a table")
        unknown = set(table) - TLS_KEYS
        if unknown:
            raise InvalidRequest(f"bad [tls]: unknown keys {sorted(unknown)}")
        paths = []
        for name in ("ca", "cert", "key"):
            value = table.get(name)
            if not isinstance(value, str) or not value:
                raise InvalidRequest(f"bad [tls]: {name} must name a file")
            paths.append(os.path.join(base_dir, value.replace("{node}", member)))
        client_auth = table.get("client_auth", False)
        if not isinstance(client_auth, bool):
            raise InvalidRequest("bad [tls]: client_auth is true or false")
        return cls(paths[0], paths[1], paths[2], client_auth)


def files_of(config_path: str, member: str) -> TlsFiles | None:
    """The TLS files of ``member`` from the topology file at ``config_path``; None without a
    ``[tls]`` table."""
    import tomllib

    if config_path.endswith(".json"):
        return None
    try:
        with open(config_path, "rb") as handle:
            data = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InvalidRequest(f"cannot read {config_path}: {exc}") from exc
    if "tls" not in data:
        return None
    return TlsFiles.from_table(data["tls"], member, os.path.dirname(os.path.abspath(config_path)))


def _load(context: ssl.SSLContext, files: TlsFiles) -> None:
    try:
        context.load_cert_chain(files.cert, files.key)
        context.load_verify_locations(cafile=files.ca)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidRequest(f"cannot load TLS files ({files.cert}, {files.key}): {exc}") from exc


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """A listener's context: TLS 1.2 or later, our certificate, and under ``client_auth`` a
    client certificate signed by ``files.ca`` required."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_REQUIRED if files.client_auth else ssl.CERT_OPTIONAL
    _load(context, files)
    return context


def listener_context(cert: str, key: str) -> ssl.SSLContext:
    """A listener's context without client certificates (the Kestrel front's ports)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidRequest(f"cannot load TLS files ({cert}, {key}): {exc}") from exc
    return context


def client_context(ca: str, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    """A connecting side's context: the server's certificate checked against ``ca`` and its host
    name or address; ``cert``/``key`` shown when given (mutual TLS)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_verify_locations(cafile=ca)
        if cert is not None:
            context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidRequest(f"cannot load TLS files ({ca}, {cert}): {exc}") from exc
    return context


@dataclass(slots=True)
class MemberTls:
    """One member's two contexts (listening, and connecting to peers) and the files they came
    from; ``reload`` reads the files again into the same contexts."""

    files: TlsFiles
    server: ssl.SSLContext
    client: ssl.SSLContext

    @classmethod
    def load(cls, files: TlsFiles) -> MemberTls:
        client = client_context(files.ca, files.cert, files.key)
        return cls(files, server_context(files), client)

    def reload(self) -> bool:
        """Loads the files again (SIGHUP); on failure the previous ones stay and it is logged.
        True when the new files are in force."""
        try:
            # Built fresh first: a bad file leaves the contexts in use untouched.
            MemberTls.load(self.files)
            _load(self.server, self.files)
            self.client.load_cert_chain(self.files.cert, self.files.key)
            self.client.load_verify_locations(cafile=self.files.ca)
        except (InvalidRequest, OSError, ssl.SSLError) as exc:
            log.error("TLS reload failed, the previous certificate stays in force: %s", exc)
            return False
        log.info("TLS files reloaded from %s", self.files.cert)
        return True


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def check_exposure(
    what: str, hosts: list[str], tls: bool, insecure: bool, *, lacks_credentials: bool = False
) -> bool:
    """The safe-default check every member runs before it serves: bound beyond loopback it needs
    TLS, and a node client credentials too (``lacks_credentials``: its table is open, from
    kayos.auth.rules.open_bind_problem), unless ``insecure``. ``InvalidRequest`` names every
    missing half and its fix in one message. Returns whether it runs open beyond loopback on
    purpose (logged; reported in status and as ``kayos_insecure``)."""
    exposed = [host for host in hosts if not is_loopback(host)]
    missing = ([] if tls else ["TLS"]) + (["client credentials"] if lacks_credentials else [])
    if not exposed or not missing:
        return False
    if not insecure:
        fixes = [] if tls else ['add a [tls] table to the topology file (docs/security.md, "TLS")']
        if lacks_credentials:
            fixes.append("add a credential (kayos ctl credentials add, docs/security.md)")
        raise InvalidRequest(
            f"{what}: refusing to serve on {exposed[0]} without {' or '.join(missing)}: "
            f"{' and '.join(fixes)}, or pass --insecure to run open on purpose"
        )
    log.warning("%s serves on %s without %s (--insecure)", what, exposed[0], " or ".join(missing))
    return True


class HandshakeLog:
    """Logs refused TLS handshakes at most once per ``limits.tls_refusal_log_ms`` per reason."""

    def __init__(self) -> None:
        self.last: dict[str, float] = {}
        self.refused = 0

    def refused_from(self, peer: str, exc: BaseException) -> None:
        self.refused += 1
        reason = getattr(exc, "reason", None) or type(exc).__name__
        now = time.monotonic()
        if now - self.last.get(reason, -1e9) >= limits.tls_refusal_log_ms / 1000:
            self.last[reason] = now
            log.warning("TLS handshake refused from %s: %s (%s)", peer, reason, exc)


# --- this process's TLS ------------------------------------------------------------------------
# One process is one member (or one client program): its links and its HTTP calls to peers use
# one client context, installed once at start. Kept here so every room that opens a connection
# (links, the node's and the manager's HTTP calls, the client) reads the same one.
_installed: list[ssl.SSLContext] = []
_member: list[MemberTls] = []


def install(context: ssl.SSLContext | None) -> None:
    """Makes ``context`` this process's context for connecting to members (None: plain)."""
    _installed.clear()
    if context is not None:
        _installed.append(context)


def install_member(tls: MemberTls | None) -> None:
    """This process is a member with ``tls``: it listens with its server context and connects
    with its client context (None: plain)."""
    _member.clear()
    if tls is not None:
        _member.append(tls)
    install(tls.client if tls is not None else None)


def member() -> MemberTls | None:
    return _member[0] if _member else None


def installed() -> ssl.SSLContext | None:
    return _installed[0] if _installed else None


def scheme() -> str:
    """``https`` when this process speaks TLS to members, else ``http``."""
    return "https" if _installed else "http"


def connect_options(host: str) -> dict[str, Any]:
    """Keyword arguments for ``asyncio.open_connection`` to a member at ``host``: TLS with its
    name checked when a context is installed, nothing otherwise."""
    context = installed()
    if context is None:
        return {}
    return {"ssl": context, "server_hostname": host, "ssl_handshake_timeout": _handshake_s()}


def _handshake_s() -> float:
    return limits.tls_handshake_ms_max / 1000


def http_ssl() -> ssl.SSLContext | bool:
    """aiohttp's ``ssl`` argument: the installed context, else its default checks."""
    return installed() or True
