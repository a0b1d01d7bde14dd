"""JSON Schema string limits as xgrammar EBNF: `pattern`, `minLength`/`maxLength` and `format`.

Why our own translation (grammar.py sends everything else to xgrammar's JSON Schema compiler):
xgrammar 0.2.9 lets raw control characters into a `maxLength` string (invalid JSON), matches a
`pattern` against the raw JSON text (so a `"` or `\\n` in a pattern yields invalid JSON, a
backslash inside a group never matches) and silently ignores lookaheads. Here a pattern is parsed as
an ECMA-262 subset into a small tree, a length window is intersected with it exactly, and the result
is written as an EBNF expression over *decoded* characters: each character of the string is its raw
UTF-8 text, or its JSON escape when it must be escaped (`"`, `\\`, controls). xgrammar's EBNF
repetition `x{m,n}` is counted natively, so `maxLength: 1000000` costs no more to compile than 10.

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

MAX_CODEPOINT = 0x10FFFF
MAX_ALTERNATIVES = 1024  # pieces one pattern x length window may split into (see `_Writer.ranged`)
MAX_DEPTH = 120  # nested splits (each a few Python frames: stays far under the recursion limit)
MAX_NFA_STATES = 4000  # the automaton fallback's expanded pattern (bounded repetitions unrolled)
MAX_PRODUCT_RULES = 512  # the automaton fallback's reachable (state set, length) pairs: ~0.5 ms of work each
MAX_PATTERN_CHARS = 10_000
MAX_REPEAT = 10**9  # a bound above this is not a number anyone means

Ranges = tuple[tuple[int, int], ...]


class RegexUnsupported(ValueError):
    """A pattern we cannot enforce exactly; the message names the construct and its position."""


# ---------------------------------------------------------------------------------------------
# character sets: sorted, disjoint, non-adjacent (lo, hi) code point ranges


def _norm(ranges: list[tuple[int, int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def _negate(ranges: Ranges) -> Ranges:
    out, nxt = [], 0
    for lo, hi in ranges:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODEPOINT:
        out.append((nxt, MAX_CODEPOINT))
    return tuple(out)


def _minus(a: Ranges, b: Ranges) -> Ranges:
    """a without b (both normalised)."""
    neg = _negate(b)
    out = []
    for lo, hi in a:
        for nlo, nhi in neg:
            if nlo <= hi and lo <= nhi:
                out.append((max(lo, nlo), min(hi, nhi)))
    return _norm(out)


_SURROGATES: Ranges = ((0xD800, 0xDFFF),)  # not encodable in UTF-8: never in a JSON string's text
_DIGIT: Ranges = ((0x30, 0x39),)
_WORD: Ranges = _norm([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
_SPACE: Ranges = _norm(
    [(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029)]
    + [(0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)]
)
_LINE_TERMINATORS: Ranges = _norm([(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)])
_ANY: Ranges = ((0, MAX_CODEPOINT),)
_CLASS_ESCAPES = {
    "d": _DIGIT,
    "D": _negate(_DIGIT),
    "w": _WORD,
    "W": _negate(_WORD),
    "s": _SPACE,
    "S": _negate(_SPACE),
}
_CHAR_ESCAPES = {"t": 0x09, "n": 0x0A, "v": 0x0B, "f": 0x0C, "r": 0x0D}
_REFUSED_ESCAPES = {
    "b": "word boundary '\\b'",
    "B": "word boundary '\\B'",
    "p": "Unicode property escape '\\p'",
    "P": "Unicode property escape '\\P'",
    "k": "named backreference '\\k'",
    "A": "anchor '\\A' (not ECMA-262: use '^')",
    "Z": "anchor '\\Z' (not ECMA-262: use '$')",
    "z": "anchor '\\z' (not ECMA-262: use '$')",
    "G": "anchor '\\G'",
    "c": "control escape '\\c'",
}


# ---------------------------------------------------------------------------------------------
# the tree


@dataclass(frozen=True)
class Chars:
    ranges: Ranges


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat:
    body: Node
    lo: int
    hi: int | None  # None: unbounded


Node = Chars | Seq | Alt | Repeat
EMPTY = Seq(())
ANY_STRING = Repeat(Chars(_ANY), 0, None)


def literal(text: str) -> Node:
    return Seq(tuple(Chars(((ord(c), ord(c)),)) for c in text))


@functools.lru_cache(maxsize=8192)
def length_range(node: Node) -> tuple[int, int | None]:
    """The shortest and longest string the node matches (None: unbounded)."""
    if isinstance(node, Chars):
        return 1, 1
    if isinstance(node, Seq):
        lo, hi = 0, 0
        for item in node.items:
            a, b = length_range(item)
            lo += a
            hi = None if hi is None or b is None else hi + b
        return lo, hi
    if isinstance(node, Alt):
        ranges = [length_range(o) for o in node.options]
        his = [b for _, b in ranges]
        return min(a for a, _ in ranges), None if None in his else max(b for b in his if b is not None)
    a, b = length_range(node.body)
    if b == 0:
        return 0, 0
    return a * node.lo, None if node.hi is None or b is None else b * node.hi


# ---------------------------------------------------------------------------------------------
# the parser (ECMA-262 without the `u` and `v` flags, as JSON Schema specifies; Python's `(?P<n>...)`
# is accepted since pydantic users write it)


class _Parser:
    def __init__(self, pattern: str):
        self.p, self.i = pattern, 0

    def fail(self, construct: str, at: int | None = None) -> RegexUnsupported:
        return RegexUnsupported(f"{construct} at position {self.i if at is None else at} of the pattern")

    def peek(self, k: int = 0) -> str:
        return self.p[self.i + k] if self.i + k < len(self.p) else ""

    def parse(self) -> Node:
        """Top level: alternatives, each anchored or not at either end."""
        options = []
        while True:
            options.append(self._top_alternative())
            if self.peek() != "|":
                break
            self.i += 1
        if self.i != len(self.p):
            raise self.fail("unbalanced ')'")
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def _top_alternative(self) -> Node:
        start_anchored = self.peek() == "^"
        if start_anchored:
            self.i += 1
        items = self._sequence(top=True)
        end_anchored = self.peek() == "$"
        if end_anchored:
            self.i += 1
            if self.peek() not in ("", "|"):
                raise self.fail("anchor '$' inside the pattern", self.i - 1)
        body = Seq(tuple(items))
        return Seq(((EMPTY if start_anchored else ANY_STRING), body, (EMPTY if end_anchored else ANY_STRING)))

    def _alternation(self) -> Node:
        options = [Seq(tuple(self._sequence(top=False)))]
        while self.peek() == "|":
            self.i += 1
            options.append(Seq(tuple(self._sequence(top=False))))
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def _sequence(self, top: bool) -> list[Node]:
        items: list[Node] = []
        while self.peek() not in ("", "|", ")"):
            c = self.peek()
            if c == "$" and top and self.peek(1) in ("", "|"):
                break
            if c in "^$":
                raise self.fail(f"anchor '{c}' inside the pattern")
            items.append(self._quantified(self._atom()))
        return items

    def _atom(self) -> Node:
        c = self.peek()
        self.i += 1
        if c == ".":
            return Chars(_negate(_LINE_TERMINATORS))
        if c == "[":
            return Chars(self._class())
        if c == "(":
            return self._group()
        if c == "\\":
            return Chars(self._escape(in_class=False))
        if c in "*+?":
            raise self.fail(f"nothing to repeat before '{c}'", self.i - 1)
        if c == "{" and self._bounds_ahead(self.i - 1):
            raise self.fail("nothing to repeat before '{'", self.i - 1)
        return Chars(((ord(c), ord(c)),))

    def _group(self) -> Node:
        start = self.i - 1
        if self.peek() == "?":
            two = self.p[self.i : self.i + 3]
            if two.startswith("?:"):
                self.i += 2
            elif two in ("?<=", "?<!") or two[:2] in ("?=", "?!"):
                kind = two if two in ("?<=", "?<!") else two[:2]
                raise self.fail(f"lookaround '({kind}...)'", start)
            elif two.startswith("?<") or two.startswith("?P<"):
                end = self.p.find(">", self.i)
                if end < 0:
                    raise self.fail("unterminated group name", start)
                self.i = end + 1
            else:
                raise self.fail(f"inline flag group '({two[:2]}...)'", start)
        node = self._alternation()
        if self.peek() != ")":
            raise self.fail("unterminated group", start)
        self.i += 1
        return node

    def _bounds_ahead(self, at: int) -> tuple[int, int | None] | None:
        """`{n}`, `{n,}`, `{n,m}` at `at` (returns the bounds and leaves self.i), else None."""
        end = self.p.find("}", at)
        if end < 0:
            return None
        body = self.p[at + 1 : end]
        lo, comma, hi = body.partition(",")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return None
        return int(lo), (int(hi) if hi else None) if comma else int(lo)

    def _quantified(self, atom: Node) -> Node:
        while True:
            c = self.peek()
            if c in ("*", "+", "?"):
                self.i += 1
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            elif c == "{" and (bounds := self._bounds_ahead(self.i)) is not None:
                lo, hi = bounds
                if hi is not None and hi < lo:
                    raise self.fail(f"quantifier {{{lo},{hi}}} out of order")
                if max(lo, hi or 0) > MAX_REPEAT:
                    raise self.fail(f"quantifier bound over {MAX_REPEAT}")
                self.i = self.p.find("}", self.i) + 1
            else:
                return atom
            if self.peek() == "?":  # lazy: the same set of strings
                self.i += 1
            if isinstance(atom, Repeat) and c != "?":
                raise self.fail("nested quantifier (e.g. 'a**'); use a group")
            atom = Repeat(atom, lo, hi)

    def _escape(self, in_class: bool) -> Ranges:
        c = self.peek()
        if c == "":
            raise self.fail("trailing '\\'")
        self.i += 1
        if c in _CLASS_ESCAPES:
            return _CLASS_ESCAPES[c]
        if c in _CHAR_ESCAPES:
            return ((_CHAR_ESCAPES[c], _CHAR_ESCAPES[c]),)
        if c == "b" and in_class:
            return ((0x08, 0x08),)
        if c in _REFUSED_ESCAPES:
            raise self.fail(_REFUSED_ESCAPES[c], self.i - 2)
        if c == "0" and not self.peek().isdigit():
            return ((0, 0),)
        if c.isdigit():
            raise self.fail(f"backreference '\\{c}'", self.i - 2)
        if c in "xu":
            n = 2 if c == "x" else 4
            digits = self.p[self.i : self.i + n]
            if len(digits) != n or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.fail(f"malformed escape '\\{c}'", self.i - 2)
            self.i += n
            cp = int(digits, 16)
            return ((cp, cp),)
        if c.isalnum():
            raise self.fail(f"unknown escape '\\{c}'", self.i - 2)
        return ((ord(c), ord(c)),)  # identity escape of a syntax character

    def _class(self) -> Ranges:
        start = self.i - 1
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        parts: list[tuple[int, int]] = []
        first = True
        while True:
            c = self.peek()
            if c == "":
                raise self.fail("unterminated character class", start)
            if c == "]" and not first:
                self.i += 1
                break
            if c == "[" and self.peek(1) in (":", "=", "."):
                raise self.fail("POSIX class '[:...:]' (not ECMA-262)")
            first = False
            lo_set = self._class_atom()
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.i += 1
                hi_set = self._class_atom()
                if len(lo_set) != 1 or len(hi_set) != 1 or lo_set[0][0] != lo_set[0][1]:
                    raise self.fail("range with a class escape as an end")
                if hi_set[0][0] != hi_set[0][1] or hi_set[0][0] < lo_set[0][0]:
                    raise self.fail("character range out of order")
                parts.append((lo_set[0][0], hi_set[0][0]))
            else:
                parts.extend(lo_set)
        ranges = _norm(parts)
        return _negate(ranges) if negated else ranges

    def _class_atom(self) -> Ranges:
        c = self.peek()
        self.i += 1
        if c == "\\":
            return self._escape(in_class=True)
        return ((ord(c), ord(c)),)


def parse_pattern(pattern: str) -> Node:
    """The set of strings a JSON Schema `pattern` accepts (unanchored ends matched by any text)."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise RegexUnsupported(f"pattern longer than {MAX_PATTERN_CHARS} characters")
    return _Parser(pattern).parse()


# ---------------------------------------------------------------------------------------------
# formats: practical regular languages (README, "Structured output")

_OCTET = r"(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_LEAP = r"(\d\d(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29"
_DATE = (
    r"(\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|(0[469]|11)-(0[1-9]|[12]\d|30)|02-(0[1-9]|1\d|2[0-8]))"
    rf"|{_LEAP})"
)
_TIME = r"([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)"
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"  # 63-character label limit not kept: it multiplies states
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
FORMATS = {
    "date": f"^{_DATE}$",
    "time": f"^{_TIME}$",
    "date-time": f"^{_DATE}T{_TIME}$",
    "email": rf"^{_ATOM}(\.{_ATOM})*@{_LABEL}(\.{_LABEL})+$",
    "uuid": r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
    "ipv4": rf"^{_OCTET}(\.{_OCTET}){{3}}$",
    "uri": r"^[A-Za-z][A-Za-z0-9+.\-]*:([A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})*$",
    "hostname": rf"^{_LABEL}(\.{_LABEL})*$",
}


# ---------------------------------------------------------------------------------------------
# the EBNF writer


def _ebnf_char(cp: int) -> str:
    return f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"


_JSON_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r"}
_MUST_ESCAPE: Ranges = _norm([(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])


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
        ranges = _minus(ranges, _SURROGATES)
        if not ranges:
            return None
        if ranges not in self._sets:
            raw = _minus(ranges, _MUST_ESCAPE)
            alts = []
            if raw:
                alts.append(
                    "["
                    + "".join(_ebnf_char(a) + ("" if a == b else "-" + _ebnf_char(b)) for a, b in raw)
                    + "]"
                )
            for lo, hi in _minus(ranges, _negate(_MUST_ESCAPE)):
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
            self.edges[s].append((_minus(node.ranges, _SURROGATES), t))
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
        return {k: _norm(v) for k, v in groups.items()}


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
