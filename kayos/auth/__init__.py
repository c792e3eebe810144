"""Client identities and roles (docs/security.md): the credentials table (``table``), secrets
and proofs (``keys``, ``proof``), and the one table of what each route and request kind needs
(``rules``). Pure: no I/O, no clock."""
