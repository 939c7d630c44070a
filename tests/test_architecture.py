"""Layers import downward only (docs/ARCHITECTURE.md): every ``perfsight`` import of every module
is read with ``ast`` and checked against the rule, so an upward import fails naming the file, the
line and the two layers.

The rule: ``collect``, ``ingest`` -> ``model``; ``analysis`` -> ``model``; ``export``, ``store`` ->
``analysis``, ``model``; the single-rank driver (``pipeline``, ``api``, ``summary``) -> the layers
under it; ``cluster`` -> the single-rank layers; ``server``, ``commands``, ``cli`` on top.  Every
layer may use the leaf modules (``base``), which import nothing of perfsight.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "perfsight"

LEAF = ("base",)
SINGLE_RANK = ("ingest", "analysis", "export", "store", "advisor", "model", *LEAF)
ALLOWED: dict[str, tuple[str, ...]] = {
    "base": (),
    "model": LEAF,
    "collect": ("model", *LEAF),
    "ingest": ("model", *LEAF),
    "analysis": ("model", *LEAF),
    "export": ("analysis", "model", *LEAF),
    "store": ("analysis", "model", *LEAF),
    "advisor": ("analysis", "model", *LEAF),
    "rank": SINGLE_RANK,
    "cluster": ("rank", *SINGLE_RANK),
    "top": ("top", "cluster", "rank", "collect", *SINGLE_RANK),
}
"""Layer -> the other layers its modules may import (a layer may always import itself)."""

TOP_LEVEL = {
    "columns": "base",  # Arrow columns as NumPy
    "jsontext": "base",  # JSON text of Arrow columns
    "units": "base",  # ns/bytes -> the units of files and summaries
    "heap": "base",  # where freed memory goes
    "write_behind": "base",  # big output files kept out of the page cache
    "arrow_pool": "base",  # Arrow's C++ allocator, chosen before pyarrow's import
    "intervals": "base",  # interval arithmetic on ns arrays
    "terminal": "base",  # one printable line of text
    "layout": "base",  # names of the files perfsight writes (run folder, cache)
    "model": "model",
    "model_chunks": "model",  # a trace cut into chunks of whole steps (the bounded path's unit)
    "sorted_runs": "base",  # a table spilled as sorted runs, merged back in order
    "parquet_files": "base",  # the one set of Parquet writer options (cache and spills)
    "memory_budget": "base",  # a memory limit as a chunk size
    "pipeline": "rank",  # one rank: read or take from the cache, analyse, write
    "pipeline_bounded": "rank",  # one rank within a memory limit, chunk by chunk
    "chunked_analysis": "rank",  # the analyses of ANALYSES chunk by chunk, merged
    "chunked_spills": "rank",  # the chunked analysis' spills and exact merges of partials
    "chunked_timeline": "rank",  # what it carries on one clock and for the rank rules
    "chunked_rows": "rank",  # its per-row tables with state across chunks (allocations, comm)
    "api": "rank",  # perfsight.analyse / perfsight.load
    "summary": "rank",  # the printed and --json summary of one rank
    "cli": "top",
}
PACKAGES = {
    "engine": "base",  # executors: run callables, know nothing of traces
    "collect": "collect",
    "ingest": "ingest",
    "analysis": "analysis",
    "export": "export",
    "store": "store",
    "advisor": "advisor",  # rules over the analysis tables (a job's through the cluster result's tables)
    "cluster": "cluster",
    "compare": "cluster",  # run-vs-run diff: reads two runs' single-rank analysis tables
    "server": "top",
    "commands": "top",
}
MODULES = {
    # a program, not a library: the trace handler runs ``python -m perfsight.collect.offline`` as a
    # separate process that analyses a finished window (``perfsight.api.analyse``)
    "perfsight.collect.offline": "top",
    # writers of cluster_analysis_output/ from a cluster result: they sit beside the other writers
    # for the catalogue of output files, but belong to the cluster layer
    "perfsight.export.cluster_csv": "cluster",
    "perfsight.export.communication_matrix_json": "cluster",
    # the writers of one rank fed chunk by chunk: they drive the export and store writers (and
    # advisor.json) as pipeline.analyse_and_write does for the whole trace, in the driver's layer
    "perfsight.export.chunked_outputs": "rank",
    "perfsight.export.spilled_trace": "rank",
}
"""Modules whose layer is not their package's, each with the reason."""

UPWARD_BY_DESIGN = {
    # the seed's tensorboard_trace_handler analyses a window in the training process when
    # async_mode=False: the one place collection calls analysis, and only when asked
    ("perfsight.collect.handlers", "perfsight.collect.offline"),
    # the native library is one build, shared by the reader (scan) and the trace-view writer
    # (gather); it lives beside the reader that builds it
    ("perfsight.export.text", "perfsight.ingest.eventscan"),
}
"""Single imports that go up on purpose, each with the reason (keep this short)."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    """The layer of a module; a module nobody placed is an error naming it."""
    if module in MODULES:
        return MODULES[module]
    parts = module.split(".")
    if len(parts) == 1:
        return "top"  # the package root: its version and lazily re-exported public names
    name = parts[1]
    layer = PACKAGES.get(name) if (PACKAGE / name).is_dir() else TOP_LEVEL.get(name)
    if layer is None:
        raise AssertionError(
            f"{module} has no layer: add it to tests/test_architecture.py and docs/ARCHITECTURE.md"
        )
    return layer


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every perfsight import in ``path``, at any depth (lazy ones included)."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # ``from perfsight.x import y``: y is a module when a file or folder is named so
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                is_module = _path_of(sub) is not None
                found.append((node.lineno, sub if is_module else target))
    return [(line, name) for line, name in found if name == "perfsight" or name.startswith("perfsight.")]


def _path_of(module: str) -> Path | None:
    if not module.startswith("perfsight."):
        return None
    relative = Path(*module.split(".")[1:])
    for candidate in (PACKAGE / relative.with_suffix(".py"), PACKAGE / relative / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def upward_imports() -> list[str]:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "static" in path.relative_to(PACKAGE).parts:
            continue
        importer = module_name(path)
        mine = layer_of(importer)
        for line, imported in imports_of(path):
            if imported == "perfsight":
                continue  # the root: ``__version__`` and lazy public names, which load nothing
            theirs = layer_of(imported)
            if theirs == mine or theirs in ALLOWED[mine] or (importer, imported) in UPWARD_BY_DESIGN:
                continue
            where = path.relative_to(PACKAGE.parent)
            problems.append(f"{where}:{line}: {importer} ({mine}) imports {imported} ({theirs})")
    return problems


def test_no_module_imports_a_layer_above_its_own() -> None:
    problems = upward_imports()
    assert not problems, "upward imports (see docs/ARCHITECTURE.md):\n" + "\n".join(problems)


def test_every_module_has_a_layer() -> None:
    for path in PACKAGE.rglob("*.py"):
        layer_of(module_name(path))  # raises naming a module nobody placed


def test_the_check_catches_an_upward_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walker itself: an analysis importing the exporter is reported with file and line."""
    fake = tmp_path / "perfsight"
    (fake / "analysis").mkdir(parents=True)
    (fake / "export").mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "analysis" / "__init__.py").write_text("")
    (fake / "export" / "__init__.py").write_text("")
    (fake / "export" / "writer.py").write_text("")
    (fake / "analysis" / "bad.py").write_text("import numpy\n\ndef f():\n    from ..export import writer\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert upward_imports() == [
        "perfsight/analysis/bad.py:4: perfsight.analysis.bad (analysis) imports "
        "perfsight.export.writer (export)"
    ]
