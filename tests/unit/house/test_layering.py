"""The house, floor by floor: no import runs back up, and no import cycles.

Floors (lowest first): shared ground (errors, limits, clock); storage, topology, the pure chain
and frame logic and the manager's decision core; replication over storage; the node and the
client; the faces (CLI, benchmarks, launcher, kestrel_compat, chaos), which reach the cluster
through the client or the node's public API, never through storage internals.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
PACKAGES = ("kayos", "kestrel_compat", "chaos")

FLOORS: list[tuple[int, tuple[str, ...]]] = [
    (
        0,
        (
            "kayos.errors",
            "kayos.limits",
            "kayos.clock",
            "kayos.checks",
            "kayos.datadir",
            "kayos.ports",
        ),
    ),
    (
        1,
        (
            "kayos.storage",
            "kayos.topology",
            "kayos.identity",
            "kayos.signing",
            "kayos.replication.frames",
            "kayos.replication.frame_table",
            "kayos.replication.frame_fields",
            "kayos.replication.chain",
            "kayos.manager",
        ),
    ),
    (2, ("kayos.replication",)),
    (3, ("kayos.node", "kayos.client", "kayos.embedded", "kayos.control")),
    (
        4,
        (
            "kayos.cli",
            "kayos.bench",
            "kayos.launcher",
            "kayos.supervisor",
            "kayos.manager_process",
            "kayos.kestrel_process",
            "kayos.__main__",
        ),
    ),
    (4, ("kayos.spark",)),
    (4, ("kestrel_compat",)),
    (4, ("chaos",)),
]
# What a face may import from below the client floor: the store's public package (the storage
# benchmark and `kayos check` work on a store directly) and the node's entry point.
FACE_ALLOWED_LOW = (
    "kayos.storage",
    "kayos.storage.maintenance.check",
    "kayos.node.server",
    "kayos.topology",
    "kayos.identity",
    "kayos.signing",
)
# The simulator (chaos/sim/) drives the pure chain and manager decisions themselves, which is its
# point: it may import those pure floor-1 modules, and nothing else below the client.
SIM_ALLOWED_LOW = ("kayos.replication.chain", "kayos.manager")
# Names `kayos/__init__.py` exports lazily from the client floor.
LAZY_CLIENT_EXPORTS = {"Client", "AsyncClient", "open_queue", "Page", "Item", "Message"}


def floor_of(module: str) -> int:
    best = (-1, -1)
    for floor, prefixes in FLOORS:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best[1]:
                best = (floor, len(prefix))
    if best[0] < 0:
        raise AssertionError(f"{module} has no floor: add it to FLOORS")
    return best[0]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(name: str) -> bool:
    path = ROOT / Path(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imports_of(path: Path) -> set[str]:
    """Every kayos/kestrel_compat module ``path`` imports, at module level or inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                if is_module(candidate):
                    found.add(candidate)
                elif node.module == "kayos" and alias.name in LAZY_CLIENT_EXPORTS:
                    found.add("kayos.client")
                else:
                    found.add(node.module)
    return {name for name in found if name.split(".")[0] in PACKAGES and name != "kayos"}


SOURCES = sorted(
    path
    for package in PACKAGES
    for path in (ROOT / package).rglob("*.py")
    if module_name(path) != "kayos"  # the package root only re-exports, lazily
)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: module_name(p))
def test_no_import_runs_back_up(path: Path) -> None:
    module = module_name(path)
    own = floor_of(module)
    for target in sorted(imports_of(path)):
        if target.split(".")[0] == module.split(".")[0] and floor_of(target) == own:
            continue
        assert floor_of(target) <= own, f"{module} (floor {own}) imports {target} from above"
        if own == 4 and floor_of(target) < 3:
            allowed = target in FACE_ALLOWED_LOW or floor_of(target) == 0
            allowed = allowed or target in ("kayos.replication.frames",)
            if module.startswith("chaos.sim"):
                allowed = allowed or target.startswith(SIM_ALLOWED_LOW)
            assert allowed, f"face {module} reaches below the client: {target}"


def test_the_client_knows_nothing_of_nodes_or_storage() -> None:
    for path in (ROOT / "kayos" / "client").rglob("*.py"):
        for target in imports_of(path):
            assert not target.startswith(
                (
                    "kayos.node",
                    "kayos.storage",
                    "kayos.replication.r",
                    "kayos.replication.upstream",
                    "kayos.replication.downstream",
                )
            )


def test_no_import_cycles() -> None:
    graph = {module_name(path): imports_of(path) for path in SOURCES}
    visiting: list[str] = []
    done: set[str] = set()

    def visit(module: str) -> None:
        if module in done or module not in graph:
            return
        assert module not in visiting, " -> ".join([*visiting, module])
        visiting.append(module)
        for target in sorted(graph[module]):
            # A package's __init__ importing its own submodules is not a cycle.
            if target.startswith(module + "."):
                continue
            visit(target)
        visiting.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


def test_only_the_raft_adapter_imports_pysyncobj() -> None:
    """pysyncobj pickles what it replicates and runs its own threads: one module wraps it."""
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                if any(name.split(".")[0] == "pysyncobj" for name in names):
                    assert module_name(path) == "kayos.control.raft", path


def test_the_manager_core_is_pure() -> None:
    """kayos/manager/ decides from its view alone: ground modules, the topology's checks and the
    chain's takeover rule; no storage, no I/O, no clock, no randomness."""
    allowed_kayos = ("kayos.errors", "kayos.limits", "kayos.topology", "kayos.replication.chain")
    io_modules = ("asyncio", "socket", "os", "time", "random", "secrets", "threading", "pysyncobj")
    for path in (ROOT / "kayos" / "manager").rglob("*.py"):
        for target in imports_of(path):
            assert target.startswith("kayos.manager") or target in allowed_kayos, (path, target)
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in io_modules, (path, name)
