"""Bounds on what one request may ask of the server, so a hostile or huge request is refused with a
4xx naming the bound, fast, and never slows the requests already streaming.

Each bound is a `modeldeploy serve` flag (`add_limit_flags`) and a field of `Limits`; the refusal
names the flag, so an operator knows which knob a client ran into. Defaults follow OpenAI's
documented request limits where they have one (128 tools, 1,000 enum values) and measurements on
the CPU reference machine elsewhere (bench/results/hostile_input.md):
- the body is read only up to `max_body_bytes` (413 before any JSON parsing);
- a grammar (JSON Schema, tool parameters) is checked against `max_grammar_bytes`, `max_schema_depth`,
  `max_schema_enum` and `max_pattern_rules` before anything is compiled: those checks are linear in
  the schema's size and run in milliseconds, while xgrammar's compile of a grammar that passes them
  can still take seconds (a length window on a broad character class), hence
- `grammar_compile_timeout_s`: a compile still running after it is a 400. xgrammar cannot interrupt
  a compile, so it finishes on the engine's low-priority compile thread (its result is cached).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from modeldeploy.runtime.engine.structured_output.limits import SchemaLimits


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 2 * 1024 * 1024
    max_tools: int = 128
    max_grammar_bytes: int = 64 * 1024
    max_schema_depth: int = 32
    max_schema_enum: int = 1000
    max_pattern_rules: int = 256
    grammar_compile_timeout_s: float = 5.0
    max_logprob_entries: int = 64  # n x top_logprobs: entries formatted per generated position

    def validate(self) -> None:
        """ValueError naming the flag of the first bound that is not positive."""
        for name, flag, _, _ in _FLAGS:
            if not getattr(self, name) > 0:
                raise ValueError(f"{flag} must be > 0, got {getattr(self, name)}")

    def schema(self) -> SchemaLimits:
        """The engine's view: the schema checks it runs before a grammar is compiled."""
        return SchemaLimits(
            max_bytes=self.max_grammar_bytes,
            max_depth=self.max_schema_depth,
            max_enum=self.max_schema_enum,
            max_pattern_rules=self.max_pattern_rules,
        )


# field, flag, type, help (the default is appended)
_FLAGS: tuple[tuple[str, str, type, str], ...] = (
    ("max_body_bytes", "--max-body-bytes", int, "request body bytes; a larger body is refused (413)"),
    ("max_tools", "--max-tools", int, "tools one request may declare"),
    (
        "max_grammar_bytes",
        "--max-grammar-bytes",
        int,
        "bytes of one request's grammar: its JSON Schema (or all tool schemas) plus the EBNF of its patterns",
    ),
    ("max_schema_depth", "--max-schema-depth", int, "nesting depth of a JSON Schema (subschemas within)"),
    ("max_schema_enum", "--max-schema-enum", int, "enum and const values in one JSON Schema, together"),
    (
        "max_pattern_rules",
        "--max-pattern-rules",
        int,
        "grammar rules one string `pattern`/`format` with a length window may expand into",
    ),
    (
        "grammar_compile_timeout_s",
        "--grammar-compile-timeout",
        float,
        "seconds a grammar may take to compile; beyond: 400",
    ),
    (
        "max_logprob_entries",
        "--max-logprob-entries",
        int,
        "n x top_logprobs (completions: n x logprobs) of one request",
    ),
)
FLAG = {name: flag for name, flag, _, _ in _FLAGS}
# SchemaLimits field -> the flag that sets it
SCHEMA_FLAG = {
    "max_bytes": "--max-grammar-bytes",
    "max_depth": "--max-schema-depth",
    "max_enum": "--max-schema-enum",
    "max_pattern_rules": "--max-pattern-rules",
}


def add_limit_flags(p: argparse.ArgumentParser) -> None:
    """The request-limit flags of `modeldeploy serve`, dest = the Limits field's name."""
    defaults = Limits()
    group = p.add_argument_group("request limits (hostile or oversized requests get a 4xx naming the flag)")
    for name, flag, kind, help_ in _FLAGS:
        default = getattr(defaults, name)
        group.add_argument(
            flag,
            dest=name,
            type=kind,
            default=default,
            metavar=flag[2:].replace("-", "_").upper(),
            help=f"{help_} (default: {default})",
        )


def limits_from_args(args: Any) -> Limits:
    """The Limits of parsed `serve` flags (defaults for any flag the parser lacks); ValueError names
    the flag of a bound that is not positive."""
    defaults = Limits()
    limits = Limits(**{name: getattr(args, name, getattr(defaults, name)) for name, _, _, _ in _FLAGS})
    limits.validate()
    return limits
