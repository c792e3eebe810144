"""The bytes of Kestrel's three protocols, sans-IO: memcache, text and thrift codecs.

Each codec turns bytes into command events and builds exact reply bytes; the commands several
protocols share are declared once (``commands``), memcache's table and its own commands in
``memcache_commands``. No sockets, no asyncio, no queue state. Imports ``kestrel_compat.core``
(the server statuses), ``kestrel_compat.limits`` and the kayos ground floor only.
"""
