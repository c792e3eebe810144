"""Where the Kestrel front keeps its items: the backends and the driver that feeds them.

``memory`` keeps them in this process, ``kayos_backend`` on a Kayos cluster (through
``kayos.AsyncClient``), and ``persister`` carries the queue collection's recorded operations out
against either. The two backends implement ``kestrel_compat.core.persistence.Backend``. Imports
the core, never the codecs or sessions.
"""
