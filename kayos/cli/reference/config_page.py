"""The Configuration reference: the keys of the files Kayos reads, with their defaults, then every
bound of kayos/limits.py and kestrel_compat/limits.py (``limits_page``).

Two files configure Kayos:

- the topology file (``cluster.toml``; ``kayos up`` and ``kayos init`` write it): read by every
  node (``kayos node --topology``), manager member (``kayos manager``) and client
  (``--cluster FILE``), parsed by ``Topology.from_json`` (kayos/topology.py), ``parse_members``
  and ``parse_config`` (kayos/manager/member/config.py);
- the Kestrel front's file (``kayos kestrel --config FILE``), parsed by
  kestrel_compat/core/config.py.

The topology keys are listed here by hand (``TOPOLOGY_KEYS``), since the parser has no table of
them; a unit test writes a topology with every feature and checks each key it holds is listed.
The ``[manager]`` keys and the Kestrel front's keys come from their dataclasses' fields.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any

from kayos.cli.reference import limits_page
from kayos.cli.reference.limits_page import comment_above
from kayos.cli.reference.markdown import GENERATED_NOTE, code, table
from kayos.manager.member.config import Config
from kestrel_compat.core.config import QueueConfig, ServerConfig

# (key, default, meaning) of the topology file, outside the [manager] table. A key path uses
# "<id>" and "<name>" for the names a table is keyed by.
TOPOLOGY_KEYS: list[tuple[str, str, str]] = [
    (
        "epoch",
        "required",
        "The topology's version: a node adopts a topology only with a higher "
        "epoch. `kayos up` and `kayos init` write 1.",
    ),
    (
        "cluster_id",
        "none",
        "The cluster's id; goes with `secret`. Recorded in each data "
        "directory: a node never joins another cluster's chains with its data.",
    ),
    (
        "secret",
        "none",
        "The cluster secret (hex) that authenticates replication links and signs "
        "operator messages; the all-zero placeholder is refused. `kayos init` writes both keys.",
    ),
    (
        "queue_shards",
        "1",
        "The number of shards every queue is spread over, 1 to the number of "
        'shards (docs/node-api.md, "Queues over several shards").',
    ),
    ('nodes."<id>".host', "required", "The host the node's ports listen on and peers reach."),
    (
        'nodes."<id>".http_port',
        "required",
        "The node's HTTP port (clients, operators, the manager, /metrics).",
    ),
    (
        'nodes."<id>".bin_port',
        "required",
        "The node's binary port (replication links and the binary client protocol).",
    ),
    ("shards[].id", "required", "The shard's number."),
    (
        "shards[].chain",
        "required",
        "The shard's chain, head first (a one-node chain is head and tail at once).",
    ),
    ("shards[].fanout", "[]", "Extra tails fed by the chain's last member (not with a manager)."),
    (
        'queues."<name>".shards',
        "queue_shards",
        "The shard count of one queue; wins over `queue_shards`.",
    ),
    (
        'managers."<id>".host',
        "none",
        "Where the manager member's two ports listen; a file "
        "without `[managers]` tables runs without a manager.",
    ),
    (
        'managers."<id>".raft_port',
        "required with the member",
        "The member's Raft port (members only).",
    ),
    (
        'managers."<id>".http_port',
        "required with the member",
        "The member's HTTP face (`kayos ctl`, nodes' reports).",
    ),
]

# "- ``a``: text" and "- ``a`` / ``b``: text" bullets of a docstring.
BULLET = re.compile(r"^- ((?:``\w+``(?: / )?)+): (.*)$")


def bullets(doc: str) -> dict[str, str]:
    """The meaning of each field a class docstring's bullets name."""
    meanings: dict[str, str] = {}
    current: list[str] = []
    for raw in inspect.cleandoc(doc).splitlines():
        match = BULLET.match(raw.strip())
        if match:
            current = re.findall(r"``(\w+)``", match.group(1))
            for name in current:
                meanings[name] = match.group(2)
        elif current and raw.startswith(" ") and raw.strip():
            for name in current:
                meanings[name] += " " + raw.strip()
        else:
            current = []
    return {name: text.replace("``", "`") for name, text in meanings.items()}


def field_comments(cls: type) -> dict[str, str]:
    """The comment above each field of a dataclass, from its source."""
    lines = inspect.getsource(cls).splitlines()
    found: dict[str, str] = {}
    for number, line in enumerate(lines, start=1):
        match = re.match(r"\s+(\w+):", line)
        if match:
            found[match.group(1)] = " ".join(comment_above(lines, number)).replace("``", "`")
    return found


def toml_value(value: Any) -> str:
    """A default as it would be written in TOML (None: the key absent)."""
    if value is None:
        return "absent"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if hasattr(value, "name"):  # an enum
        return f'"{str(value.name).lower()}"'
    return f"{value:,}" if isinstance(value, int) else repr(value)


def default_of(item: dataclasses.Field[Any]) -> Any:
    if item.default is not dataclasses.MISSING:
        return item.default
    assert item.default_factory is not dataclasses.MISSING, item.name
    return item.default_factory()


def manager_rows() -> list[list[str]]:
    meanings = bullets(Config.__doc__ or "")
    return [
        [code(f"manager.{item.name}"), toml_value(default_of(item)), meanings.get(item.name, "")]
        for item in dataclasses.fields(Config)
    ]


def kestrel_rows(cls: type, prefix: str) -> list[list[str]]:
    comments = field_comments(cls)
    return [
        [code(f"{prefix}.{item.name}"), toml_value(default_of(item)), comments.get(item.name, "")]
        for item in dataclasses.fields(cls)
    ]


def render() -> str:
    topology = [[code(key), default, meaning] for key, default, meaning in TOPOLOGY_KEYS]
    parts = [
        "# Configuration",
        f"*{GENERATED_NOTE}*",
        "Kayos reads two configuration files: the **topology file** (`cluster.toml`) that every "
        "node, manager member and client reads, and the **Kestrel front's file** "
        "(`kayos kestrel --config FILE`). Everything else is a command-line option "
        "([CLI reference](cli.md)) or a fixed bound (below). Configuration may lower a per-item "
        "bound, never raise it; the storage bounds are part of the on-disk format.",
        "## The topology file",
        "`kayos up` and `kayos init` write it (mode 0600: it holds the cluster secret); give every "
        "node and member the same file. TOML, or JSON when the name ends in `.json`. Parsed by "
        "`Topology.from_json` (kayos/topology.py) and, for the manager's tables, by "
        "kayos/manager/member/config.py; an unknown key in `[managers]` or `[manager]` is "
        "refused. The file explained with an example: "
        '[HTTP API, "Topology file"](../node-api.md#topology-file).',
        table(["key", "default", "meaning"], topology),
        "### `[manager]`: the manager's decision bounds",
        "Optional; read by manager members only. Defaults from kayos/limits.py "
        "(`manager_*`, below); `Config.validate` refuses bounds that cannot work together.",
        table(["key", "default", "meaning"], manager_rows()),
        "## The Kestrel front's file",
        "TOML, read by `kayos kestrel --config FILE` (kestrel_compat/core/config.py); unknown "
        "tables and keys are errors. `[server]` is read at start only; `reload` re-reads "
        "`[default]`, `[queues]` and `[aliases]`. A queue's settings are inherited as in "
        'Kestrel 2.3.4: built-in defaults, then `[default]`, then `[queues."<name>"]` (a '
        "fanout queue `m+c` inherits from `m`). What each queue setting does: "
        "[Kestrel compatibility, section 9](../kestrel-compat.md#9-queue-semantics-3-5-8-9).",
        "### `[server]`",
        table(["key", "default", "meaning"], kestrel_rows(ServerConfig, "server")),
        '### `[default]` and `[queues."<name>"]`',
        "The same keys in both; `[default]` overrides the built-in defaults shown here.",
        table(["key", "default", "meaning"], kestrel_rows(QueueConfig, 'queues."<name>"')),
        '### `[aliases."<name>"]`',
        table(
            ["key", "default", "meaning"],
            [[code("destination_queues"), "[]", "The queues a `set` to the alias writes to."]],
        ),
        "## Bounds (kayos/limits.py)",
        "Every bound Kayos keeps, with the reason for its value; code reads `limits.<name>`, "
        'never a literal (CONTRIBUTING.md, "Adding a limit"). The unit is the last word of the '
        "name before its kind (`_max`, `_min`, `_default`, `_target`).",
        limits_page.render("kayos.limits", "###"),
        "## Kestrel front bounds (kestrel_compat/limits.py)",
        "The front's own bounds, which only narrow those above.",
        limits_page.render("kestrel_compat.limits", "###"),
    ]
    return "\n\n".join(parts) + "\n"
