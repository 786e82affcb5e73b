"""The package is layered: nothing imports upward (README, Layout), and no modules import each other in a circle.

Every import of every module is read with `ast` (function-level imports too, since a lazy import is still a
dependency) and resolved to the part of the package it names. Bottom to top:

    models  <  folders, device, model_files  <  data  <  inference  <  hub  <  training  <  tools

`hf_minitx.cli` holds the command's shared helpers (typed-argument parsing, the one error and interruption
handling) and may be used from any layer, because it imports none of the package itself: it finds each
subcommand's module by name when the command runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hf_minitx"
RANKS = {
    "models": 0,
    "folders": 1, "device": 1, "launch": 1, "model_files": 1,
    "data": 2,
    "inference": 3,
    "hub": 4,
    "training": 5,
    "tools": 6,
}
TOP = {"cli", "__main__", "__init__"}  # the command and the package root sit above every layer
# imports that are not dependencies: the clean-environment check tries `import hf_minitx` to prove it fails
NOT_DEPENDENCIES = {("hub/remote_check.py", "hf_minitx")}


def _unit(module: str) -> str:
    """'hf_minitx.training.loop' -> 'training'; 'hf_minitx' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(relative.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported hf_minitx module) for every import in `path`, relative imports resolved."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "hf_minitx"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "hf_minitx":
                continue
            if node.module is None or target == "hf_minitx":  # `from .. import data` names submodules
                found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, target))
    return found


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_parser_resolves_relative_imports():
    # known imports of the tree, so that a parser finding nothing cannot pass the layering tests below
    assert any(m == "hf_minitx.cli" for _, m in package_imports(PACKAGE / "training" / "loop.py"))
    assert any(m == "hf_minitx.models.modeling_minitx"
               for _, m in package_imports(PACKAGE / "data" / "preprocessing.py"))
    assert any(m == "hf_minitx.data" for _, m in package_imports(PACKAGE / "tools" / "benchmark" / "data_prep.py"))
    assert any(m == "hf_minitx.__version__" for _, m in package_imports(PACKAGE / "cli.py"))


def test_every_part_of_the_package_has_a_layer():
    units = {_unit(_module_name(path)) for path in _sources()}
    assert units - TOP == set(RANKS), "a new part of the package needs a place in RANKS (and README's Layout)"


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_nothing_imports_upward(path):
    unit = _unit(_module_name(path))
    if unit in TOP:
        return
    where = str(path.relative_to(PACKAGE))
    upward = [f"line {line}: {target}" for line, target in package_imports(path)
              if (where, target) not in NOT_DEPENDENCIES
              and (other := _unit(target)) != "cli" and (other in TOP or RANKS[other] > RANKS[unit])]
    assert not upward, f"{where} ({unit}) imports from a higher layer: {upward}"


def test_models_import_only_each_other():
    """The Hub custom code is self-contained: save_pretrained copies the models/ files and nothing else."""
    for path in sorted((PACKAGE / "models").glob("*.py")):
        outside = [target for _, target in package_imports(path) if not target.startswith("hf_minitx.models")]
        assert not outside, f"{path.name} imports {outside}"


def test_the_command_module_imports_no_part_of_the_package():
    """cli.py dispatches by module name, so every layer may use its helpers without an import cycle."""
    imported = {target for _, target in package_imports(PACKAGE / "cli.py")}
    assert imported <= {"hf_minitx.__version__"}, imported


def _owning_module(target: str) -> str | None:
    """The package module an import names: 'hf_minitx.cli.parse_arguments' -> 'hf_minitx.cli'; None if none."""
    parts = target.split(".")
    while parts:
        path = PACKAGE.parent.joinpath(*parts)
        if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
            return ".".join(parts)
        parts.pop()
    return None


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (function-level imports too), from every file's `ast`."""
    graph: dict[str, set[str]] = {}
    for path in _sources():
        name = _module_name(path)
        where = str(path.relative_to(PACKAGE))
        graph[name] = {owner for _, target in package_imports(path) if (where, target) not in NOT_DEPENDENCIES
                       and (owner := _owning_module(target)) not in (None, name)}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` as [a, b, ..., a], or None: a depth-first search that meets its own path."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        for other in sorted(graph.get(node, ())):
            if cycle := visit(other, path + [node]):
                return cycle
        done.add(node)
        return None

    return next((cycle for node in sorted(graph) if (cycle := visit(node, []))), None)


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    assert "hf_minitx.models.layers_minitx" in import_graph()["hf_minitx.models.decoding_minitx"]


def test_no_two_modules_import_each_other_even_through_others():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
