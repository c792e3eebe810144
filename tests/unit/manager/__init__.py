"""The manager: its pure core (decide, transcripts in testdata/, placement, codec) and its member
in one process (driver, config, operator face, the Raft adapter over one member)."""
