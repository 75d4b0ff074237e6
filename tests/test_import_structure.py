"""The package's import structure: the project's packages in a declared order that no import runs against, no
import cycle among its modules (function-level imports included in both), and the routing of a URI to a store
decided in one function."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pipelines", "model_export")

# The declared order of the project's packages, bottom to top: a module may import modules of its own package and of
# the packages before it, never of one after it (function-level imports too). A module belongs to the longest
# package here its name starts with (model_export.models.yolact to model_export.models, model_export.cli to
# model_export); a package missing from the list fails test_every_package_has_a_place_in_the_order.
PACKAGE_ORDER = (
    "pipelines.errors",
    "pipelines.io",
    "pipelines.job_config",
    "pipelines.datasets",
    "pipelines.ops",
    "pipelines.spark",
    "pipelines.results",
    "pipelines.report",  # evaluation and the report: read what results/ wrote
    "pipelines.inference",
    "pipelines.engines",  # backends other than the native one, behind inference's Engine protocol
    "pipelines.job_cli",  # builds the run: the one place an engine is chosen
    "pipelines.tools",  # build tools (the JVM class archive): run the job, never run by it
    "pipelines.sweeps",
    "model_export.models",
    "model_export",
    "pipelines.training",
)
ROOTS = ("pipelines",)  # the top-level package itself (an empty __init__.py): placed nowhere, importing nothing of ours


def project_modules(root: Path = REPO) -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that `name` imports anywhere in its body (`from pkg import module` counts as module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    found.add(f"{base}.{alias.name}")
                elif base in modules:
                    found.add(base)
    return found - {name}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def package_of(module: str, order: tuple[str, ...] = PACKAGE_ORDER) -> str | None:
    """The declared package `module` belongs to: the longest one its name starts with; None where none fits."""
    fits = [package for package in order if module == package or module.startswith(package + ".")]
    return max(fits, key=len, default=None)


def upward_imports(graph: dict[str, set[str]], order: tuple[str, ...] = PACKAGE_ORDER) -> list[tuple[str, str]]:
    """(importer, imported) for every import from a package to one declared after it, sorted."""
    rank = {package: position for position, package in enumerate(order)}
    found = []
    for module, imported in graph.items():
        mine = package_of(module, order)
        for other in imported:
            theirs = package_of(other, order)
            if mine is not None and theirs is not None and rank[theirs] > rank[mine]:
                found.append((module, other))
    return sorted(found)


def test_no_import_cycle_among_project_modules():
    graph = import_graph(project_modules())
    assert len(graph) > 50, "the walk found too few modules"
    assert import_cycles(graph) == []


def test_every_package_has_a_place_in_the_order():
    """A new package (or a module at the top of pipelines/) is placed in PACKAGE_ORDER before it is used."""
    modules = project_modules()
    assert [name for name in modules if name not in ROOTS and package_of(name) is None] == []
    assert all(imported_modules(name, modules[name], modules) == set() for name in ROOTS)


def test_no_import_runs_against_the_package_order():
    """No module imports, at its top or in a function, a module of a package declared after its own."""
    upward = upward_imports(import_graph(project_modules()))
    assert upward == [], "imports against PACKAGE_ORDER (importer -> imported):\n" + "\n".join(
        f"  {importer} -> {imported}" for importer, imported in upward
    )


def test_the_order_check_finds_an_upward_import(tmp_path):
    """A module tree with one upward import in a function (results -> report) and one at the top (models -> the
    export stage above them): both are reported, the imports down the order are not."""
    files = {
        "pipelines/__init__.py": "",
        "pipelines/errors.py": "",
        "pipelines/results/__init__.py": "",
        "pipelines/results/evaluate.py": (
            "from pipelines.errors import UsageError\n\n\ndef main():\n    from pipelines.report import render\n"
        ),
        "pipelines/report/__init__.py": "",
        "pipelines/report/render.py": "from ..results import evaluate\n",
        "model_export/__init__.py": "",
        "model_export/parity.py": "import model_export.models.yolact\n",
        "model_export/models/__init__.py": "",
        "model_export/models/yolact.py": "from model_export import parity\nfrom pipelines.report.render import x\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    graph = import_graph(project_modules(tmp_path))
    assert graph["pipelines.report.render"] == {"pipelines.results.evaluate"}  # a relative import, resolved
    assert upward_imports(graph) == [
        ("model_export.models.yolact", "model_export.parity"),
        ("pipelines.results.evaluate", "pipelines.report.render"),
    ]
    assert package_of("pipelines.sparkseg_new.module") is None  # unplaced: test_every_package_... fails on it


def test_cycle_finder_finds_a_cycle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_uris_is_the_bottom_layer():
    """uris and errors import nothing of ours but errors: every layer may use them."""
    modules = project_modules()
    assert imported_modules("pipelines.io.uris", modules["pipelines.io.uris"], modules) == {"pipelines.errors"}
    assert imported_modules("pipelines.errors", modules["pipelines.errors"], modules) == set()


def test_azure_sdk_routing_is_spelled_once():
    """The rule "az:// and abfs:// go through the Azure SDK" lives in pipelines.io.uris.store_of alone."""
    spelled = [
        path.relative_to(REPO).as_posix()
        for path in project_modules().values()
        if '"az://", "abfs://"' in path.read_text(encoding="utf-8")
        or "('az://', 'abfs://')" in path.read_text(encoding="utf-8")
    ]
    assert spelled == []


EXECUTOR_MODULES = (
    "pipelines.inference.image_inference",
    "pipelines.inference.yolact_inference",
    "pipelines.inference.detector_inference",
    "pipelines.inference.video_inference",
    "pipelines.inference.inference_tasks",
    "pipelines.ops.mask_outputs",
)


def test_executor_task_imports_neither_torch_nor_pyspark():
    """Executors never need torch; the task itself needs no pyspark either (one-process runs, benches)."""
    import subprocess
    import sys

    code = (
        "import builtins, sys\n"
        "real = builtins.__import__\n"
        "def refuse(name, *args, **kwargs):\n"
        "    if name.split('.')[0] in ('torch', 'pyspark', 'torchvision'):\n"
        "        raise ImportError(f'the executor task imported {name}')\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = refuse\n"
        f"for module in {EXECUTOR_MODULES!r}:\n"
        "    __import__(module)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_planning_a_job_on_the_driver_imports_no_numba():
    """numba (~0.2 s to import, ~140 MiB) is loaded where pixels are processed: the driver imports the job and the
    families' task classes to plan and pickle the tasks, and never compiles a pixel loop."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import pipelines.inference.inference_job\n"
        "from pipelines.inference.inference_tasks import inference_task_class\n"
        "for family in ('yolact', 'detector'):\n"
        "    inference_task_class(family)\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] in ('numba', 'llvmlite')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout[-2000:]


# Spark beyond the DataFrame API, reachable only through pipelines.spark (session_kind picks classic or Connect):
# what a Spark Connect client lacks (the SparkContext, py4j, accumulators, RDDs, SparkFiles).
SPARK_INTERNAL_ATTRIBUTES = frozenset(
    (
        "sparkContext",
        "_jvm",
        "_jsc",
        "_jdf",
        "_jsparkSession",
        "_gateway",
        "accumulator",
        "statusTracker",
        "addPyFile",
        "addArchive",
        "setJobGroup",
        "cancelJobGroup",
        "parallelize",
    )
)
SPARK_INTERNAL_NAMES = frozenset(("RDD", "SparkFiles", "Accumulator"))
SPARK_LAYER = "pipelines/spark/"


def spark_internals_used(source: str) -> list[str]:
    """The Spark internals `source` uses: SPARK_INTERNAL_ATTRIBUTES read as attributes, SPARK_INTERNAL_NAMES
    imported from pyspark (type-only imports too: their values are what a Connect client has not)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in SPARK_INTERNAL_ATTRIBUTES:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pyspark":
            found += [f"line {node.lineno}: {a.name}" for a in node.names if a.name in SPARK_INTERNAL_NAMES]
    return found


def test_spark_internals_are_used_only_in_the_spark_layer():
    """No sparkContext, py4j, accumulator, RDD or SparkFiles outside pipelines/spark/ (jobs and notebooks included):
    everything else reaches Spark through the DataFrame API and pipelines.spark.session_kind, so that one code path
    runs on classic and Spark Connect sessions."""
    sources = [*project_modules().values(), *sorted((REPO / "jobs").glob("*.py")), *sorted(REPO.glob("notebooks/*.py"))]
    used = {
        path.relative_to(REPO).as_posix(): found
        for path in sources
        if not path.relative_to(REPO).as_posix().startswith(SPARK_LAYER)
        and (found := spark_internals_used(path.read_text(encoding="utf-8")))
    }
    assert used == {}


def test_the_spark_layer_rule_finds_a_planted_use():
    planted = (
        "from pyspark import RDD, StorageLevel\n"
        "def count(spark, df):\n"
        "    total = spark.sparkContext.accumulator(0)\n"
        "    return len(df._jdf.inputFiles()), total\n"
    )
    assert spark_internals_used(planted) == [
        "line 1: RDD",
        "line 3: .accumulator",
        "line 3: .sparkContext",
        "line 4: ._jdf",
    ]
    assert spark_internals_used("df.inputFiles()\nspark.conf.get('spark.task.cpus')\n") == []
