"""The deploy files exercised: the systemd units verified and their command lines run on three
hosts in network namespaces, the compose file against the Compose schema, the Dockerfile's
steps (docs/deploy.md, "How this page is checked")."""
