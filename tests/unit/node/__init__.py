"""The node: edge checks and hostile input, HTTP bounds, signed admin messages, topology changes,
catch-up orders, disk status."""
