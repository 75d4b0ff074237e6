"""A local stand-in for Databricks' `dbutils` (widgets, secrets, notebook.exit) and a runner that executes a Databricks
notebook source file cell by cell, the way a job runs it. A test double for an object that exists only on
Databricks; everything the notebook calls besides it (Spark, storage, the library) is real.

    dbutils = DbutilsStandIn(parameters={"input": ...}, secrets={("scope", "key"): "value"})
    result = run_notebook_source(path, spark=spark, dbutils=dbutils)   # the value given to dbutils.notebook.exit
"""

from __future__ import annotations

from pathlib import Path

HEADER = "# Databricks notebook source"
CELL_SEPARATOR = "\n# COMMAND ----------\n"


class NotebookExit(Exception):
    """Raised by dbutils.notebook.exit(value): Databricks ends the notebook there and returns `value`."""

    def __init__(self, value: str):
        super().__init__(value)
        self.value = value


class _Widgets:
    """Widgets as a job sees them: a parameter (base_parameters) wins over the widget's default; reading a widget
    that was never defined fails, like on Databricks."""

    def __init__(self, parameters: dict[str, str]):
        self._parameters = dict(parameters)
        self._defaults: dict[str, str] = {}

    def text(self, name: str, defaultValue: str, label: str | None = None) -> None:  # noqa: N803 (Databricks' names)
        self._defaults[name] = str(defaultValue)

    def dropdown(self, name: str, defaultValue: str, choices: list[str], label: str | None = None) -> None:  # noqa: N803
        if defaultValue not in choices:
            raise ValueError(f"dropdown widget {name!r}: default {defaultValue!r} is not one of {choices}")
        value = self._parameters.get(name, defaultValue)
        if value not in choices:
            raise ValueError(f"widget {name!r}: value {value!r} is not one of {choices}")
        self._defaults[name] = str(defaultValue)

    combobox = text

    def get(self, name: str) -> str:
        if name not in self._defaults:
            raise ValueError(f"InputWidgetNotDefined: no widget named {name!r}")
        return str(self._parameters.get(name, self._defaults[name]))

    def getArgument(self, name: str, default: str | None = None) -> str | None:  # noqa: N802
        return self.get(name) if name in self._defaults else default

    def removeAll(self) -> None:  # noqa: N802
        self._defaults.clear()


class _Secrets:
    def __init__(self, secrets: dict[tuple[str, str], str]):
        self._secrets = dict(secrets)

    def get(self, scope: str, key: str) -> str:
        if not any(s == scope for s, _ in self._secrets):
            raise ValueError(f"Secret scope {scope!r} does not exist")
        if (scope, key) not in self._secrets:
            raise ValueError(f"Secret does not exist with scope: {scope} and key: {key}")
        return self._secrets[(scope, key)]

    def list(self, scope: str) -> list[str]:
        return sorted(key for s, key in self._secrets if s == scope)

    def listScopes(self) -> list[str]:  # noqa: N802
        return sorted({scope for scope, _ in self._secrets})


class _Notebook:
    def exit(self, value: str) -> None:
        raise NotebookExit(value)


class DbutilsStandIn:
    """`dbutils.widgets`, `dbutils.secrets` and `dbutils.notebook.exit` for running notebooks locally."""

    def __init__(self, parameters: dict[str, str] | None = None, secrets: dict[tuple[str, str], str] | None = None):
        self.widgets = _Widgets(parameters or {})
        self.secrets = _Secrets(secrets or {})
        self.notebook = _Notebook()


def notebook_cells(path: str | Path) -> list[str]:
    """The code cells of a Databricks notebook source file (markdown-only cells are comments and kept as they are)."""
    text = Path(path).read_text(encoding="utf-8")
    if not text.startswith(HEADER):
        raise ValueError(f"{path}: not a Databricks notebook source file (first line must be {HEADER!r})")
    return [cell for cell in text[len(HEADER) :].split(CELL_SEPARATOR) if cell.strip()]


def run_notebook_source(path: str | Path, **notebook_globals) -> str | None:
    """Execute the notebook's cells in order in one namespace holding `notebook_globals` (spark, dbutils, ...).
    Returns the value passed to dbutils.notebook.exit, or None when the notebook ran to its end. An exception in a
    cell propagates, with the cell number added to the traceback's frame names."""
    namespace = {"__name__": "__main__", **notebook_globals}
    for number, cell in enumerate(notebook_cells(path), start=1):
        code = compile(cell, f"{path}#cell{number}", "exec")
        try:
            exec(code, namespace)  # noqa: S102 - running the notebook is the point
        except NotebookExit as done:
            return done.value
    return None
