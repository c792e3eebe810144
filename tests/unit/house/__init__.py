"""Checks on the project itself: import floors and cycles, links in the docs, the deploy files."""
