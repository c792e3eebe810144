"""``kayos chaos``: ``run`` a real-process fault campaign, ``sim`` the deterministic simulator,
``check`` a recorded history again.
The ``kayos`` command loads it when ``kayos chaos`` is asked for (kayos/cli/main.py, which
imports it nowhere else); docs/testing.md explains the report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from chaos import checker
from chaos.history import dump_jsonl, load_jsonl
from chaos.procs import faults, netfaults
from kayos import limits
from kayos.cli.progress import Progress, wanted


class CampaignProgress(Progress):
    """The progress line of ``chaos run``: the campaign's lines above it, each fault counted
    and named as it begins."""

    def echo(self, line: str) -> None:
        self.line(f"chaos: {line}")
        if line.startswith("fault "):  # "fault N: KIND NODE HOLDs", as each fault begins
            self.phase(line)
            self.advance()
        elif line.startswith("heal"):
            self.phase(line)


def sim_plants() -> list[str]:
    from chaos.sim.node import PLANTS

    return list(PLANTS)


@click.group()
def chaos() -> None:
    """Fault campaigns against a local cluster, and the checker (docs/testing.md)."""


@chaos.command("run")
@click.option("--minutes", default=1.0, show_default=True, help="Length of the fault phase.")
@click.option("--seed", type=int, default=None, help="Schedule seed (default: random, printed).")
@click.option("--faults", "faults_max", type=int, default=None, help="Stop after this many faults.")
@click.option(
    "--kinds",
    default=",".join(faults.KINDS),
    show_default=True,
    help="Fault kinds to draw from, comma-separated; the network kinds "
    f"({', '.join(netfaults.KIND_WEIGHTS)}) run only when named (docs/testing.md).",
)
@click.option("--producers", default=3, show_default=True, help="Producer threads.")
@click.option(
    "--managers",
    default=3,
    show_default=True,
    help="Manager members (0: static chains, and the kinds that need a manager are not drawn).",
)
@click.option("--dir", "base", type=click.Path(), default=None, help="Where to put the cluster.")
@click.option("--history", type=click.Path(), default=None, help="Where to write the history.")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON report.")
def run_command(
    minutes: float,
    seed: int | None,
    faults_max: int | None,
    kinds: str,
    producers: int,
    managers: int,
    base: str | None,
    history: str | None,
    as_json: bool,
) -> None:
    """Runs a campaign; exits 1 on any violation."""
    from chaos.procs.campaign import Config, new_seed, run

    chosen = tuple(kind.strip() for kind in kinds.split(",") if kind.strip())
    unknown = sorted(set(chosen) - set(faults.ALL_KINDS))
    if unknown or not chosen:
        raise click.BadParameter(f"unknown kinds {unknown}; known: {', '.join(faults.ALL_KINDS)}")
    both = [set(chosen) & set(family) for family in netfaults.FAMILIES]
    if all(both):
        raise click.BadParameter(
            f"kinds {sorted(both[0])} and {sorted(both[1])} cannot run in one campaign "
            "(fault proxies or network namespaces); run them in two"
        )
    proxied = set(chosen) & set(netfaults.PROXY_KIND_WEIGHTS)
    spared = sorted(faults.SPARE_KINDS & set(chosen))
    if spared and proxied:
        raise click.BadParameter(
            f"{', '.join(spared)} cannot run with the proxy kinds "
            f"{sorted(proxied)} (its spare node has no fault proxy); it runs with the partition "
            "kinds (network namespaces) or with none"
        )
    if not minutes > 0 or producers < 1 or managers < 0:
        raise click.BadParameter("--minutes must be > 0, --producers >= 1, --managers >= 0")
    seed = new_seed() if seed is None else seed
    click.echo(f"chaos: seed {seed} (replay: kayos chaos run --seed {seed})", err=True)
    # On a terminal a line with the fault phase's time and the faults done (of --faults).
    shown = CampaignProgress(
        "chaos run", enabled=wanted(as_json), total=faults_max, expected_s=minutes * 60
    )
    config = Config(
        seed=seed,
        fault_phase_s=minutes * 60,
        faults_max=faults_max,
        producers=producers,
        managers=managers,
        kinds=chosen,
        base_dir=Path(base) if base else None,
        history_path=Path(history) if history else None,
        echo=shown.echo,
    )
    with shown:
        report = run(config).to_json()
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        summary = {k: v for k, v in report.items() if k != "violations"}
        click.echo(json.dumps(summary, indent=2))
        for violation in report["violations"]:
            click.echo(f"VIOLATION {violation['property']}: {violation['message']}")
    sys.exit(0 if report["ok"] else 1)


@chaos.command("check")
@click.argument("history", type=click.Path(exists=True, dir_okay=False))
def check_command(history: str) -> None:
    """Checks a recorded history (JSON lines) again; exits 1 on any violation."""
    verdict = checker.check(load_jsonl(history))
    click.echo(
        json.dumps(
            {
                "ok": verdict.ok,
                "acked": verdict.acked_versions,
                "lost": verdict.lost_versions,
                "delivered": verdict.delivered_messages,
                "snapshots": verdict.snapshots,
                "violations_by_property": verdict.by_property(),
                "violations": [violation.to_json() for violation in verdict.violations],
            },
            indent=2,
        )
    )
    sys.exit(0 if verdict.ok else 1)


@chaos.command("sim")
@click.option("--seeds", "count", default=200, show_default=True, help="How many seeds to run.")
@click.option("--seed", type=int, default=None, help="First seed (default: random, printed).")
@click.option(
    "--plant",
    type=click.Choice(sim_plants()),
    default=None,
    help="Plant a known bug (the simulator must find it).",
)
@click.option("--history", type=click.Path(), default=None, help="Write a failing seed's history.")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON summary.")
def sim_command(
    count: int, seed: int | None, plant: str | None, history: str | None, as_json: bool
) -> None:
    """Runs seeds S .. S+N-1 through the simulator; exits 1 on any violation. A failing seed
    replays exactly with ``--seed S --seeds 1`` (and the same ``--plant``)."""
    from chaos.procs.campaign import new_seed
    from chaos.sim import run_seeds

    if not 1 <= count <= limits.chaos_sim_seeds_max:
        raise click.BadParameter(f"--seeds must be in 1..{limits.chaos_sim_seeds_max}")
    first = new_seed() if seed is None else seed
    click.echo(f"chaos sim: seeds {first}..{first + count - 1}", err=True)
    summary = run_seeds(range(first, first + count), plant=plant)
    report = summary.to_json()
    failure = summary.first_failure
    if failure is not None:
        report["replay"] = f"kayos chaos sim --seed {failure.seed} --seeds 1" + (
            f" --plant {plant}" if plant else ""
        )
        if history:
            dump_jsonl(failure.history, history)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        brief = {k: v for k, v in report.items() if k != "first_failure"}
        click.echo(json.dumps(brief, indent=2))
        if failure is not None:
            for violation in failure.violations:
                click.echo(
                    f"VIOLATION seed {failure.seed} {violation['property']}: {violation['message']}"
                )
            click.echo(f"replay: {report['replay']}")
    sys.exit(0 if summary.ok else 1)
