"""The shard store: its API, format (golden bytes), crash safety, read-back and a model check."""
