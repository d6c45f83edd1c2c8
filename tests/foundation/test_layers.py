"""The house's import rules, read from the code's own imports (ast, no import executed).

1. No import circle between files of align/ and pipeline/.
2. No import from a lower layer up to a higher one (docs/ARCHITECTURE.md, "Layers").

Every import counts, at module level or inside a function: a function-level import that dodges a circle is still the
circle. Only imports under `if TYPE_CHECKING:` (annotations) are exempt.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Highest first. A module may import its own layer or any layer below it. The first matching prefix wins.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("pipeline",),
    ("align.stages", "align.plan"),
    ("align.rl",),
    ("align.eval", "align.rollout", "align.reward", "align.lora", "align.lora.stage"),
    ("align.train", "align.inference", "align.lora.decode", "align.lora.checkpoint"),
    ("align.data", "align.model", "align.lora.adapters"),
    ("align.tokenizer", "align.utils", "align.config", "align.profile", "align.registry", "align.exit_codes"),
    ("align.kernels", "align.verify", "align.sandbox", "align.exceptions", "align"),
)


def layer_of(module: str) -> int:
    """Layer index of a module (0 = top); the longest matching prefix decides."""
    best, best_len = None, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best is None:
        raise AssertionError(f"{module}: in no layer of LAYERS")
    return best


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(node: ast.AST, package: str, known: set[str]) -> list[str]:
    """Project modules an Import / ImportFrom node names (a `from pkg import mod` names pkg.mod when it is a file)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    out = []
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            out.append(name)
    return out


def import_graph() -> dict[str, set[str]]:
    files = [*ROOT.glob("align/**/*.py"), *ROOT.glob("pipeline/**/*.py")]
    known = {module_name(f) for f in files}
    graph: dict[str, set[str]] = {}
    for path in files:
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), filename=str(path))
        skip: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                skip.update(id(child) for stmt in node.body for child in ast.walk(stmt))
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skip:
                edges.update(m for m in _imported(node, package, known) if m != name)
        graph[name] = edges
    return graph


def _package_edge(source: str, target: str) -> bool:
    """An import of a package's own __init__ by its members (or the reverse) is not a circle between rooms."""
    return source.startswith(target + ".") or target.startswith(source + ".")


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one file (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if _package_edge(node, child):
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
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
                    found.append(sorted(component))
    return found


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{source} (layer {layer_of(source)}) imports {target} (layer {layer_of(target)})"
        for source, targets in graph.items()
        for target in targets
        if layer_of(target) < layer_of(source) and not _package_edge(source, target)
    )


def test_every_module_has_a_layer():
    for name in import_graph():
        layer_of(name)


def test_no_import_circles():
    found = circles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_upward_imports():
    found = upward_imports(import_graph())
    assert not found, "imports that run up a layer:\n" + "\n".join(found)


def test_the_checker_sees_a_circle_and_an_upward_import():
    graph = {"align.verify.a": {"align.verify.b"}, "align.verify.b": {"align.verify.a"}, "align.stages.x": set()}
    assert circles(graph) == [["align.verify.a", "align.verify.b"]]
    graph = {"align.model.m": {"align.stages.x"}, "align.stages.x": set()}
    assert upward_imports(graph) == ["align.model.m (layer 5) imports align.stages.x (layer 1)"]
