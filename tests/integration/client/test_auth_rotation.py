"""Rotating a client credential while producers write at acks=all (docs/security.md, "Rotating
a credential"): ``kayos ctl credentials rotate`` gives the producers' credential a second secret,
their credentials file is replaced by the new one mid-run, ``finish`` drops the old secret, and a
client that connects afterwards proves the new one. No produce fails and every acknowledged
message is read back; the old secret is refused once the rotation is finished."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from kayos.client.sync import Client
from kayos.errors import KayosError
from kayos.local.cluster import LocalCluster
from tests.support.cluster import ctl, wait_until
from tests.support.security.credentials import add_credentials

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

QUEUE = "orders.rotation"
PRODUCERS = 3


def test_rotating_the_producers_credential_loses_and_fails_nothing(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", nodes=3, replicas=3) as cluster:
        url = cluster.url(cluster.ids[0])
        files = add_credentials(cluster, tmp_path)
        in_use = tmp_path / "producer-in-use.json"
        in_use.write_bytes(files["producer"].read_bytes())
        old = tmp_path / "producer-old.json"
        old.write_bytes(files["producer"].read_bytes())
        acked: list[bytes] = []
        errors: list[str] = []
        stop = threading.Event()

        def produce(index: int) -> None:
            with Client([url], credentials=str(in_use)) as client:
                count = 0
                while not stop.is_set():
                    key = f"p{index}-{count}".encode()
                    try:
                        client.produce(QUEUE, key, b"v", acks="all")
                    except KayosError as exc:
                        errors.append(f"{key!r}: {exc.code}: {exc}")
                        return
                    acked.append(key)
                    count += 1

        threads = [threading.Thread(target=produce, args=(i,)) for i in range(PRODUCERS)]
        for thread in threads:
            thread.start()
        try:
            wait_until(lambda: len(acked) >= 50 or errors, "the first acks")
            new = tmp_path / "producer-new.json"
            admin = ["--cluster", url, "--credentials", str(files["ops"]), "--json"]
            code, out, err = ctl("credentials", "rotate", "producer", "--out", str(new), *admin)
            assert code == 0, (out, err)
            assert any(c["rotating"] for c in out["credentials"] if c["name"] == "producer")
            os.replace(new, in_use)  # the producers read their file again at its next use
            mark = len(acked)
            wait_until(lambda: len(acked) >= mark + 50 or errors, "acks with both secrets")
            code, out, err = ctl("credentials", "finish", "producer", *admin)
            assert code == 0, (out, err)
            mark = len(acked)
            wait_until(lambda: len(acked) >= mark + 50 or errors, "acks after the rotation")
            with Client([url], credentials=str(in_use)) as late:  # proves the new secret
                acked.append(b"late")
                late.produce(QUEUE, b"late", b"v", acks="all")
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
        assert errors == []
        with Client([url], credentials=str(old)) as stale, pytest.raises(KayosError) as refused:
            stale.produce(QUEUE, b"old", b"v", acks="all")
        assert refused.value.code == "unauthenticated"
        with Client([url], credentials=str(files["ops"])) as reader:
            seen: set[bytes] = set()
            after = 0
            while True:
                page = reader.read(QUEUE, after=after, limit=1000)
                seen.update(message.key for message in page.messages)
                if not page.messages:
                    break
                after = page.messages[-1].seq
        lost = set(acked) - seen
        print(f"acked {len(acked)}, read {len(seen)}, lost {len(lost)}")
        assert not lost
