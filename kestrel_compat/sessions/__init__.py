"""One session per connection, per protocol, over the state every connection shares.

``service`` is the server-wide state (queues, persistence, status, configuration),
``session_base`` what every connection does whatever its protocol, and ``memcache_session``,
``text_session`` and ``thrift_session`` serve the events of their codec. Imports the core, the
codecs (``kestrel_compat.wire``) and the persister; no socket code (that is
``kestrel_compat.server``).
"""
