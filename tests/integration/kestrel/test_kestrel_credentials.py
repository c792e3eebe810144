"""The Kestrel front's own identity toward a cluster that holds credentials (docs/security.md,
docs/kestrel-compat.md "Configuration"): ``server.kayos_credentials`` is read from the front's
TOML, the backend proves it on every request (items appended and read, groups committed, listed
and deleted), and a front without one is refused at its first request."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kayos.errors import KayosError
from kayos.local.cluster import LocalCluster
from kestrel_compat.backends.kayos_backend import KayosBackend
from kestrel_compat.core.config import load_config
from kestrel_compat.core.persistence import GroupState, NewEntry
from tests.support.security.credentials import add_credentials

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_the_front_proves_its_own_credential(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", nodes=3, replicas=3) as cluster:
        seed = cluster.url(cluster.ids[0])
        files = add_credentials(cluster, tmp_path)
        settings = tmp_path / "kestrel.toml"
        settings.write_text(f'[server]\nkayos_credentials = "{files["ops"]}"\n')
        credentials = load_config(str(settings)).server.kayos_credentials
        assert credentials == str(files["ops"])

        async def scenario() -> tuple[list[int], int, list[str]]:
            backend = await KayosBackend.connect(seed, credentials=credentials)
            try:
                seqs = await backend.append("jobs", [NewEntry(b"one", 1000, None, ("jobs",))])
                await backend.commit_group("jobs", "jobs", GroupState(seqs[0], b""))
                read = await backend.read("jobs", 0, 10)
                logs = await backend.list_logs()
                await backend.delete_group("jobs", "jobs")
            finally:
                await backend.close()
            return seqs, len(read), list(logs)

        seqs, read, logs = asyncio.run(scenario())
        assert len(seqs) == 1
        assert read == 1
        assert "jobs" in logs

        async def without() -> None:
            backend = await KayosBackend.connect(seed)
            try:
                await backend.append("jobs", [NewEntry(b"two", 1000, None, ("jobs",))])
            finally:
                await backend.close()

        with pytest.raises(KayosError) as refused:
            asyncio.run(without())
        # The backend wraps the cluster's refusal in its own error, which names it.
        assert "credential" in str(refused.value), refused.value
