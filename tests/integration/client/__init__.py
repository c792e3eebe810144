"""The client and consumers against real nodes: both clients, queues over shards, group lag;
and what `import kayos` costs a fresh interpreter."""
