"""One member of the cluster manager, the ``kayos manager`` process (docs/manager.md, "Running
it"): the pure core of ``kayos.manager`` (the package above) behind a Raft log (``raft.py``, the
only module that imports pysyncobj; ``codec.py`` its entries), the leader's driver that polls
nodes and carries actions to them (``driver.py``, with the write-hold estimate of ``holds.py``),
the members' HTTP face (``http.py``) and the topology file's manager tables (``config.py``).
``process.py`` wires them into one process.

Floor 3, beside the node and the client: it imports the core, the ground (with the data
directory's lock), the topology, identity and signing; nothing of the node, the client or storage.
"""
