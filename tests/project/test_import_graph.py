"""No import cycle between the parts of any package: each package's children form a layered graph.

For every package P of modeldeploy, its direct children (subpackages and modules) are the nodes and
"some module under child A imports some module under child B" is an edge A -> B; that graph must be
a DAG. A cycle there means two parts that cannot be read, tested or moved one without the other
(the engine client, core client and engine core, or the canary analysis and the rollout through a
port constant, were such circles). Every import counts: function-local ones (a lazy import still
ties the two modules together) and those under `if TYPE_CHECKING:` (a type is a dependency too).

The operator's layers (api below analysis below rollout below controller below its entry points)
are an import-linter contract in pyproject.toml, checked by `make lint` and by
tests/project/test_lint.py; the last test here proves that contract catches an upward import.
"""

from __future__ import annotations

from collections import defaultdict
from functools import cache

import grimp

from modeldeploy_dev.lint_imports import run

ROOT = "modeldeploy"
Edges = dict[str, set[str]]


@cache
def graph() -> grimp.ImportGraph:
    # cache_dir=None: a cache in the checkout could answer for sources that have since moved
    return grimp.build_graph(ROOT, include_external_packages=False, cache_dir=None)


def child_of(package: str, module: str) -> str | None:
    """The direct child of `package` that `module` is or lies under; None outside the package."""
    if not module.startswith(package + "."):
        return None
    return package + "." + module[len(package) + 1 :].split(".", 1)[0]


def child_graph(g: grimp.ImportGraph, package: str) -> Edges:
    """Edges between the direct children of `package` (the package's own __init__ is no child)."""
    edges: Edges = defaultdict(set)
    for importer in g.find_descendants(package):
        a = child_of(package, importer)
        for imported in g.find_modules_directly_imported_by(importer):
            b = child_of(package, imported)
            if a is not None and b is not None and a != b:
                edges[a].add(b)
    return edges


def find_cycle(edges: Edges) -> list[str] | None:
    """One cycle [a, b, ..., a] of the graph, or None when it is a DAG (depth-first, three colours)."""
    state: dict[str, int] = {}  # absent: unseen; 1: on the current path; 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)):
            return found
    return None


def explain(g: grimp.ImportGraph, cycle: list[str]) -> str:
    """Each step of the cycle with the imports that make it: `importer:line -> imported`."""
    lines = []
    for a, b in zip(cycle, cycle[1:], strict=False):
        lines.append(f"  {a} -> {b}:")
        for importer in sorted({a} | g.find_descendants(a)):
            for imported in sorted(g.find_modules_directly_imported_by(importer)):
                if imported == b or imported.startswith(b + "."):
                    for d in g.get_import_details(importer=importer, imported=imported):
                        lines.append(f"    {importer}:{d['line_number']} {d['line_contents']}")
    return "\n".join(lines)


def packages(g: grimp.ImportGraph) -> list[str]:
    return sorted(m for m in g.modules if g.find_children(m))


def test_grimp_sees_function_local_imports() -> None:
    """The check below is only as good as the graph: a lazy import (dispatch loads the CuPy kernels
    inside a function, on first use) must be an edge of it."""
    assert graph().direct_import_exists(
        importer="modeldeploy.kernels.dispatch", imported="modeldeploy.kernels.cuda_ops"
    )


def test_the_children_of_every_package_import_each_other_without_a_cycle() -> None:
    g = graph()
    found = []
    for package in packages(g):
        cycle = find_cycle(child_graph(g, package))
        if cycle is not None:
            names = " -> ".join(c.rsplit(".", 1)[1] for c in cycle)
            found.append(f"in {package}: {names}\n{explain(g, cycle)}")
    assert found == [], "import cycles between the parts of a package:\n" + "\n".join(found)


def test_find_cycle_names_the_circle_and_accepts_a_dag() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"a"}, "a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]


def test_an_upward_import_in_the_operator_breaks_its_layers_contract() -> None:
    """canary analysis sits below the rollout: analysis importing rollout (as it once did for the
    serving port) is caught by the layers contract, which no forbidden contract covers."""
    probe = {"modeldeploy/operator/analysis/layer_probe.py": "import modeldeploy.operator.rollout.plan\n"}
    r = run(extra=probe)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "the operator's layers: api < analysis < rollout < controller < cli BROKEN" in out, out
    assert "modeldeploy.operator.analysis.layer_probe" in out, out
