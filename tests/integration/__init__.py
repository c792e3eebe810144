"""The integration tier: real `kayos node` (and manager, Kestrel front) processes on loopback.
Fixtures in conftest.py; shared helpers in tests/support/."""
