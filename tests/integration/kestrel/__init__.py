"""The Kestrel front as a real process: protocols, real memcache clients, failover, import."""
