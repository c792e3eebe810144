"""The client's HTTP face: one aiohttp session (connections reused across nodes and requests),
msgpack bodies both ways, and every failure turned into a Kayos error at this one boundary."""

from __future__ import annotations

import asyncio
import json
import weakref
from typing import Any

import aiohttp
import msgpack
from yarl import URL

from kayos import limits, tlsconfig
from kayos.client.auth import ClientCredential, CredentialSource
from kayos.client.policy import error_from_http
from kayos.errors import OperationTimeoutError, ProtocolError, UnavailableError

MSGPACK = "application/msgpack"


def decode_body(content_type: str, raw: bytes) -> Any:
    """A reply body by its content type: msgpack, JSON, or else the text itself."""
    if not raw:
        return None
    try:
        if content_type == MSGPACK:
            return msgpack.unpackb(raw, raw=False, strict_map_key=False)
        if content_type == "application/json":
            return json.loads(raw)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"undecodable {content_type} reply: {exc}") from exc
    return raw.decode(errors="replace")


class TlsConnector(aiohttp.TCPConnector):
    """A connector that remembers its connections: a request cancelled mid-flight (a topology
    long-poll when the client closes) leaves a TLS connection in its closing handshake, which
    ``abort_all`` ends at once so nothing is left open once the client has closed."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.made: weakref.WeakSet[Any] = weakref.WeakSet()

    async def _create_connection(self, *args: Any, **kwargs: Any) -> Any:
        protocol = await super()._create_connection(*args, **kwargs)
        if protocol.transport is not None:
            # The transport itself: a protocol forgets its transport when it closes it.
            self.made.add(protocol.transport)
        return protocol

    def abort_all(self) -> None:
        for transport in list(self.made):
            transport.abort()


class HttpTransport:
    """Requests to nodes' HTTP API. ``open`` must run inside the event loop that uses it.
    ``credential``: what each request proves (a file's path, or None: ``KAYOS_CREDENTIALS``'s
    file if set, else no proof)."""

    def __init__(
        self,
        *,
        connections_max: int = limits.client_http_connections_max,
        credential: ClientCredential | str | None = None,
    ) -> None:
        self._connections_max = connections_max
        self._session: aiohttp.ClientSession | None = None
        self._connector: TlsConnector | None = None
        self.credentials = CredentialSource(credential)

    @property
    def credential(self) -> ClientCredential | None:
        """The credential now (its file is read again when it changes)."""
        return self.credentials.current()

    async def open(self) -> None:
        if self._session is None:
            self._connector = TlsConnector(limit=self._connections_max, ssl=tlsconfig.http_ssl())
            self._session = aiohttp.ClientSession(connector=self._connector)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._connector is not None:
            self._connector.abort_all()
            self._connector = None

    async def request(
        self,
        method: str,
        url: str,
        *,
        timeout_s: float,
        params: dict[str, str] | None = None,
        body: Any = None,
    ) -> Any:
        """The decoded reply of a 2xx; an error reply raises its Kayos error, a failure to reach
        the node ``UnavailableError``, no reply within ``timeout_s`` ``OperationTimeoutError``."""
        if self._session is None:
            raise UnavailableError("the client is not connected (call connect() first)")
        headers = {"Accept": MSGPACK}
        target = URL(url)
        if params:
            target = target.update_query(params)
        credential = self.credential
        if credential is not None:  # the proof covers the path and query as sent
            headers["Authorization"] = credential.http_authorization(method, target.raw_path_qs)
        data = None
        if body is not None:
            headers["Content-Type"] = MSGPACK
            data = msgpack.packb(body, use_bin_type=True)
        try:
            async with (
                asyncio.timeout(timeout_s),
                self._session.request(method, target, data=data, headers=headers) as response,
            ):
                raw = await response.read()
                status = response.status
                content_type = response.content_type
        except TimeoutError as exc:
            raise OperationTimeoutError(f"{method} {url}: no reply in {timeout_s}s") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise UnavailableError(
                f"{method} {url}: {type(exc).__name__}: {exc}", failure="lost"
            ) from exc
        decoded = decode_body(content_type, raw)
        if status >= 400:
            raise error_from_http(status, decoded)
        return decoded
