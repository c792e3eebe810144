"""Kestrel's queue semantics, pure: queues, the queue collection, configuration, server status.

No sockets, no asyncio, no protocol: time comes from an injected ``Clock`` and every change the
backend must learn about is recorded as an operation for a driver to carry out
(``kestrel_compat.backends.persister``). Imports only the kayos ground floor,
``kestrel_compat.limits`` and its own modules; the codecs, sessions and backends build on it,
never the other way.
"""
