"""The client (drivers, policy, value types, consume pages, queues over shards), embedded mode,
and the Spark source's pure parts."""
