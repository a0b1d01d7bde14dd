"""No module-level mutable state anywhere under operator/: what outlives a reconcile lives in the Controller.

An AST scan of every operator module: a module (or class body) may bind constants (numbers,
strings, tuples, frozensets, read-only mappings, frozen dataclasses), functions, classes, loggers
and Prometheus metrics (process-wide by design), but no dict/list/set, no lock or thread, no
instance of a (non-frozen) operator class, and no `global` statement anywhere.
"""

from __future__ import annotations

import ast
from pathlib import Path

OPERATOR = Path(__file__).resolve().parents[2] / "src" / "modeldeploy" / "operator"
MUTABLE_DISPLAYS = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
MUTABLE_CALLS = {
    "dict", "list", "set", "bytearray", "defaultdict", "deque", "OrderedDict", "ChainMap",
    "Lock", "RLock", "Semaphore", "BoundedSemaphore", "Event", "Condition", "Timer", "Thread",
    "ThreadPoolExecutor", "Queue", "ApiClient", "Client",
}  # fmt: skip


def _callee(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _bindings(body: list[ast.stmt]) -> list[tuple[str, ast.expr, int]]:
    """(target, value, line) of every assignment directly in `body`, also under module-level if/try."""
    out = []
    for node in body:
        if isinstance(node, ast.Assign):
            out += [(ast.unparse(t), node.value, node.lineno) for t in node.targets]
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            out.append((ast.unparse(node.target), node.value, node.lineno))
        elif isinstance(node, ast.If | ast.Try):
            out += _bindings(node.body + node.orelse + getattr(node, "finalbody", []))
    return out


def offenders(source: str, own_classes: set[str]) -> list[str]:
    tree = ast.parse(source)
    metric_types = {  # prometheus_client's Histogram is not analysis.Histogram
        a.asname or a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module == "prometheus_client"
        for a in n.names
    }
    own_classes = own_classes - metric_types
    scopes = [tree.body] + [n.body for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    found = [
        f"line {n.lineno}: global {', '.join(n.names)}" for n in ast.walk(tree) if isinstance(n, ast.Global)
    ]
    for body in scopes:
        for target, value, line in _bindings(body):
            if isinstance(value, MUTABLE_DISPLAYS):
                found.append(f"line {line}: {target} = {type(value).__name__.lower()}")
            elif isinstance(value, ast.Call) and (
                _callee(value) in MUTABLE_CALLS or _callee(value) in own_classes
            ):
                found.append(f"line {line}: {target} = {_callee(value)}(...)")
    return found


def _frozen(n: ast.ClassDef) -> bool:
    """`@dataclass(frozen=True)`: its instances are constants (a table of defaults), not state."""
    return any(
        isinstance(d, ast.Call)
        and _callee(d) == "dataclass"
        and any(
            k.arg == "frozen" and isinstance(k.value, ast.Constant) and k.value.value is True
            for k in d.keywords
        )
        for d in n.decorator_list
    )


def _operator_classes() -> set[str]:
    """The operator's classes whose instances may hold state (all but frozen dataclasses)."""
    return {
        n.name
        for path in OPERATOR.rglob("*.py")
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.ClassDef) and not _frozen(n)
    }


def test_operator_modules_keep_no_mutable_state() -> None:
    own = _operator_classes()
    modules = sorted(OPERATOR.rglob("*.py"))
    assert {p.parent.name for p in modules} >= {"api", "v1alpha1", "analysis", "controller", "rollout"}
    found = {str(p.relative_to(OPERATOR)): offenders(p.read_text(), own) for p in modules}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_scan_finds_each_kind_of_module_state() -> None:
    source = (
        "import threading\nfrom collections import defaultdict\n"
        "_cache: dict[str, int] = {}\nSEEN = set()\nLOCKS = defaultdict(threading.Lock)\n"
        "GUARD = threading.Lock()\nRUNNER = ConformanceRunner()\nNAMES = [n for n in 'ab']\n"
        "class Keeper:\n    shared = []\n"
        "def bump():\n    global COUNT\n    COUNT += 1\n"
        "OK = ('a', 'b')\nALSO_OK = frozenset({'a'})\nLIMIT = 4 * 1024\n"
    )
    found = offenders(source, {"ConformanceRunner"})
    assert [f.split(":")[0] for f in found] == [f"line {n}" for n in (12, 3, 4, 5, 6, 7, 8, 10)], found
