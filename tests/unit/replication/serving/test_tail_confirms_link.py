"""A member below the head serves a new consumer snapshot only once its upstream answered a
CONFIRM sent on the current link after the request came in, held up to the head
(``ShardReplica.confirm_chain``; docs/replication-protocol.md, "Confirming a snapshot").

The real-process campaign with the manager (seed 11, docs/campaigns.md "Findings") paused a tail
past the detection window: the manager spliced it out, the new chain committed a group's mark
without it, and once resumed the old tail (still at its old epoch, its consumer's topology too)
served that group a snapshot starting below the acknowledged mark (`hwm`, `order`). Serving "the
last commit point heard" with the link down was the hole: the chain may have moved on without
it. In-process nodes over real stores, no processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from kayos.errors import UnavailableError
from tests.support.links import until
from tests.support.replicas import SEED, chain_node, node_chain

pytestmark = pytest.mark.unit


@pytest.mark.asyncio
async def test_a_tail_whose_upstream_link_is_gone_serves_no_new_snapshot(
    tmp_path: Path,
) -> None:
    print("seed", SEED)
    async with node_chain(tmp_path) as (topology, nodes):
        queue = "q"
        await nodes["a"].produce(queue, [b"k0"], [b"v"], None, None, acks=-1)
        tail = nodes["c"].replicas[0]
        await until(lambda: tail.commit_point >= 1 and not tail.catching_up, "the tail level")
        page = await nodes["c"].consume(queue, "g", after=None, upto=None, limit=10, wait_ms=0)
        assert [int(seq) for seq in page.seqs] == [1]  # linked: its upstream answers
        assert tail.upstream_stream is not None
        asked = tail.upstream_stream.confirm_nonce
        assert asked > 0
        assert tail.upstream_stream.confirmed(asked) is True

        # Its upstream goes away (as when it adopts a chain without this member, or is cut off):
        # the tail holds everything it was told is committed, yet serves no new snapshot.
        await nodes["b"].stop()
        await until(lambda: tail.upstream_stream is None, "the tail's link down")
        assert tail.holds_upstream_point()  # what used to be enough
        with pytest.raises(UnavailableError, match="did not confirm"):
            await nodes["c"].consume(queue, "g", after=None, upto=None, limit=10, wait_ms=0)

        # Back in touch: it serves again.
        nodes["b"] = chain_node(topology, "b", tmp_path)
        await nodes["b"].start()
        await until(lambda: tail.upstream_stream is not None, "the tail linked again")
        page = await nodes["c"].consume(queue, "g", after=None, upto=None, limit=10, wait_ms=0)
        assert [int(seq) for seq in page.seqs] == [1]
