"""A JSON Schema `pattern` or `format` as a small tree: the ECMA-262 subset we can enforce exactly.

The first half of the string-limit translation (grammar_regex.py writes the tree as EBNF): character
sets as sorted, disjoint code point ranges, the tree (`Chars`, `Seq`, `Alt`, `Repeat`), the parser,
and the formats as patterns. Lookarounds, backreferences, word boundaries, Unicode property escapes
and inline flags are refused by name (RegexUnsupported), never dropped.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

MAX_CODEPOINT = 0x10FFFF
MAX_PATTERN_CHARS = 10_000
MAX_REPEAT = 10**9  # a bound above this is not a number anyone means

Ranges = tuple[tuple[int, int], ...]


class RegexUnsupported(ValueError):
    """A pattern we cannot enforce exactly; the message names the construct and its position."""


# ---------------------------------------------------------------------------------------------
# character sets: sorted, disjoint, non-adjacent (lo, hi) code point ranges


def norm(ranges: list[tuple[int, int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def negate(ranges: Ranges) -> Ranges:
    out, nxt = [], 0
    for lo, hi in ranges:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODEPOINT:
        out.append((nxt, MAX_CODEPOINT))
    return tuple(out)


def minus(a: Ranges, b: Ranges) -> Ranges:
    """a without b (both normalised)."""
    neg = negate(b)
    out = []
    for lo, hi in a:
        for nlo, nhi in neg:
            if nlo <= hi and lo <= nhi:
                out.append((max(lo, nlo), min(hi, nhi)))
    return norm(out)


SURROGATES: Ranges = ((0xD800, 0xDFFF),)  # not encodable in UTF-8: never in a JSON string's text
_DIGIT: Ranges = ((0x30, 0x39),)
_WORD: Ranges = norm([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
_SPACE: Ranges = norm(
    [(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029)]
    + [(0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)]
)
_LINE_TERMINATORS: Ranges = norm([(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)])
_ANY: Ranges = ((0, MAX_CODEPOINT),)
_CLASS_ESCAPES = {
    "d": _DIGIT,
    "D": negate(_DIGIT),
    "w": _WORD,
    "W": negate(_WORD),
    "s": _SPACE,
    "S": negate(_SPACE),
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
            return Chars(negate(_LINE_TERMINATORS))
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
        ranges = norm(parts)
        return negate(ranges) if negated else ranges

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
