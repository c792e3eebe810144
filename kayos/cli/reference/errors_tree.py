"""The exception tree of kayos/errors.py as a nested Markdown list, for the Python API page: each
class with its stable ``code`` and the first line of its docstring, linked to its entry."""

from __future__ import annotations

import inspect

from kayos import errors


def classes() -> list[type[errors.KayosError]]:
    """Every exception class kayos/errors.py defines, in the file's order."""
    found = [
        value
        for value in vars(errors).values()
        if inspect.isclass(value)
        and issubclass(value, errors.KayosError)
        and value.__module__ == errors.__name__
    ]
    return sorted(found, key=lambda cls: inspect.getsourcelines(cls)[1])


def render() -> str:
    defined = classes()
    lines: list[str] = []

    def visit(cls: type[errors.KayosError], depth: int) -> None:
        summary = (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
        summary = summary.replace("``", "`")
        lines.append(
            f"{'    ' * depth}- [`{cls.__name__}`][kayos.errors.{cls.__name__}] "
            f"(`{cls.code}`): {summary}"
        )
        for child in defined:
            if child.__bases__[0] is cls:
                visit(child, depth + 1)

    visit(errors.KayosError, 0)
    return "\n".join(lines)
