"""Chaos testing for Kayos: a history of what clients did and saw (``chaos.history``), a checker
of the properties Kayos promises over such a history (``chaos.checker``), and campaigns of faults
against real ``kayos node`` processes (``chaos.procs``). See docs/testing.md.

A face (the top floor, with the CLI): it reaches a cluster only through ``kayos.local`` (the local
cluster) and the public client, never through node or storage internals.
"""
