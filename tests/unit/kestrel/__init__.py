"""The Kestrel front (kestrel_compat) in-process, by room: wire codecs, sessions, the queues and
their backends, the migration from Kestrel journals."""
