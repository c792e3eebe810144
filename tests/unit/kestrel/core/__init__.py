"""Kestrel queues and their backends: the engine, read-behind, retried group commits, the Kayos
backend below a retention floor."""
