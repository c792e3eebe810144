"""The manager process (docs/manager.md, "Running it"): the pure decision core of
``kayos.manager`` behind a Raft log (``raft.py``, the only module that imports pysyncobj), the
leader's driver that polls nodes and carries actions to them (``driver.py``), and the members'
HTTP face (``http.py``). ``member.py`` wires them into one ``kayos manager`` process."""
