"""The command line's names, walked from the ``kayos`` group (docs/operations.md, "Naming the
cluster"): every command that talks to a running cluster takes ``--cluster`` and reads
``KAYOS_CLUSTER``, every other command is listed with the reason it takes neither, an option name
means one thing in every command that has it, and each name a command used before still works,
hidden, with a note on stderr.

Whether a command uses the cluster it was given is checked without a cluster: the address the
command is handed is a probe that raises ``Reached`` with its URLs when the command reads them,
so each case ends where the command would first contact a node."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from kayos.cli import address
from kayos.cli.address import CLUSTER_ENV, ClusterAddress, DeprecatedOption
from kayos.cli.main import cli

pytestmark = pytest.mark.unit

URL = "http://127.0.0.1:1"
ENV_URLS = ("http://127.0.0.1:2", "http://127.0.0.1:3")

# Every command that talks to a running cluster's nodes, with what it needs besides the cluster
# ({topology}: a topology file with a secret and a manager member; {dir}: an empty directory).
TALKS_TO_A_CLUSTER: dict[str, list[str]] = {
    "produce": ["q", "k", "v"],
    "consume": ["q", "--group", "g"],
    "import-kestrel": ["{dir}"],
    "kestrel": ["--port", "0", "--no-text", "--no-thrift"],
    "ctl status": [],
    "ctl retention": ["q"],
    "ctl check": [],
    "ctl compact": ["--topology", "{topology}"],
    "ctl queue describe": ["q"],
    "ctl queue create": ["q", "--shards", "1", "--topology", "{topology}"],
    "ctl queue alter": ["q", "--shards", "2", "--topology", "{topology}"],
    "ctl credentials list": [],
    "ctl credentials add": ["app", "--grant", "produce=*", "--out", "{dir}/app.json"],
    "ctl credentials rotate": ["app", "--out", "{dir}/app.json"],
    "ctl credentials finish": ["app"],
    "ctl credentials remove": ["app"],
    "ctl credentials push": [],
}
MANAGER_ONLY = (
    "asks the cluster manager only: the members' addresses and the secret that signs the "
    "request are in the topology file (--topology); no node is asked"
)
OWN_CLUSTER = "starts a local cluster of its own"
# Every other command, and why it takes no --cluster.
NO_CLUSTER: dict[str, str] = {
    "node": "runs one node: its topology file (--config) says where every node is",
    "manager": "runs one manager member: its topology file (--topology) names the cluster",
    "up": OWN_CLUSTER,
    "init": "writes a topology file",
    "check": "verifies a store on disk, offline",
    "ctl remove-node": MANAGER_ONLY,
    "ctl node-exited": MANAGER_ONLY,
    "ctl add-node": MANAGER_ONLY,
    "ctl drain": MANAGER_ONLY,
    "ctl move-shard": MANAGER_ONLY,
    "ctl rebalance": MANAGER_ONLY,
    "ctl secret rotate start": "rewrites the topology file's secrets (--topology) and tells each "
    "node and manager member it names to read them again",
    "ctl secret rotate finish": "rewrites the topology file's secrets (--topology) and tells each "
    "node and manager member it names to read them again",
    "bench storage": "measures a store on disk",
    "bench produce": OWN_CLUSTER,
    "bench retention": OWN_CLUSTER,
    "bench failover": OWN_CLUSTER,
    "bench heal": OWN_CLUSTER,
    "bench grow": OWN_CLUSTER,
    "bench restore": OWN_CLUSTER,
    "bench scale": OWN_CLUSTER,
    "bench spark": OWN_CLUSTER,
    "bench kestrel": OWN_CLUSTER + " (--local-cluster), or none (--memory)",
    "chaos run": OWN_CLUSTER,
    "chaos sim": "simulates a cluster in this process",
    "chaos check": "reads a recorded history",
}
# The names kept for one release: (command, old name) -> how its note names the replacement.
DEPRECATED: dict[tuple[str, str], str] = {
    ("produce", "--seed"): "--cluster URL",
    ("consume", "--seed"): "--cluster URL",
    ("import-kestrel", "--seed"): "--cluster URL",
    ("ctl status", "--url"): "--cluster URL",
    ("ctl retention", "--url"): "--cluster URL",
    ("ctl check", "--url"): "--cluster URL",
    ("ctl compact", "--url"): "--cluster URL",
    ("ctl queue describe", "--url"): "--cluster URL",
    ("ctl compact", "--wait"): "--wait-timeout SECONDS",
    ("bench kestrel", "--cluster"): "--local-cluster",
}
# What each option name that several commands share means: every command's help for it matches
# the pattern. A name missing here that two commands use fails the test: say what it means.
MEANINGS: dict[str, tuple[str, str]] = {
    "--baseline-s": ("seconds of produce alone before the change", r"^Produce alone before"),
    "--batch": ("messages per produce call", r"Messages per produce call"),
    "--both-loads": ("closed loop, then open loop", r"open loop"),
    "--cases": ("which cases of a benchmark to run, comma-separated", r"[Cc]ases to run"),
    "--cgroup-root": ("where the cgroup hierarchies are mounted", r"cgroup"),
    "--cluster": ("a running cluster's node URLs", r"node's HTTP base URL"),
    # A process's own configuration file: a node's is the cluster's topology file (which the
    # other commands call --topology; the node's name predates them and every unit uses it),
    # the Kestrel front's its TOML settings.
    "--certificate": ("a TLS client certificate's name", r"certificate"),
    # A client credentials file (docs/security.md); every command that takes --cluster has it,
    # and `bench produce` (its own cluster holds the file's credential).
    "--credentials": ("the credentials file every request proves", r"credentials file"),
    "--credentials-table": ("a credentials table a node takes at start", r"credentials table"),
    "--grant": ("ROLE=PATTERN, a credential's grant", r"ROLE\[\+ROLE\.\.\.\]=PATTERN"),
    "--config": ("the configuration file of the process the command runs", r"TOML"),
    "--cpu-weight": ("a cgroup's CPU weight against other processes", r"CPU weight"),
    "--copy-rate-mb-per-s-max": ("a node's ceiling on a copy's rate, MB/s", r"Ceiling"),
    "--data": ("a data directory", r"data (directory|root)"),
    "--dir": ("where a benchmark or a campaign puts its files", r"^Where to put"),
    "--force": ("do it although it exists already", r"already"),
    # bench restore's only: the manager's grace before a short shard is copied (rule 10).
    "--grace-s": ("the manager's replace_after_ms in seconds", r"replace_after_ms"),
    "--history": ("a history file of the checker", r"history"),
    "--host": ("a host name or address", r"host|address"),
    "--id": ("this process's id in the topology file", r"\bid\b"),
    "--in-flight": ("produce calls outstanding at once", r"outstanding"),
    # A node or manager member bound beyond loopback without TLS, or a node without client
    # credentials (docs/security.md, "Safe defaults").
    "--insecure": ("serve beyond loopback without TLS or credentials, on purpose", r"without TLS"),
    "--json": ("print JSON", r"JSON"),
    "--kinds": ("fault kinds, comma-separated", r"[Ff]ault kinds"),
    "--manager": ("a manager member (repeatable)", r"manager member"),
    "--log-level": ("the Python logging level", r"logging level"),
    "--managers": ("how many manager members", r"Manager members"),
    "--max-age-ms": ("retention: drop entries older", r"older"),
    "--max-bytes": ("retention: keep at most this many bytes", r"at most"),
    "--messages": ("how many messages", r"Messages to"),
    "--no-wait": ("follow until done, or not", r"follow"),
    "--wait": ("follow until done, or not", r"follow"),
    "--node": ("a node (repeatable)", r"node"),
    "--node-cpu": ("each node's CPU cap in cores", r"CPU cap in cores"),
    "--nodes": ("how many node processes", r"Node processes"),
    "--out": ("the file to write the result to", r"write"),
    "--plot": ("the PNG file to draw the figures to", r"draw the figures"),
    "--produce-rate": ("open-loop producers' rate", r"msgs/s"),
    "--producers": ("how many producer threads", r"[Pp]roducer threads"),
    "--repeat": ("how many runs or repetitions", r"Runs|Repetitions"),
    "--replicas": ("a chain's length", r"[Cc]hain"),
    "--seconds": ("a timed window's length", r"[Tt]imed window"),
    "--seed": ("a random generator's seed (an integer)", r"[Ss]eed"),
    "--shard-mb": ("a shard's size in MiB", r"shard"),
    # The subject's: the cluster's shard count (init, up), a queue's (ctl queue create/alter).
    "--shards": ("how many shards", r"[Ss]hard"),
    "--table": ("a credentials table file to edit offline", r"credentials table file"),
    "--timeout": ("seconds to wait before giving up", r"^Seconds to wait"),
    # init's names the directory for the certificates; up's and bench produce's is a flag.
    "--tls": ("TLS on every port and link, with a private CA", r"TLS"),
    "--topology": ("the cluster's topology file", r"topology file"),
    "--until-consumed": ("retention: drop what every group consumed", r"consumed"),
    "--value-bytes": ("bytes per value", r"Bytes per value"),
    "--warmup-s": ("how long to run before timing", r"before timing"),
}


def leaves(command: click.Command = cli, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """Every command of the tree as ("ctl queue describe", command), ``chaos`` included."""
    if isinstance(command, click.Group):
        context = click.Context(command)
        for name in command.list_commands(context):
            child = command.get_command(context, name)
            assert child is not None, name
            yield from leaves(child, (*path, name))
    else:
        yield " ".join(path), command


COMMANDS = dict(leaves())


def options_of(command: click.Command) -> list[click.Option]:
    return [param for param in command.params if isinstance(param, click.Option)]


def kind(option: click.Option) -> str:
    """The shape of an option's value: a switch, or the base type of what it takes."""
    if option.is_flag:
        return "switch"
    for base, name in (
        (click.types.IntParamType, "integer"),
        (click.types.FloatParamType, "number"),
        (click.Path, "path"),
        (click.File, "file"),
        (click.Choice, "choice"),
    ):
        if isinstance(option.type, base):
            return name
    return "text"


class Reached(Exception):
    """The command read the cluster's URLs: where it would first contact a node."""

    def __init__(self, urls: tuple[str, ...]) -> None:
        super().__init__(", ".join(urls))
        self.urls = urls


class Probe:
    """A ``ClusterAddress`` whose URLs raise ``Reached`` when the command reads them."""

    def __init__(self, found: ClusterAddress) -> None:
        self.found = found
        self.source = found.source

    @property
    def urls(self) -> tuple[str, ...]:
        raise Reached(self.found.urls)

    def describe(self) -> str:
        return self.found.describe()

    def hint(self) -> str:
        return self.found.hint()


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> None:
    real = address.resolve

    def probing(*args: Any, **kwargs: Any) -> Any:
        found = real(*args, **kwargs)
        return None if found is None else Probe(found)

    monkeypatch.setattr(address, "resolve", probing)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """A topology file with a secret and a manager member, and an empty directory."""
    topology = tmp_path / "cluster.toml"
    made = CliRunner().invoke(
        cli, ["init", "--out", str(topology), "--node", "a=127.0.0.1:1:2"], catch_exceptions=False
    )
    assert made.exit_code == 0, made.output
    with topology.open("a") as handle:
        handle.write('\n[managers."m1"]\nhost = "127.0.0.1"\nraft_port = 3\nhttp_port = 4\n')
    empty = tmp_path / "kestrel"
    empty.mkdir()
    return {"topology": str(topology), "dir": str(empty)}


@pytest.fixture(autouse=True)
def elsewhere(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty working directory: no ./kayos-data/cluster.toml to fall back on."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


def invoke(name: str, args: list[str], env: dict[str, str | None]) -> Result:
    return CliRunner().invoke(cli, [*name.split(), *args], env=env)


def test_every_command_is_listed_as_talking_to_a_cluster_or_not() -> None:
    assert not set(TALKS_TO_A_CLUSTER) & set(NO_CLUSTER)
    assert set(COMMANDS) == set(TALKS_TO_A_CLUSTER) | set(NO_CLUSTER), (
        "a command was added or removed: list it in TALKS_TO_A_CLUSTER (it takes --cluster) or "
        "in NO_CLUSTER with the reason it takes none"
    )


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_cluster_is_the_repeatable_url_option_of_exactly_the_commands_that_talk_to_one(
    name: str,
) -> None:
    found = [o for o in options_of(COMMANDS[name]) if "--cluster" in o.opts]
    current = [o for o in found if not isinstance(o, DeprecatedOption)]
    if name in NO_CLUSTER:
        assert not current, f"{name} takes --cluster: list it in TALKS_TO_A_CLUSTER"
        return
    assert len(current) == 1
    option = current[0]
    assert option.multiple
    assert kind(option) == "text"
    assert option.metavar == "URL"
    assert CLUSTER_ENV in (option.help or "")


@pytest.mark.parametrize("way", ["--cluster", CLUSTER_ENV])
@pytest.mark.parametrize("name", sorted(TALKS_TO_A_CLUSTER))
def test_each_command_asks_the_cluster_named_by_the_option_or_the_variable(
    name: str, way: str, probe: None, files: dict[str, str]
) -> None:
    args = [arg.format(**files) for arg in TALKS_TO_A_CLUSTER[name]]
    if way == "--cluster":
        result = invoke(name, [*args, "--cluster", URL], {CLUSTER_ENV: None})
        expected: tuple[str, ...] = (URL,)
    else:
        result = invoke(name, args, {CLUSTER_ENV: ",".join(ENV_URLS)})
        expected = ENV_URLS
    assert isinstance(result.exception, Reached), (result.exit_code, result.output)
    assert result.exception.urls == expected


@pytest.mark.parametrize("name", sorted(TALKS_TO_A_CLUSTER))
def test_the_option_wins_over_the_variable(name: str, probe: None, files: dict[str, str]) -> None:
    args = [arg.format(**files) for arg in TALKS_TO_A_CLUSTER[name]]
    result = invoke(name, [*args, "--cluster", URL], {CLUSTER_ENV: ",".join(ENV_URLS)})
    assert isinstance(result.exception, Reached), (result.exit_code, result.output)
    assert result.exception.urls == (URL,)


def test_the_deprecated_names_are_exactly_the_listed_ones() -> None:
    found = {
        (name, option.opts[0])
        for name, command in COMMANDS.items()
        for option in options_of(command)
        if isinstance(option, DeprecatedOption)
    }
    assert found == set(DEPRECATED)
    for (name, old), replacement in DEPRECATED.items():
        option = next(o for o in options_of(COMMANDS[name]) if old in o.opts)
        assert isinstance(option, DeprecatedOption)
        assert option.hidden
        assert option.replacement.startswith(replacement)
        new = replacement.split()[0]
        assert any(new in o.opts + o.secondary_opts for o in options_of(COMMANDS[name])), new


@pytest.mark.parametrize(
    ("name", "old"), sorted(key for key in DEPRECATED if DEPRECATED[key] == "--cluster URL")
)
def test_an_old_name_for_the_cluster_still_works_with_a_note(
    name: str, old: str, probe: None, files: dict[str, str]
) -> None:
    args = [arg.format(**files) for arg in TALKS_TO_A_CLUSTER[name]]
    result = invoke(name, [*args, old, URL], {CLUSTER_ENV: ",".join(ENV_URLS)})
    assert isinstance(result.exception, Reached), (result.exit_code, result.output)
    assert result.exception.urls == (URL,)  # the command line wins over the variable
    note = f"{old} is deprecated and goes in the next release: use --cluster URL"
    assert note in result.stderr
    assert old not in COMMANDS[name].get_help(click.Context(COMMANDS[name]))


def test_the_new_names_print_no_note(probe: None) -> None:
    result = invoke("produce", ["q", "k", "v", "--cluster", URL], {CLUSTER_ENV: None})
    assert isinstance(result.exception, Reached)
    assert result.stderr == ""


def shared_names() -> dict[str, list[tuple[str, click.Option]]]:
    """Each option name (either form of a switch) and the commands that use it, old names
    left out."""
    uses: dict[str, list[tuple[str, click.Option]]] = defaultdict(list)
    for name, command in COMMANDS.items():
        for option in options_of(command):
            if isinstance(option, DeprecatedOption):
                continue
            for flag in (*option.opts, *option.secondary_opts):
                if flag.startswith("--"):
                    uses[flag].append((name, option))
    return {flag: found for flag, found in uses.items() if len(found) > 1}


@pytest.mark.parametrize("flag", sorted(shared_names()))
def test_an_option_name_means_one_thing_in_every_command(flag: str) -> None:
    uses = shared_names()[flag]
    assert flag in MEANINGS, (
        f"{flag} is used by {', '.join(n for n, _ in uses)}: say in MEANINGS what it means"
    )
    shapes = {(name, kind(option), option.multiple) for name, option in uses}
    assert len({shape[1:] for shape in shapes}) == 1, f"{flag} takes different values: {shapes}"
    _, pattern = MEANINGS[flag]
    for name, option in uses:
        assert re.search(pattern, option.help or "", re.IGNORECASE), (
            f"{name} {flag}: {option.help!r} does not say {MEANINGS[flag][0]!r}"
        )


def test_seed_is_an_integer_and_wait_a_switch_everywhere() -> None:
    shared = shared_names()
    assert {kind(option) for _, option in shared["--seed"]} == {"integer"}
    assert {kind(option) for _, option in shared["--wait"]} == {"switch"}
    assert {kind(option) for _, option in shared["--cluster"]} == {"text"}
