"""The specedge package is in layers, and has no import circle: a folder imports only the folders
below it (LAYERS; docs/design.md draws the same table), and no module imports one that imports it
back, directly or around a longer circle, at module level or inside a function (imports under
`if TYPE_CHECKING` never run and are left out; so is the package `__init__` Python runs before a
submodule, which holds only the version)."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def package_folder(package: str, package_dir: dict[str, str]) -> Path:
    """Where a package's files are: under its nearest parent package-dir maps (specedge.runtime.qnn:
    runtime/qnn), as setuptools finds them."""
    parts = package.split(".")
    for i in range(len(parts), 0, -1):
        if (head := ".".join(parts[:i])) in package_dir:
            return ROOT / package_dir[head] / "/".join(parts[i:])
    return ROOT / package.replace(".", "/")


def package_modules() -> dict[str, Path]:
    """Module name -> source file, for every package pyproject.toml lists (at its package-dir)."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    modules = {}
    for package in setup["packages"]:
        folder = package_folder(package, setup.get("package-dir", {}))
        assert (folder / "__init__.py").is_file(), f"pyproject.toml lists {package}: no package at {folder}"
        for path in folder.glob("*.py"):
            modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return modules


def test_every_package_folder_is_listed() -> None:
    """A folder of the package that pyproject.toml does not list would go missing from a wheel, and
    from the checks below."""
    tomllib = pytest.importorskip("tomllib")
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = {package_folder(p, setup.get("package-dir", {})) for p in setup["packages"]}
    for top in (package_folder(p, setup["package-dir"]) for p in setup["package-dir"]):
        for init in top.rglob("__init__.py"):
            assert init.parent in listed, f"{init.parent.relative_to(ROOT)} is not in pyproject.toml's packages"
    assert "specedge.runtime.qnn.plugin" in package_modules()  # a nested package's modules are checked too


def imported(tree: ast.AST) -> list[tuple[str, ...]]:
    """What a module's code imports, each as the names it may be, best first (`from a import b`:
    module a.b, else a), leaving out `if TYPE_CHECKING` blocks."""
    found: list[tuple[str, ...]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found += [names for child in node.orelse for names in imported(child)]
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, alias.name.rpartition(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found += [(f"{node.module}.{alias.name}", node.module) for alias in node.names]
        found += imported(node)
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its code."""
    graph = {}
    for name, path in modules.items():
        targets = (next((n for n in names if n in modules), None) for names in imported(ast.parse(path.read_text())))
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def test_the_package_has_no_import_circle() -> None:
    graph = import_graph(package_modules())
    assert "specedge.serve.command" in graph["specedge.cli"]  # the graph sees imports at all
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        pytest.fail("import circle: " + " -> ".join(e.args[1]))


def test_a_circle_inside_functions_is_found(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("def f():\n    from specedge.b import g\n")
    (tmp_path / "b.py").write_text("import specedge.a\n")
    graph = import_graph({"specedge.a": tmp_path / "a.py", "specedge.b": tmp_path / "b.py"})
    with pytest.raises(graphlib.CycleError):
        tuple(graphlib.TopologicalSorter(graph).static_order())


# folder (its package) -> the folders it may import; the app (specedge/: the CLI, chat, serve, bench)
# may import every folder, and no folder imports the app
LAYERS: dict[str, tuple[str, ...]] = {
    "core": (),
    "kernels": ("core",),
    "models": ("core",),
    "device_profiles": ("core", "kernels"),
    "runtime": ("core", "kernels", "device_profiles"),
    "export": ("core", "kernels", "models", "device_profiles", "runtime"),
}


def folder_of(module: str) -> str:
    """specedge.runtime.engine.model -> runtime; the app's modules (specedge.cli, specedge.serve.app) -> app."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "app"


def test_each_folder_imports_only_the_folders_below_it() -> None:
    graph = import_graph(package_modules())
    crossings = sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                       if b != "specedge" and folder_of(a) != "app" and folder_of(b) != folder_of(a)
                       and folder_of(b) not in LAYERS[folder_of(a)])
    assert graph["specedge.runtime.engine.model"], "the graph sees imports at all"
    assert not crossings, "imports across the layers: " + ", ".join(crossings)


# the runtime's subpackages (and its Generator, runtime/generator.py) -> what each may import of the runtime
RUNTIME_LAYERS: dict[str, tuple[str, ...]] = {
    "qnn": (),
    "engine": ("qnn",),
    "constraints": (),
    "text": ("engine", "constraints"),
    "round": ("engine", "constraints"),
    "generator": ("engine", "constraints", "text", "round"),
    "streams": ("engine", "constraints", "round", "generator"),
}


def runtime_part(module: str) -> str | None:
    """specedge.runtime.engine.model -> engine, specedge.runtime.generator -> generator (None: the
    runtime package itself, or not of the runtime)."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["specedge", "runtime"] and len(parts) > 2 else None


def test_each_part_of_the_runtime_imports_only_the_parts_below_it() -> None:
    graph = import_graph(package_modules())
    parts = {runtime_part(m) for m in graph} - {None}
    assert parts == set(RUNTIME_LAYERS), f"parts of the runtime without a layer: {parts ^ set(RUNTIME_LAYERS)}"
    crossings = sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                       if (pa := runtime_part(a)) and (pb := runtime_part(b)) and pa != pb
                       and pb not in RUNTIME_LAYERS[pa])
    assert not crossings, "imports across the runtime's layers: " + ", ".join(crossings)
    order = tuple(graphlib.TopologicalSorter({p: set(below) for p, below in RUNTIME_LAYERS.items()}).static_order())
    assert set(order) == set(RUNTIME_LAYERS)


def test_the_layers_are_a_ladder() -> None:
    """The rule itself has no circle, and reaches every folder: core at the bottom."""
    order = tuple(graphlib.TopologicalSorter({f: set(below) for f, below in LAYERS.items()}).static_order())
    assert order[0] == "core" and set(order) == set(LAYERS)

