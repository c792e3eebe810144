"""Kestrel 2.x compatibility front for Kayos (memcache, text and thrift protocols)."""
