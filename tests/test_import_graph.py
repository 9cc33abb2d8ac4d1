"""The package's modules import each other without a cycle (imports inside functions
included), so each can be read, and changed, after the ones it builds on."""

import ast
from pathlib import Path

import gno_ext

ROOT = Path(gno_ext.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Edges from each module to the modules (not packages' ``__init__``) it imports by name."""
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.add(node.module)
                targets.update(f"{node.module}.{alias.name}" for alias in node.names)
        graph[name] = {t for t in targets if t in modules and t != name and modules[t].name != "__init__.py"}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_between_modules():
    graph = import_graph()
    assert "gno_ext.training.steps" in graph["gno_ext.training.loop"]  # the graph sees the imports
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_every_subpackage_is_in_the_distribution():
    """A wheel holds the packages that pyproject.toml lists: a new subpackage left out of the
    list imports from a checkout but not from an installed wheel."""
    import tomllib

    listed = set(tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {module_name(p) for p in ROOT.rglob("__init__.py")}
    assert found <= listed, f"not in pyproject.toml's packages: {sorted(found - listed)}"
