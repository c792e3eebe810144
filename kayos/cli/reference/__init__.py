"""The reference pages of the documentation site that are generated from the code, so they
cannot drift from it: the MkDocs hook (docs/hooks/reference.py) adds each page of
``pages.PAGES`` to the site at build time, and fills the markers of ``pages.MARKERS`` in the
written pages; nothing generated is kept in the repository.

- ``reference/configuration.md``: the configuration files' keys and defaults, and every bound of
  kayos/limits.py and kestrel_compat/limits.py with its value, unit and reason
  (``config_page``, ``limits_page``);
- ``reference/metrics.md``: every metric a node's ``GET /metrics`` exposes, with its type, labels
  and help (``metrics_page``);
- ``reference/ports.md``: every listening port, who connects to it and its default
  (``ports_page``);
- the Python API page's exception tree (``errors_tree``).
"""
