"""``kayos produce`` and ``kayos consume``: the client from a shell (kayos.Client)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING

import click

from kayos.cli.address import ClusterAddress, cluster_option

if TYPE_CHECKING:
    from kayos.client.sync import Client
    from kayos.client.types import Acks, Message

# Lines of a --file produced per request: one batch, well under limits.batch_entries_max.
FILE_BATCH_LINES = 1000
# One long-poll of `consume --follow`; the node caps it at limits.consume_wait_ms_max.
FOLLOW_WAIT_S = 10.0

# The cluster's address; `--seed` was its name before (docs/operations.md, "Naming the cluster").
_cluster_option = cluster_option("--seed")


def _client(cluster: ClusterAddress) -> Client:
    from kayos.client.sync import Client
    from kayos.errors import KayosError

    try:
        return Client(list(cluster.urls), name="kayos-cli")
    except KayosError as exc:
        raise click.ClickException(
            f"cannot reach the cluster at {cluster.describe()}: {exc}"
        ) from exc


def _acks(value: str) -> Acks:
    return "all" if value == "all" else (1 if value == "1" else 0)


def _file_items(handle: IO[str]) -> Iterator[list[tuple[str, str]]]:
    """Batches of ``(key, value)`` from lines ``KEY<TAB>VALUE``; blank lines are skipped."""
    batch: list[tuple[str, str]] = []
    for number, line in enumerate(handle, 1):
        text = line.rstrip("\r\n")
        if not text:
            continue
        key, tab, value = text.partition("\t")
        if not tab:
            raise click.ClickException(f"line {number}: expected KEY<TAB>VALUE")
        batch.append((key, value))
        if len(batch) >= FILE_BATCH_LINES:
            yield batch
            batch = []
    if batch:
        yield batch


@click.command()
@click.argument("queue")
@click.argument("key", required=False)
@click.argument("value", required=False)
@click.option(
    "--file",
    "source",
    type=click.File("r"),
    default=None,
    help="Produce each line KEY<TAB>VALUE of this file ('-' for stdin) instead.",
)
@click.option(
    "--acks",
    type=click.Choice(["all", "1", "0"]),
    default="all",
    show_default=True,
    help="Answer once committed on every replica (all), durable on the head (1), or queued (0).",
)
@_cluster_option
def produce(
    queue: str,
    key: str | None,
    value: str | None,
    source: IO[str] | None,
    acks: str,
    cluster: ClusterAddress,
) -> None:
    """Produce KEY VALUE (or a file of them) to QUEUE; prints the seqs."""
    from kayos.errors import KayosError

    if (source is None) == (key is None or value is None) or (source and key is not None):
        raise click.UsageError("give KEY and VALUE, or --file F (not both)")
    with _client(cluster) as client:
        try:
            if source is None:
                assert key is not None
                assert value is not None
                seq = client.produce(queue, key, value, acks=_acks(acks))
                click.echo(f"{queue}: seq {seq}")
                return
            for batch in _file_items(source):
                for part in client.produce_sharded(queue, batch, acks=_acks(acks)):
                    where = (
                        f"shard {part.shard} " if len(client.topology.shards_for(queue)) > 1 else ""
                    )
                    click.echo(
                        f"{queue}: {part.items} messages, {where}seqs "
                        f"{part.first_seq}..{part.last_seq}"
                    )
        except KayosError as exc:
            raise click.ClickException(f"{exc.code}: {exc}") from exc


def _message_line(message: Message) -> str:
    def text(data: bytes | None) -> str | None:
        return None if data is None else data.decode(errors="backslashreplace")

    record = {
        "seq": message.seq,
        "key": text(message.key),
        "value": text(message.value),
        "deleted": message.deleted,
    }
    if message.expiry_ms:
        record["expiry_ms"] = message.expiry_ms
    return json.dumps(record)


@click.command()
@click.argument("queue")
@click.option("--group", required=True, help="The consumer group.")
@click.option("--commit", is_flag=True, help="Commit the group's high-water mark after each read.")
@click.option(
    "--follow", is_flag=True, help="Keep waiting for new messages (needs --commit); Ctrl-C stops."
)
@click.option("--page-size", default=1000, show_default=True, help="Messages per page request.")
@_cluster_option
def consume(
    queue: str, group: str, commit: bool, follow: bool, page_size: int, cluster: ClusterAddress
) -> None:
    """Print QUEUE's messages after GROUP's high-water mark, one JSON object per line.

    Without --commit the group does not move, and the same messages print again next time."""
    from kayos.errors import KayosError

    if follow and not commit:
        raise click.UsageError("--follow needs --commit (the next read starts at the group's mark)")
    with _client(cluster) as client:
        try:
            while True:
                # Per shard (a queue may have several): the boundary and how many messages.
                read: dict[int, tuple[int, int]] = {}
                for page in client.consume(
                    queue, group, page_size=page_size, wait_s=FOLLOW_WAIT_S if follow else 0.0
                ):
                    for message in page.messages:
                        click.echo(_message_line(message))
                    _, before = read.get(page.shard, (0, 0))
                    read[page.shard] = (page.boundary, before + len(page.messages))
                # Only after messages: a group commit takes a seq of its own, so committing an
                # empty snapshot would make the next one non-empty and the loop never wait.
                for shard, (boundary, count) in read.items():
                    if commit and count:
                        client.commit(queue, group, boundary, shard=shard)
                count = sum(count for _, count in read.values())
                boundary = max((boundary for boundary, _ in read.values()), default=0)
                if not follow:
                    click.echo(
                        f"{queue}/{group}: {count} messages through seq {boundary}", err=True
                    )
                    return
        except KayosError as exc:
            raise click.ClickException(f"{exc.code}: {exc}") from exc
        except KeyboardInterrupt:
            return
