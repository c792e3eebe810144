"""The ``kayos`` command line (kayos/cli/main.py says where each command lives). A face: its
commands reach a cluster through the client, the local cluster (kayos/local/) or the manager
member's topology-file tables, and import what they need when they run, so ``kayos --help``
stays quick."""
