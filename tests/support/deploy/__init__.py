"""The deploy files as the tests read them (docs/deploy.md, "How this page is checked")."""
