"""The house, floor by floor: no import runs back up, and no import cycles.

Floors (lowest first): shared ground (errors, limits, clock); storage, topology, the pure chain
and frame logic and the manager's decision core; replication over storage; the node and the
client and the manager's Raft member; the faces (CLI, benchmarks, the local cluster,
kestrel_compat, chaos), which reach the cluster through the client or the node's public API,
never through storage internals. The product does not import the chaos harness.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.layout import REPO_ROOT

pytestmark = pytest.mark.unit

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
            "kayos.tlsconfig",
        ),
    ),
    (
        1,
        (
            "kayos.storage",
            "kayos.topology",
            "kayos.identity",
            "kayos.signing",
            "kayos.auth",
            "kayos.replication.wire",
            "kayos.replication.logic",
            "kayos.manager",
        ),
    ),
    (2, ("kayos.replication",)),
    (3, ("kayos.node", "kayos.client", "kayos.embedded", "kayos.manager.member")),
    (
        4,
        (
            "kayos.cli",
            "kayos.bench",
            "kayos.local",
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
    # Client identities (docs/security.md): the command line edits the credentials table, the
    # launcher and the campaigns prove the cluster's own principal.
    "kayos.auth.keys",
    "kayos.auth.table",
    "kayos.auth.proof",
)
# The simulator (chaos/sim/) drives the pure chain and manager decisions themselves, which is its
# point: it may import those pure floor-1 modules, and nothing else below the client.
SIM_ALLOWED_LOW = ("kayos.replication.logic.chain", "kayos.manager")
# The Kestrel front's rooms inside its floor, lowest first: its bounds and the eager runner; the
# pure queue core; the codecs and the backends side by side (neither imports the other); the
# sessions and the journal import; the server and the command line on top. A module imports its
# own room or lower ones only.
KESTREL_ROOMS: list[tuple[int, tuple[str, ...]]] = [
    (0, ("kestrel_compat.limits", "kestrel_compat.eager")),
    (1, ("kestrel_compat.core",)),
    (2, ("kestrel_compat.wire",)),
    (2, ("kestrel_compat.backends",)),
    (3, ("kestrel_compat.sessions",)),
    (3, ("kestrel_compat.migration",)),
    (4, ("kestrel_compat.server", "kestrel_compat.cli", "kestrel_compat.__main__")),
]
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


def imported_names(node: ast.AST) -> list[str]:
    """The modules an import statement names (``import a.b`` -> a.b; ``from a import b`` -> a);
    none for any other node."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module:
        return [node.module]
    return []


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
            allowed = allowed or target in ("kayos.replication.wire.frames",)
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
                    "kayos.replication.link",
                    "kayos.replication.shard",
                )
            )


# A node's faces: they call into kayos.node.runtime.Node, and only the process entry point
# (kayos.node.server) and Node itself (which starts its binary port) import them.
NODE_FACES = ("kayos.node.http", "kayos.node.binary_port")
NODE_FACE_IMPORTERS = ("kayos.node.server", "kayos.node.runtime")


def test_a_nodes_operations_know_nothing_of_its_faces() -> None:
    for path in (ROOT / "kayos" / "node").rglob("*.py"):
        module = module_name(path)
        if module.startswith(NODE_FACES) or module in NODE_FACE_IMPORTERS:
            continue
        for target in imports_of(path):
            assert not target.startswith(NODE_FACES), f"{module} imports the face {target}"
    runtime = imports_of(ROOT / "kayos" / "node" / "runtime.py")
    assert not any(target.startswith("kayos.node.http") for target in runtime)


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
                if any(name.split(".")[0] == "pysyncobj" for name in imported_names(node)):
                    assert module_name(path) == "kayos.manager.member.raft", path


def test_the_manager_core_is_pure() -> None:
    """kayos/manager/ (all but its Raft member, kayos/manager/member/) decides from its view
    alone: ground modules, the topology's checks and the chain's takeover rule; no storage, no
    I/O, no clock, no randomness."""
    allowed_kayos = (
        "kayos.errors",
        "kayos.limits",
        "kayos.topology",
        "kayos.replication.logic.chain",
    )
    io_modules = ("asyncio", "socket", "os", "time", "random", "secrets", "threading", "pysyncobj")
    manager = ROOT / "kayos" / "manager"
    core = sorted(p for p in manager.rglob("*.py") if p.relative_to(manager).parts[0] != "member")
    assert core, "the manager's core moved: point this test at it"
    for path in core:
        for target in imports_of(path):
            assert target.startswith("kayos.manager") or target in allowed_kayos, (path, target)
            assert not target.startswith("kayos.manager.member"), (path, target)
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            for name in imported_names(node):
                assert name.split(".")[0] not in io_modules, (path, name)


def kestrel_room_of(module: str) -> tuple[int, int]:
    """(floor, room index) of a kestrel_compat module; the package itself is ground."""
    if module == "kestrel_compat":
        return 0, -1
    for index, (floor, prefixes) in enumerate(KESTREL_ROOMS):
        if any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes):
            return floor, index
    raise AssertionError(f"{module} has no room: add it to KESTREL_ROOMS")


KESTREL_SOURCES = [path for path in SOURCES if module_name(path).split(".")[0] == "kestrel_compat"]


@pytest.mark.parametrize("path", KESTREL_SOURCES, ids=lambda p: module_name(p))
def test_kestrel_rooms_import_only_their_own_or_lower_ones(path: Path) -> None:
    module = module_name(path)
    floor, room = kestrel_room_of(module)
    for target in sorted(imports_of(path)):
        if target.split(".")[0] != "kestrel_compat":
            continue
        target_floor, target_room = kestrel_room_of(target)
        assert target_room == room or target_floor < floor, (
            f"{module} (room floor {floor}) imports {target} (room floor {target_floor})"
        )


def test_the_kestrel_core_and_codecs_do_no_io() -> None:
    """kestrel_compat/core/ (the queue semantics) and kestrel_compat/wire/ (the sans-IO codecs)
    import the kayos ground floor, kestrel_compat.limits and the core only: no codec in the core,
    no sockets, event loop or threads in either."""
    io_modules = ("asyncio", "socket", "selectors", "ssl", "threading", "subprocess")
    for room in ("core", "wire"):
        for path in (ROOT / "kestrel_compat" / room).rglob("*.py"):
            for target in imports_of(path):
                allowed = target.startswith(("kestrel_compat.core", "kestrel_compat.limits"))
                allowed = allowed or (room == "wire" and target.startswith("kestrel_compat.wire"))
                allowed = allowed or (target.split(".")[0] == "kayos" and floor_of(target) == 0)
                assert allowed, (path, target)
            for name in modules_imported_by(path):
                assert name.split(".")[0] not in io_modules, (path, name)


def modules_imported_by(path: Path) -> list[str]:
    """Every module ``path`` imports, whatever its package (``from x import y`` counts as x)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def _chaos_imports(tree: ast.AST) -> list[ast.AST]:
    return [
        node
        for node in ast.walk(tree)
        if any(name.split(".")[0] == "chaos" for name in imported_names(node))
    ]


def test_the_product_loads_the_chaos_harness_in_one_function_only() -> None:
    """``kayos chaos`` is the test harness's command: the product imports chaos/ nowhere but in
    ``kayos.cli.main.load_chaos``, which runs when that command is asked for."""
    for path in sorted((ROOT / "kayos").rglob("*.py")):
        tree = ast.parse(path.read_text())
        found = _chaos_imports(tree)
        if module_name(path) != "kayos.cli.main":
            assert not found, (path, [ast.unparse(node) for node in found])
            continue
        loader = next(
            node
            for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name == "load_chaos"
        )
        assert found, "kayos.cli.main.load_chaos no longer imports chaos.cli"
        assert all(node in _chaos_imports(loader) for node in found), [
            ast.unparse(node) for node in found
        ]
