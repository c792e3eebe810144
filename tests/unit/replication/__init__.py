"""Chain replication, by room: the wire, the pure decisions, links, chains of in-process nodes,
repair, and what a replica serves to consumers."""
