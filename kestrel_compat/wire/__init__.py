"""The bytes of Kestrel's three protocols, sans-IO: memcache, text and thrift codecs.

Each codec turns bytes into command events and builds exact reply bytes. The commands several
protocols share are declared once (``commands``) with Java's parsing rules (``java``); each codec
module declares the commands only its protocol has, and memcache's command table and error
classes are ``memcache_commands``. No sockets, no asyncio, no queue state: imports
``kestrel_compat.core`` (the server statuses), ``kestrel_compat.limits`` and the kayos ground
floor only.
"""
