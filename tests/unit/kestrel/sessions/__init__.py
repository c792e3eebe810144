"""Kestrel sessions through the real codecs: queue semantics, the text protocol, connections."""
