"""The command line: `kayos check`, `kayos ctl` views, `kayos node` flags, `kayos up`'s
supervisor, the bench load figures."""
