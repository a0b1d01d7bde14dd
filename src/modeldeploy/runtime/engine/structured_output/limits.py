"""Bounds on a request's grammar (size, depth, enum values, pattern expansion), checked before anything
is compiled: grammar.py enforces them, the HTTP server sets them from its flags. Apart from grammar.py
so that the server reads them without importing xgrammar or torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchemaLimits:
    """Bounds on one request's grammar, checked before it is compiled (the server's flags set them:
    runtime/server/limits.py). The defaults are the server's; `None` fields are unbounded."""

    max_bytes: int | None = 64 * 1024  # the canonical schema JSON plus the EBNF written for its patterns
    max_depth: int | None = 32  # nested subschemas
    max_enum: int | None = 1000  # enum and const values, together
    max_pattern_rules: int | None = 256  # EBNF rules one pattern x length window may expand into


class GrammarLimitExceeded(ValueError):
    """A grammar over one of SchemaLimits' bounds; `limit` names the field, `where` the schema path."""

    def __init__(self, message: str, limit: str, where: str = "") -> None:
        super().__init__(message)
        self.limit, self.where = limit, where
