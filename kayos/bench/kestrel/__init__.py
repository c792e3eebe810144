"""The Kestrel front's benchmarks: ``kayos bench kestrel`` (``front.py``: memcache clients
against the front and memcached), the journal import (``journal_import.py``) and the front's
memory under a queue far larger than it (``read_behind.py``), the last two run with
``python -m``."""
