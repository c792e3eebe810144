"""A head below its durable mark: whom it asks, how it re-fetches or resets, what it serves
meanwhile."""
