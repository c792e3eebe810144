"""The benchmarks' pictures: ``kayos bench NAME --plot FILE.png`` (docs/benchmarks.md says how to
read each). Every function here takes a bench's JSON result (the dict it prints with ``--json``,
series included: kayos/bench/series.py) and writes one PNG; none runs a benchmark.

matplotlib is the optional extra ``plot`` (``pip install 'kayos[plot]'``). It is imported inside
the functions, never at import time, and with the Agg backend (files only, no display), so the
CLI and the benches run without it; ``missing_matplotlib`` lets ``--plot`` fail before a bench
runs when it is not installed.
"""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Callable, Sequence
from typing import Any

# The pictures' size: 9 x 4.8 in at 100 dpi keeps a PNG well under 150 KB.
FIGURE_INCHES = (9.0, 4.8)
DPI = 100
# A throughput series in bins of 0.1 s is drawn as a rolling mean over this many bins (0.5 s):
# raw 0.1 s bins of a shared box's producers are mostly noise.
SMOOTH_BINS = 5
EXTRA_HINT = "pip install 'kayos[plot]' (the plot extra: matplotlib)"


def missing_matplotlib() -> str | None:
    """Why ``--plot`` cannot work here (matplotlib is not installed), or None."""
    if importlib.util.find_spec("matplotlib") is None:
        return f"--plot needs matplotlib: {EXTRA_HINT}"
    return None


def _figure(rows: int = 1, columns: int = 1, *, sharey: bool = False) -> tuple[Any, Any]:
    """A figure and its axes (a list when more than one), drawn by Agg."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figure = Figure(figsize=FIGURE_INCHES, dpi=DPI, layout="constrained")
    axes = figure.subplots(rows, columns, sharey=sharey, squeeze=False)
    flat = [axis for row in axes for axis in row]
    return figure, flat if len(flat) > 1 else flat[0]


def _save(figure: Any, path: str, title: str) -> None:
    figure.suptitle(title)
    figure.savefig(path, format="png", dpi=DPI)


def smoothed(values: Sequence[float], window: int = SMOOTH_BINS) -> list[float]:
    """The rolling mean of ``values`` over ``window`` bins (fewer at the start)."""
    out: list[float] = []
    total = 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        out.append(total / min(index + 1, window))
    return out


def _rate(series: Sequence[float], bin_s: float) -> tuple[list[float], list[float]]:
    """Times (bin centres) and the smoothed rate per second of counts per bin."""
    times = [(i + 0.5) * bin_s for i in range(len(series))]
    return times, [v / bin_s for v in smoothed(series)]


def plot_produce(result: dict[str, Any], path: str) -> None:
    """Committed messages per second over the batched phase, and the commit latencies' CDF."""
    series = result["series"]
    figure, (left, right) = _figure(1, 2)
    times, rates = _rate(series["committed_per_bin"], series["bin_s"])
    left.plot(times, rates, color="tab:blue", label="committed msgs/s (0.5 s mean)")
    left.axhline(result["msgs_per_s"], color="tab:gray", ls="--", label="mean")
    left.set(xlabel="seconds into the batched phase", ylabel="messages/s", ylim=(0, None))
    left.set_title("acks=all throughput over time")
    left.legend(loc="lower right", fontsize="small")
    parameters = result.get("parameters", {})
    batched = f"batches of {parameters.get('batch')}, {parameters.get('in_flight')} in flight"
    for name, label in (
        ("commit_quantiles_ms", batched),
        ("single_commit_quantiles_ms", "one message at a time"),
    ):
        quantiles = series.get(name) or []
        if quantiles:
            fractions = [i / (len(quantiles) - 1) for i in range(len(quantiles))]
            right.plot(quantiles, fractions, label=label)
    right.set(xlabel="produce call to committed (ms, log)", ylabel="fraction of calls")
    right.set_xscale("log")
    right.set_title("commit latency CDF")
    right.grid(True, which="both", alpha=0.3)
    right.legend(loc="lower right", fontsize="small")
    _save(figure, path, "kayos bench produce")


def plot_failover(result: dict[str, Any], path: str) -> None:
    """Acknowledgements per 100 ms around the fault, one panel per role, one line per case."""
    roles = list(result["parameters"]["roles"])
    figure, axes = _figure(1, len(roles), sharey=True)
    axes = axes if isinstance(axes, list) else [axes]
    colours = {"kill9": "tab:red", "sigstop": "tab:blue"}
    for axis, role in zip(axes, roles, strict=True):
        drawn: set[str] = set()
        for run in result["runs"]:
            line = run.get("timeline")
            if run["role"] != role or not line:
                continue
            start = line["from_fault_s"]
            times = [start + i * line["bin_s"] for i in range(len(line["acks"]))]
            fault = run["fault"]
            label = fault if fault not in drawn else None
            drawn.add(fault)
            axis.step(times, line["acks"], where="post", color=colours.get(fault), alpha=0.7,
                      lw=1, label=label)  # fmt: skip
        axis.axvline(0.0, color="black", ls=":", lw=1)
        axis.text(0.0, 1.0, " fault", transform=axis.get_xaxis_transform(), va="top")
        axis.set(title=role, xlabel="seconds from the fault")
        if drawn:
            axis.legend(loc="lower right", fontsize="small")
    axes[0].set_ylabel("acks per 100 ms (all producers)")
    _save(figure, path, "kayos bench failover: acknowledgements around the fault")


def _catchup_rate(
    samples: Sequence[Sequence[float]], column: int
) -> tuple[list[float], list[float]]:
    """Times and rates (per second) of a sampled cumulative column, between samples."""
    times: list[float] = []
    rates: list[float] = []
    for before, after in itertools.pairwise(samples):
        span = after[0] - before[0]
        if span > 0:
            times.append((before[0] + after[0]) / 2)
            rates.append(max(0.0, (after[column] - before[column]) / span))
    return times, rates


def _acks_and_copy(
    axis: Any,
    acks: Sequence[float],
    bin_s: float,
    copy: tuple[list[float], list[float]],
    copy_label: str,
    span: tuple[float, float],
    span_label: str,
) -> None:
    """Producer acks/s on ``axis``, the copy's MB/s on a second axis, the copy's span shaded."""
    times, rates = _rate(acks, bin_s)
    axis.plot(times, rates, color="tab:blue", label="producer acks/s (0.5 s mean)")
    axis.set(xlabel="seconds", ylabel="producer acks/s", ylim=(0, None))
    axis.axvspan(*span, color="tab:orange", alpha=0.12, label=span_label)
    other = axis.twinx()
    other.plot(*copy, color="tab:green", marker=".", lw=1, label=copy_label)
    other.set(ylabel="copied MB/s", ylim=(0, None))
    lines = axis.get_legend_handles_labels()
    more = other.get_legend_handles_labels()
    axis.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize="small")


def plot_heal(result: dict[str, Any], path: str) -> None:
    """The first run's catch-up: the returning node's copy rate against the producers' rate."""
    runs = [run for run in result.get("runs", []) if run.get("catchup_series")]
    if not runs:
        raise ValueError("no run recorded a catch-up series")
    series = runs[0]["catchup_series"]
    figure, axis = _figure()
    copy = _catchup_rate(series["node_samples"], 2)
    span = (series["catchup_start_s"], series["catchup_end_s"])
    _acks_and_copy(axis, series["acks_per_bin"], series["bin_s"], copy,
                   "returning node's store MB/s", span, "catch-up")  # fmt: skip
    axis.set_xlabel("seconds from the baseline's start")
    _save(figure, path, "kayos bench heal: catch-up rate against producer rate")


def plot_grow(result: dict[str, Any], path: str) -> None:
    """The new node's copy rate against the producers' rate, before, during and after the move."""
    series = result["grow_series"]
    figure, axis = _figure()
    copy = _catchup_rate(series["copied_mb_samples"], 1)
    span = (series["move_start_s"], series["move_end_s"])
    _acks_and_copy(axis, series["acks_per_bin"], series["bin_s"], copy,
                   "new node's copied MB/s", span, "add node + rebalance")  # fmt: skip
    axis.set_xlabel("seconds from the baseline's start")
    _save(figure, path, "kayos bench grow: moving shards onto a 4th node under load")


def plot_restore(result: dict[str, Any], path: str) -> None:
    """When each step of restoring redundancy came after the kill, and the producers' rate
    before, during and after the copy."""
    figure, (left, right) = _figure(1, 2)
    steps = ["spliced", "copy begins", "3 replicas"]
    seconds = [result["spliced_s"], result["copy_start_s"], result["kill_to_full_redundancy_s"]]
    _bars(left, steps, [s or 0.0 for s in seconds], "seconds after the kill")
    left.set_title(f"grace {result['grace_s']:g} s, {result['mb_copied']:,.0f} MB copied")
    rates = [result[f"produce_msgs_per_s_{phase}"] for phase in ("before", "during", "after")]
    _bars(right, ["before", "during", "after"], rates, "acks=all messages/s")
    right.set_title("producers")
    _save(figure, path, "kayos bench restore: a node lost for good, redundancy restored")


def plot_retention(result: dict[str, Any], path: str) -> None:
    """Each node's disk use over the soak, against the budget."""
    series = result["disk_series"]
    figure, axis = _figure()
    for node, values in series["disk_mb"].items():
        axis.plot(series["t_s"], values, lw=1.2, label=f"node {node}")
    axis.axhline(result["budget_bytes"] / (1 << 20), color="tab:red", ls="--", label="budget")
    axis.set(xlabel="seconds", ylabel="data directory on disk (MB)", ylim=(0, None))
    axis.legend(loc="lower right", fontsize="small")
    produced = result["produced_bytes"] / (1 << 20)
    _save(figure, path, f"kayos bench retention: {produced:.0f} MB through an until_consumed queue")


def _bars(axis: Any, labels: Sequence[str], values: Sequence[float], unit: str) -> None:
    positions = range(len(labels))
    bars = axis.bar(positions, values, color="tab:blue")
    axis.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize="small")
    axis.set_xticks(list(positions), list(labels), fontsize="small")
    axis.set(ylabel=unit, ylim=(0, max(values, default=1) * 1.15 or 1))


def plot_storage(result: dict[str, Any], path: str) -> None:
    """Commit and scan rates of the shard store, beside lmdb's when it ran."""
    figure, (left, right) = _figure(1, 2)
    names = ["shard store"]
    commits = [result["msgs_per_s"]]
    scans = [result["scan_msgs_per_s"]]
    if "lmdb_msgs_per_s" in result:
        names.append("lmdb")
        commits.append(result["lmdb_msgs_per_s"])
        scans.append(result["lmdb_scan_msgs_per_s"])
    _bars(left, names, commits, "messages/s")
    left.set_title(f"commit ({result['workload']['per_commit']} per fsync'd commit)")
    _bars(right, names, scans, "messages/s")
    right.set_title("scan")
    _save(figure, path, f"kayos bench storage: {result['workload']['messages']:,} messages")


def plot_spark(result: dict[str, Any], path: str) -> None:
    """Rows/s of each way in and out: the Spark source's reads against the plain client's."""
    names = {
        "write_rows_per_s": "Spark write",
        "client_read_rows_per_s": "client read",
        "batch_read_rows_per_s": "Spark batch read",
        "stream_read_rows_per_s": "Spark stream read",
        "spark_floor_rows_per_s": "Spark floor",
    }
    figure, axis = _figure()
    _bars(axis, list(names.values()), [result[name] for name in names], "rows/s")
    rows = result["parameters"]["rows"]
    _save(figure, path, f"kayos bench spark: {rows:,} rows, local[2]")


def plot_kestrel(result: dict[str, Any], path: str) -> None:
    """Operations/s per workload and client count, for each backend (and memcached)."""
    scenarios = result["scenarios"]
    backends = sorted({row["backend"] for row in scenarios})
    figure, axes = _figure(1, len(backends), sharey=True)
    axes = axes if isinstance(axes, list) else [axes]
    for axis, backend in zip(axes, backends, strict=True):
        rows = [row for row in scenarios if row["backend"] == backend]
        labels = [f"{row['workload']}\n{row['clients']} clients" for row in rows]
        positions = list(range(len(rows)))
        width = 0.4
        compared = any("memcached_ops_per_s" in row for row in rows)
        shift = width / 2 if compared else 0.0
        kayos = axis.bar([p - shift for p in positions], [r["ops_per_s"] for r in rows],
                         width, label="Kestrel front")  # fmt: skip
        axis.bar_label(kayos, fmt="%.0f", fontsize="x-small")
        if compared:
            memcached = [row.get("memcached_ops_per_s", 0) for row in rows]
            bars = axis.bar([p + width / 2 for p in positions], memcached, width,
                            label="memcached", color="tab:gray")  # fmt: skip
            axis.bar_label(bars, fmt="%.0f", fontsize="x-small")
        axis.set_xticks(positions, labels, fontsize="small")
        axis.set(title=f"{backend} backend")
        axis.legend(fontsize="small")
    axes[0].set_ylabel("operations/s")
    _save(figure, path, "kayos bench kestrel: python-memcached clients")


def plot_scale(result: dict[str, Any], path: str) -> None:
    """Each case's measured msgs/s beside the capacity model's prediction, and each case's CPU
    per message by role (nodes carrying several roles shown as such)."""
    cases = result["cases"]
    names = list(cases)
    predictions = (result.get("model") or {}).get("predictions", {})
    figure, (left, right) = _figure(1, 2)
    width = 0.4
    positions = list(range(len(names)))
    rates = [cases[n]["msgs_per_s"] for n in names]
    measured = left.bar([p - width / 2 for p in positions], rates, width, label="measured")
    left.bar_label(measured, fmt="%.0f", fontsize="x-small")
    predicted = [predictions.get(n, {}).get("predicted_msgs_per_s", 0) for n in names]
    model = left.bar([p + width / 2 for p in positions], predicted, width, label="model",
                     color="tab:gray")  # fmt: skip
    left.bar_label(model, fmt="%.0f", fontsize="x-small")
    left.set_xticks(positions, names, fontsize="small")
    left.set(ylabel="acks=all messages/s", ylim=(0, None), title="throughput")
    left.legend(fontsize="small")
    kinds = ["head", "middle", "tail", "head+middle+tail"]
    step = 0.8 / len(kinds)
    for offset, kind in enumerate(kinds):
        values = []
        for name in names:
            rows = [r for r in cases[name]["node_cpu_s_per_msg"].values() if r["roles"] == kind]
            per = [r["cpu_s_per_msg"] for r in rows if r["cpu_s_per_msg"] is not None]
            values.append(sum(per) / len(per) * 1e6 if per else 0.0)
        shift = (offset - (len(kinds) - 1) / 2) * step
        right.bar([p + shift for p in positions], values, step, label=kind)
    right.set_xticks(positions, names, fontsize="small")
    right.set(ylabel="CPU microseconds per message", ylim=(0, None), title="a node's CPU by role")
    right.legend(fontsize="small")
    cap = result["parameters"]["node_cpu"]
    _save(figure, path, f"kayos bench scale: nodes capped at {cap} core each")


PLOTS: dict[str, Callable[[dict[str, Any], str], None]] = {
    "produce": plot_produce,
    "failover": plot_failover,
    "heal": plot_heal,
    "grow": plot_grow,
    "retention": plot_retention,
    "restore": plot_restore,
    "storage": plot_storage,
    "spark": plot_spark,
    "kestrel": plot_kestrel,
    "scale": plot_scale,
}


def write_plot(bench: str, result: dict[str, Any], path: str) -> None:
    """Writes ``bench``'s picture of ``result`` to ``path`` (a PNG)."""
    PLOTS[bench](result, path)
