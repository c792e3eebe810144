"""House rules the layering test does not cover: no module uses another module's ``_private``
name, the product never imports the test harness, and the rooms stay small.

A name that starts with one underscore belongs to its file. A name several files share is part of
a module's interface and says so by being public. The product (``kayos/``, ``kestrel_compat/``)
never imports ``chaos`` or ``tests``, so an installed Kayos runs without its test tree; the one
door is ``kayos.cli.main.load_chaos``, which loads the ``chaos`` command group when that
command is asked for (tests/unit/house/test_layering.py checks that it is the only one).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.layout import REPO_ROOT

pytestmark = pytest.mark.unit

ROOT = REPO_ROOT
OWN = ("kayos", "kestrel_compat", "chaos", "tests")
PRODUCT = ("kayos", "kestrel_compat")
# namedtuple's public API is spelt with one underscore.
NAMEDTUPLE_API = {"_fields", "_replace", "_asdict", "_make", "_field_defaults"}
# Where the product may name the harness: the CLI's lazy registration of `kayos chaos`.
HARNESS_DOORS = {"kayos/cli/main.py": {"chaos.cli"}}
# A folder past this many modules becomes packages (CONTRIBUTING.md, "Rooms").
FOLDER_MODULES_MAX = 12
# A function past this many lines splits along a seam.
FUNCTION_LINES_MAX = 80
# A module past this many lines splits, or says why not in its opening docstring.
MODULE_LINES_MAX = 600


def sources(*packages: str) -> list[Path]:
    return sorted(
        path
        for package in packages
        for path in (ROOT / package).rglob("*.py")
        if ".venv" not in path.parts
    )


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def private_uses(path: Path) -> Iterator[str]:
    """Every ``from own.module import _name`` and ``own_module._name`` in ``path``."""
    tree = ast.parse(path.read_text())
    modules: dict[str, str] = {}  # local name -> the own module (or class) it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in OWN:
                continue
            for alias in node.names:
                if is_private(alias.name):
                    yield f"from {node.module} import {alias.name}"
                else:
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OWN:
                    modules[alias.asname or alias.name.split(".")[0]] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and is_private(node.attr)
            and node.attr not in NAMEDTUPLE_API
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
        ):
            yield f"{modules[node.value.id]}.{node.attr}"
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            # mock.patch("kayos.x._y") reaches a private name by string.
            head, _, last = node.value.rpartition(".")
            if head.split(".")[0] in OWN and is_private(last) and " " not in node.value:
                yield node.value


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@pytest.mark.parametrize("path", sources(*OWN), ids=rel)
def test_no_file_uses_another_files_private_name(path: Path) -> None:
    found = sorted(set(private_uses(path)))
    assert not found, f"{rel(path)} uses private names of other modules: {found}"


def test_a_private_name_imported_across_files_is_found(tmp_path: Path) -> None:
    """The check itself: each way of reaching a private name is caught, public ones are not."""
    hidden = "_hidden"  # spelt apart so that this file does not trip its own check
    probe = tmp_path / "probe.py"
    probe.write_text(
        f"from kayos.probe_a import {hidden}\n"
        "from kayos import limits\n"
        "import kayos.probe_b as probe_b\n"
        f"x = probe_b.{hidden}\n"
        "y = limits.head_lease_ms\n"
        f"z = 'kayos.probe_c.{hidden}'\n"
        "w = limits.Entry._fields\n"
        "v = probe_b.Entry._fields\n"
    )
    assert sorted(private_uses(probe)) == [
        f"from kayos.probe_a import {hidden}",
        f"kayos.probe_b.{hidden}",
        f"kayos.probe_c.{hidden}",
    ]


def harness_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return {name for name in found if name.split(".")[0] in ("chaos", "tests")}


@pytest.mark.parametrize("path", sources(*PRODUCT), ids=rel)
def test_the_product_never_imports_the_harness(path: Path) -> None:
    found = harness_imports(path) - HARNESS_DOORS.get(rel(path), set())
    assert not found, f"{rel(path)} imports the test harness: {sorted(found)}"


def folders() -> list[Path]:
    return sorted({path.parent for path in sources("kayos", "kestrel_compat", "chaos", "tests")})


@pytest.mark.parametrize("folder", folders(), ids=rel)
def test_no_folder_is_a_flat_crowd(folder: Path) -> None:
    skip = ("__init__.py", "conftest.py")
    modules = [path for path in folder.glob("*.py") if path.name not in skip]
    assert len(modules) <= FOLDER_MODULES_MAX, (
        f"{rel(folder)} holds {len(modules)} modules: split it into packages"
    )


@pytest.mark.parametrize("path", sources(*PRODUCT, "chaos"), ids=rel)
def test_no_function_is_past_the_bound(path: Path) -> None:
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > FUNCTION_LINES_MAX
    ]
    assert not long, f"{rel(path)}: split {long}"


@pytest.mark.parametrize("path", sources(*PRODUCT, "chaos"), ids=rel)
def test_a_long_module_says_why(path: Path) -> None:
    text = path.read_text()
    if text.count("\n") <= MODULE_LINES_MAX:
        return
    docstring = ast.get_docstring(ast.parse(text)) or ""
    assert "Why it is long:" in docstring, (
        f"{rel(path)} has {text.count(chr(10))} lines: split it along a seam, or give its opening "
        "docstring a 'Why it is long:' paragraph"
    )
