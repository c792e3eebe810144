"""A node's HTTP face (aiohttp, docs/node-api.md): ``app`` builds the application and its routes,
``bodies`` parses requests and shapes replies, ``metrics`` exports the Prometheus gauges, and
``operator_api`` and ``lease_api`` answer the operator's and the manager's calls. It calls into
``kayos.node.runtime.Node`` and the node's modules below it; nothing of the node imports it but
``kayos.node.server``.
"""
