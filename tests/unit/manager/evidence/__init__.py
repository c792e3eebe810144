"""The manager's evidence of a node's death: the driver's pure choices, the write holds it
shortens, the report endpoints and the supervisor's report (docs/manager.md, "Evidence and proof
of death")."""
