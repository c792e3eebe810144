"""Moving from Kestrel: journals replayed, and the import's decisions without a cluster."""
