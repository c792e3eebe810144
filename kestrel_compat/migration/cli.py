"""``kayos import-kestrel DIR``: the command line of ``kestrel_compat.migration``.

A progress bar per queue (items and bytes, with rich), then a table of every queue and the
warnings; exit code 0 when no queue failed (docs/migrating-from-kestrel.md section 4).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from kayos.cli.address import ClusterAddress, cluster_option
from kayos.errors import KayosError
from kestrel_compat.backends.kayos_backend import KayosBackend
from kestrel_compat.migration.importer import (
    CORRUPT,
    FAILED,
    QueueResult,
    existing_groups,
    import_queue,
)
from kestrel_compat.migration.plan import plan


async def run_import(
    directory: Path,
    queues: tuple[str, ...],
    seeds: list[str],
    dry_run: bool,
    force: bool,
    console: Console,
) -> tuple[list[QueueResult], list[str]]:
    chosen, warnings = plan(directory, queues)
    backend = None if dry_run else await KayosBackend.connect(seeds)
    results: list[QueueResult] = []
    try:
        existing = set() if backend is None else await existing_groups(backend)
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("items"),
            DownloadColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        ) as progress:
            tasks: dict[str, tuple[TaskID, TaskID]] = {}

            def on_start(queue: str, items: int, size: int) -> None:
                tasks[queue] = (
                    progress.add_task(f"{queue} items", total=max(items, 1)),
                    progress.add_task(f"{queue} bytes", total=max(size, 1), visible=False),
                )
                if items == 0:
                    progress.update(tasks[queue][0], completed=1)

            def on_progress(queue: str, items: int, size: int) -> None:
                item_task, byte_task = tasks[queue]
                progress.update(item_task, completed=items)
                progress.update(byte_task, completed=size)

            for files in chosen:
                results.append(
                    await import_queue(
                        backend,
                        directory,
                        files,
                        existing=existing,
                        force=force,
                        on_start=on_start,
                        on_progress=on_progress,
                    )
                )
    finally:
        if backend is not None:
            await backend.close()
    return results, warnings


def results_table(results: list[QueueResult]) -> Table:
    table = Table(title="kayos import-kestrel")
    for column in ("queue", "result", "items imported", "skipped as expired", "bytes", "seconds"):
        table.add_column(column, justify="left" if column in ("queue", "result") else "right")
    for result in results:
        table.add_row(
            result.queue,
            result.result,
            str(result.items),
            str(result.expired),
            str(result.bytes),
            f"{result.seconds:.2f}",
        )
    return table


@click.command(name="import-kestrel", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument(
    "directory", type=click.Path(exists=True, file_okay=False, path_type=Path), metavar="DIR"
)
@click.option("--queue", "queues", multiple=True, help="Import only this queue (repeatable).")
# The cluster to write to; `--seed` was its name before (docs/operations.md, "Naming the cluster").
@cluster_option("--seed")
@click.option("--dry-run", is_flag=True, help="Replay and report; write nothing.")
@click.option("--force", is_flag=True, help="Import again the queues the cluster has already.")
def import_kestrel(
    directory: Path, queues: tuple[str, ...], cluster: ClusterAddress, dry_run: bool, force: bool
) -> None:
    """Import a Kestrel 2.x queue directory (its journal files) into the queues the Kayos
    Kestrel front serves: every remaining item, in order, with its expiry, with acks=all. A
    queue is imported whole or not at all; queues already on the cluster are skipped."""
    console = Console(stderr=False)
    try:
        results, warnings = asyncio.run(
            run_import(directory, queues, list(cluster.urls), dry_run, force, console)
        )
    except KayosError as exc:
        click.echo(f"Error: {exc.code}: {exc}{cluster.hint()}", err=True)
        sys.exit(1)
    console.print(results_table(results))
    for result in results:
        if result.message:
            console.print(f"{result.queue}: {result.message}", markup=False, highlight=False)
        for warning in result.warnings:
            console.print(f"warning: {warning}", markup=False, highlight=False)
    for warning in warnings:
        console.print(f"warning: {warning}", markup=False, highlight=False)
    sys.exit(1 if any(r.result in (CORRUPT, FAILED) for r in results) else 0)
