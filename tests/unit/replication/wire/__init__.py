"""Replication frames and link authentication: golden bytes, stream splits, refusals."""
