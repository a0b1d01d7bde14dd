"""JSON Schema string limits as xgrammar EBNF: `pattern`, `minLength`/`maxLength` and `format`.

Why our own translation (grammar.py sends everything else to xgrammar's JSON Schema compiler):
xgrammar 0.2.9 lets raw control characters into a `maxLength` string (invalid JSON), matches a
`pattern` against the raw JSON text (so a `"` or `\\n` in a pattern yields invalid JSON, a
backslash inside a group never matches) and silently ignores lookaheads. Here a pattern is parsed as
an ECMA-262 subset into a small tree (regex_syntax.py), a length window is intersected with it
exactly, and the result is written as an EBNF expression over *decoded* characters: each character
of the string is its raw UTF-8 text, or its JSON escape when it must be escaped (`"`, `\\`,
controls). xgrammar's EBNF repetition `x{m,n}` is counted natively, so `maxLength: 1000000` costs
no more to compile than 10.

Choices where JSON Schema is silent or our target is narrower (README, "Structured output"):
- A pattern is unanchored (JSON Schema semantics): `abc` matches any string containing "abc".
- Escapes are the shortest JSON form (`\\"`, `\\\\`, `\\n`, `\\u001f`); `\\/` and `\\u0041` for
  plain characters are never produced (like compact whitespace: one spelling per document).
- Lookarounds, backreferences, word boundaries, Unicode property escapes and inline flags are
  refused by name (RegexUnsupported), never dropped.
- A pattern combined with a length window that splits into more than MAX_ALTERNATIVES pieces is
  refused with that limit named (the split is exact, so its size is bounded here, not guessed).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from modeldeploy.runtime.engine.structured_output.regex_syntax import (
    SURROGATES,
    Alt,
    Chars,
    Node,
    Ranges,
    RegexUnsupported,
    Repeat,
    Seq,
    length_range,
    minus,
    negate,
    norm,
)

MAX_ALTERNATIVES = 1024  # pieces one pattern x length window may split into (see `_Writer.ranged`)
MAX_DEPTH = 120  # nested splits (each a few Python frames: stays far under the recursion limit)
MAX_NFA_STATES = 4000  # the automaton fallback's expanded pattern (bounded repetitions unrolled)
MAX_PRODUCT_RULES = 512  # the automaton fallback's reachable (state set, length) pairs: ~0.5 ms of work each


# ---------------------------------------------------------------------------------------------
# the EBNF writer


def _ebnf_char(cp: int) -> str:
    return f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"


_JSON_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r"}
_MUST_ESCAPE: Ranges = norm([(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])


def _escape_text(cp: int) -> str:
    """The JSON text of an escaped character, as an EBNF string literal."""
    text = _JSON_ESCAPES.get(cp, f"\\u{cp:04x}")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass
class _Writer:
    """EBNF for trees; named rules for character sets and split length windows (shared, memoised)."""

    prefix: str
    rules: dict[str, str] = field(default_factory=dict)
    _sets: dict[Ranges, str] = field(default_factory=dict)
    _memo: dict[tuple[Node, int, int | None], str | None] = field(default_factory=dict)
    pieces: int = 0
    depth: int = 0

    def _rule(self, body: str) -> str:
        name = f"{self.prefix}_{len(self.rules)}"
        self.rules[name] = body
        return name

    def chars(self, ranges: Ranges) -> str | None:
        ranges = minus(ranges, SURROGATES)
        if not ranges:
            return None
        if ranges not in self._sets:
            raw = minus(ranges, _MUST_ESCAPE)
            alts = []
            if raw:
                alts.append(
                    "["
                    + "".join(_ebnf_char(a) + ("" if a == b else "-" + _ebnf_char(b)) for a, b in raw)
                    + "]"
                )
            for lo, hi in minus(ranges, negate(_MUST_ESCAPE)):
                alts.extend(_escape_text(cp) for cp in range(lo, hi + 1))
            self._sets[ranges] = self._rule(" | ".join(alts))
        return self._sets[ranges]

    def plain(self, node: Node) -> str | None:
        """The expression for all of the node's strings; None when it has none."""
        if isinstance(node, Chars):
            return self.chars(node.ranges)
        if isinstance(node, Seq):
            parts = [self.plain(i) for i in node.items]
            if any(p is None for p in parts):
                return None
            return "(" + " ".join(p for p in parts if p) + ")" if parts else '""'
        if isinstance(node, Alt):
            opts = [o for o in (self.plain(o) for o in node.options) if o is not None]
            return "(" + " | ".join(opts) + ")" if opts else None
        body = self.plain(node.body)
        if body is None:
            return '""' if node.lo == 0 else None
        return f"({body}){{{node.lo},{-1 if node.hi is None else node.hi}}}"

    def _count(self, n: int = 1) -> None:
        self.pieces += n
        if self.pieces > MAX_ALTERNATIVES or self.depth > MAX_DEPTH:
            raise RegexUnsupported(
                f"pattern with minLength/maxLength splits into more than {MAX_ALTERNATIVES} pieces "
                f"or {MAX_DEPTH} nested splits (bound the lengths inside the pattern instead)"
            )

    def ranged(self, node: Node, lo: int, hi: int | None) -> str | None:
        """The node's strings whose length is in [lo, hi], exactly (None: there are none)."""
        lo = max(lo, 0)
        nlo, nhi = length_range(node)
        if hi is not None and (hi < lo or hi < nlo) or (nhi is not None and nhi < lo):
            return None
        if lo <= nlo and (hi is None or (nhi is not None and nhi <= hi)):
            return self.plain(node)
        key = (node, lo, hi)
        if key in self._memo:
            return self._memo[key]
        self.depth += 1
        self._count()
        try:
            out = self._ranged(node, lo, hi)
        finally:
            self.depth -= 1
        self._memo[key] = out if out is None else self._rule(out)
        return self._memo[key]

    def _ranged(self, node: Node, lo: int, hi: int | None) -> str | None:
        if isinstance(node, Alt):
            opts = [o for o in (self.ranged(o, lo, hi) for o in node.options) if o is not None]
            return " | ".join(opts) if opts else None
        if isinstance(node, Repeat):
            return self._ranged_repeat(node, lo, hi)
        assert isinstance(node, Seq)  # Chars always fit or never do (length 1)
        if len(node.items) == 1:
            return self.ranged(node.items[0], lo, hi)
        return self._split(node.items[0], Seq(node.items[1:]), lo, hi)

    def _split(self, first: Node, rest: Node, lo: int, hi: int | None, least: int = 0) -> str | None:
        """first . rest with total length in [lo, hi], split on first's exact length (at least
        `least`: a repetition's copy that matched nothing would leave the same problem again)."""
        flo, fhi = length_range(first)
        flo = max(flo, least)
        rlo, rhi = length_range(rest)
        if flo == fhi and least == 0:
            return self._join(
                self.plain(first), self.ranged(rest, lo - flo, None if hi is None else hi - flo)
            )
        if rlo == rhi and least == 0:
            return self._join(
                self.ranged(first, lo - rlo, None if hi is None else hi - rlo), self.plain(rest)
            )
        opts = []
        top = hi if fhi is None else fhi if hi is None else min(fhi, hi)
        if top is None:  # only a lower bound: first's lengths under lo one by one, then first >= lo
            top = lo - 1
            opts.append(self._join(self.ranged(first, max(lo, flo), None), self.plain(rest)))
        for n in range(flo, top + 1):
            self._count()
            opts.append(
                self._join(
                    self.ranged(first, n, n), self.ranged(rest, lo - n, None if hi is None else hi - n)
                )
            )
        opts = [o for o in opts if o is not None]
        return " | ".join(opts) if opts else None

    @staticmethod
    def _join(a: str | None, b: str | None) -> str | None:
        return None if a is None or b is None else f"{a} {b}"

    def _ranged_repeat(self, node: Repeat, lo: int, hi: int | None) -> str | None:
        blo, bhi = length_range(node.body)
        if blo == bhi:  # fixed-length body: the window is a window on the count
            if blo == 0:
                return self.plain(node) if lo == 0 else None
            c_lo = max(node.lo, -(-lo // blo))
            c_hi = hi // blo if hi is not None else None
            if node.hi is not None:
                c_hi = node.hi if c_hi is None else min(c_hi, node.hi)
            if c_hi is not None and c_hi < c_lo:
                return None
            body = self.plain(node.body)
            return None if body is None else f"({body}){{{c_lo},{-1 if c_hi is None else c_hi}}}"
        # a variable body: one copy, then the rest of the repetition (an empty string ends it)
        if node.hi == 0:
            return '""' if lo == 0 else None
        more = Repeat(node.body, max(node.lo - 1, 0), None if node.hi is None else node.hi - 1)
        if node.hi is None and node.lo <= 1:
            more = Repeat(node.body, 0, None)
        step = self._split(node.body, more, max(lo, 1) if node.lo == 0 else lo, hi, least=1)
        if node.lo == 0 and lo == 0:
            return '""' if step is None else f'"" | {step}'
        return step


class _TooLarge(RegexUnsupported):
    pass


class RegexTooLarge(RegexUnsupported):
    """The pattern x length window is beyond both writers' bounds (a size, not a construct)."""


class _NFA:
    """Thompson automaton of a tree: epsilon moves and character-set edges."""

    def __init__(self) -> None:
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[Ranges, int]]] = []

    def new(self) -> int:
        if len(self.eps) >= MAX_NFA_STATES:
            raise _TooLarge(f"over {MAX_NFA_STATES} automaton states")
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def build(self, node: Node, s: int, t: int) -> None:
        if isinstance(node, Chars):
            self.edges[s].append((minus(node.ranges, SURROGATES), t))
        elif isinstance(node, Alt):
            for o in node.options:
                self.build(o, s, t)
        elif isinstance(node, Seq):
            cur = s
            for i, item in enumerate(node.items):
                nxt = t if i == len(node.items) - 1 else self.new()
                self.build(item, cur, nxt)
                cur = nxt
            if not node.items:
                self.eps[s].append(t)
        else:
            self._repeat(node, s, t)

    def _repeat(self, node: Repeat, s: int, t: int) -> None:
        cur = s
        for _ in range(node.lo):
            nxt = self.new()
            self.build(node.body, cur, nxt)
            cur = nxt
        if node.hi is None:
            loop = self.new()
            self.eps[cur].append(loop)
            self.build(node.body, loop, loop)
            self.eps[loop].append(t)
            return
        for _ in range(node.hi - node.lo):
            self.eps[cur].append(t)
            nxt = self.new()
            self.build(node.body, cur, nxt)
            cur = nxt
        self.eps[cur].append(t)

    def closure(self, states: set[int]) -> frozenset[int]:
        todo, seen = list(states), set(states)
        while todo:
            for n in self.eps[todo.pop()]:
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return frozenset(seen)

    def moves(self, states: frozenset[int]) -> dict[frozenset[int], Ranges]:
        """Target state set -> the characters that lead there (the alphabet split at every edge)."""
        edges = [(lo, hi, t) for n in states for ranges, t in self.edges[n] for lo, hi in ranges]
        cuts = sorted({lo for lo, _, _ in edges} | {hi + 1 for _, hi, _ in edges})
        groups: dict[frozenset[int], list[tuple[int, int]]] = {}
        for a, b in zip(cuts, cuts[1:], strict=False):
            targets = {t for lo, hi, t in edges if lo <= a and b - 1 <= hi}
            if targets:
                groups.setdefault(self.closure(targets), []).append((a, b - 1))
        return {k: norm(v) for k, v in groups.items()}


def _product(w: _Writer, node: Node, lo: int, hi: int | None) -> str | None:
    """The automaton fallback: one rule per reachable (state set, length so far) pair, so the count
    is exact whatever the pattern's shape; the length stops counting at `lo` when there is no `hi`."""
    nfa = _NFA()
    start, accept = nfa.new(), nfa.new()
    nfa.build(node, start, accept)
    first: tuple[frozenset[int], int] = (nfa.closure({start}), 0)
    alts: dict[tuple[frozenset[int], int], list[tuple[str, tuple[frozenset[int], int] | None]]] = {}
    todo: list[tuple[frozenset[int], int]] = [first]
    while todo:
        key = todo.pop()
        if key in alts:
            continue
        if len(alts) >= MAX_PRODUCT_RULES:
            raise _TooLarge(f"over {MAX_PRODUCT_RULES} automaton states x lengths")
        states, k = key
        out: list[tuple[str, tuple[frozenset[int], int] | None]] = []
        if accept in states and k >= lo:
            out.append(('""', None))
        if hi is None or k < hi:
            for target, ranges in nfa.moves(states).items():
                cls = w.chars(ranges)
                if cls is not None:
                    nxt = (target, k + 1 if hi is not None else min(k + 1, lo))
                    out.append((cls, nxt))
                    todo.append(nxt)
        alts[key] = out
    live: set[tuple[frozenset[int], int]] = set()
    changed = True
    while changed:  # a pair is live when it can still end the string
        changed = False
        for key, out in alts.items():
            if key not in live and any(nxt is None or nxt in live for _, nxt in out):
                live.add(key)
                changed = True
    if first not in live:
        return None
    names = {key: f"{w.prefix}_p{i}" for i, key in enumerate(k for k in alts if k in live)}
    for key, name in names.items():
        bodies = [
            cls if nxt is None else f"{cls} {names[nxt]}"
            for cls, nxt in alts[key]
            if nxt is None or nxt in live
        ]
        w.rules[name] = " | ".join(bodies)
    return names[first]


def string_ebnf(
    node: Node, min_length: int, max_length: int | None, prefix: str
) -> tuple[str, dict[str, str]]:
    """(expression, rules): the node's strings with min_length <= length <= max_length, written
    between the quotes of a JSON string, its rule names starting with `prefix`. The exact split by
    length first (no counting when the pattern's repetitions have fixed-length bodies, however
    large the bounds); where that splits into too many pieces, the automaton x length product.
    RegexUnsupported when no string qualifies or both are too large. Memoised: the server checks a
    schema and the engine compiles it, each building the same strings."""
    expr, rules = _string_ebnf(node, min_length, max_length)

    def rename(text: str) -> str:
        return text.replace(f"{_TEMPLATE}_", f"{prefix}_")

    return rename(expr), {rename(name): rename(body) for name, body in rules.items()}


_TEMPLATE = "mdxtemplate"


@functools.lru_cache(maxsize=256)
def _string_ebnf(node: Node, min_length: int, max_length: int | None) -> tuple[str, dict[str, str]]:
    w = _Writer(_TEMPLATE)
    try:
        expr = w.ranged(node, min_length, max_length)
    except RegexUnsupported as split_error:
        w = _Writer(_TEMPLATE)
        try:
            expr = _product(w, node, min_length, max_length)
        except _TooLarge as e:
            raise RegexTooLarge(f"{split_error}; as an automaton: {e}") from None
    if expr is None:
        raise RegexUnsupported("no string satisfies the pattern, format and length limits together")
    return expr, w.rules
