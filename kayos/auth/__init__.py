"""Client identities and roles (docs/security.md): the credentials table (``table``), secrets
and proofs (``keys``, ``proof``), and the one table of what each route and request kind needs
(``rules``). Pure: no I/O, no clock; but for ``refusals``, the count and log of refused
requests that a node's door and a manager member's share (the clock and logger passed in)."""
