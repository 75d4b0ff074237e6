"""The package's import structure: no import cycle among the project's modules (function-level imports included),
and the routing of a URI to a store decided in one function."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pipelines", "model_export")


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


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


def test_no_import_cycle_among_project_modules():
    modules = project_modules()
    graph = {name: imported_modules(name, path, modules) for name, path in modules.items()}
    assert len(graph) > 50, "the walk found too few modules"
    assert import_cycles(graph) == []


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
