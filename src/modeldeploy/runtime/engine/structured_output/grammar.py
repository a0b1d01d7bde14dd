"""Constrained decoding through xgrammar: schema checks, compiled-grammar cache, per-step masks.

Why xgrammar (README, "Structured output"): CPU wheels, a packed int32 token bitmask filled for a
whole batch in one call (`BatchGrammarMatcher`), JSON Schema with `$ref`, numeric bounds and array
limits, millisecond compiles, Apache-2.0. No JSON state machine is written here.

String limits (`pattern`, `minLength`/`maxLength`, `format`) are the exception: xgrammar 0.2.9
enforces them wrongly (raw control characters under `maxLength`, patterns matched against raw JSON
text, lookaheads ignored), so grammar_regex.py writes them as EBNF over decoded characters and
`_rewrite` splices that into the EBNF xgrammar makes of the rest of the schema (still one grammar,
one matcher, one mask). A feature that would not be enforced is refused by `check_schema` with its
name and path, so a constrained request is never silently unconstrained; an unknown `format` is an
annotation (JSON Schema 2020-12's default, and what vLLM/xgrammar do) and is ignored.
Compiles are cached by the sha256 of the canonical schema in a bounded LRU; `compile` is
thread-safe and meant to run on a worker thread, off the step loop. With `SchemaLimits` (the
server's flags) a schema over a size, depth, enum or pattern-expansion bound is refused before any
compile (GrammarLimitExceeded naming the bound): xgrammar cannot interrupt a compile once started.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import threading
import time
from collections import OrderedDict
from importlib.metadata import version
from typing import Any

import torch
import xgrammar as xgr

from modeldeploy.runtime.engine.core.sequence import Sequence
from modeldeploy.runtime.engine.output import CompileResult
from modeldeploy.runtime.engine.sampling_params import Structured
from modeldeploy.runtime.engine.structured_output import grammar_regex as rx
from modeldeploy.runtime.engine.structured_output import regex_syntax as syntax
from modeldeploy.runtime.engine.structured_output.limits import GrammarLimitExceeded, SchemaLimits

LIBRARY = {"name": "xgrammar", "version": version("xgrammar")}

# Enforced by xgrammar 0.2: each one probed with a violating document, in
# tests/runtime/engine/structured_output/test_structured_engine.py (test_supported_keywords_are_enforced).
_ENFORCED = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "enum", "const",
    "anyOf", "$ref", "$defs", "definitions", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "pattern", "format", "minItems", "maxItems", "minLength", "maxLength",
    "patternProperties", "propertyNames", "minProperties", "maxProperties", "contains", "minContains",
    "maxContains", "allOf",
}  # fmt: skip
_ANNOTATIONS = {
    "title", "description", "examples", "default", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly",
}  # fmt: skip
# Formats xgrammar enforces that regex_syntax.FORMATS does not write (alone only: no length limits)
_XGRAMMAR_FORMATS = {"duration", "ipv6", "uri-reference"}
_STRING_LIMITS = ("pattern", "minLength", "maxLength")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SUBSCHEMAS = ("items", "additionalProperties", "propertyNames", "contains")
_SUBSCHEMA_LISTS = ("anyOf", "allOf", "prefixItems")


class UnsupportedSchema(ValueError):
    """A schema feature the grammar library cannot enforce; the message names it and where."""

    def __init__(self, feature: str, where: str):
        super().__init__(f"unsupported JSON Schema feature '{feature}' at {where or '/'}")
        self.feature, self.where = feature, where


class PatternTooLarge(UnsupportedSchema):
    """A pattern x length window too large to write as a grammar (a size bound, not a construct)."""


def check_schema(schema: Any, where: str = "", limits: SchemaLimits | None = None) -> None:
    """Raise UnsupportedSchema for the first keyword that would not be enforced, GrammarLimitExceeded
    for the first of `limits` it exceeds (depth, enum values, pattern expansion, EBNF bytes). The walk
    stops at the depth bound, so its work is linear in a schema that passes."""
    _Walk(limits or _UNBOUNDED).check(schema, where, 0)


_UNBOUNDED = SchemaLimits(None, None, None, None)


class _Walk:
    """One check_schema pass: the running totals that `limits` bound."""

    def __init__(self, limits: SchemaLimits):
        self.limits, self.enum, self.ebnf_bytes = limits, 0, 0

    def check(self, schema: Any, where: str, depth: int) -> None:
        if isinstance(schema, bool):
            return
        if not isinstance(schema, dict):
            raise UnsupportedSchema(f"schema of type {type(schema).__name__}", where)
        lim = self.limits
        if lim.max_depth is not None and depth > lim.max_depth:
            raise GrammarLimitExceeded(
                f"schema nested deeper than {lim.max_depth} levels at {where}", "max_depth", where
            )
        for key, value in schema.items():
            if key in _ANNOTATIONS:
                continue
            if key not in _ENFORCED:
                raise UnsupportedSchema(key, where)
            at = f"{where}/{key}"
            self._count_values(key, value, at)
            if key == "allOf" and len(value) != 1:
                raise UnsupportedSchema("allOf with more than one subschema", at)
            if key == "$ref" and not (isinstance(value, str) and value.startswith("#")):
                raise UnsupportedSchema(f"$ref to {value!r} (only local '#/...' references)", at)
            if key in _SUBSCHEMA_MAPS and isinstance(value, dict):
                for name, sub in value.items():
                    self.check(sub, f"{at}/{name}", depth + 1)
            elif key in _SUBSCHEMAS:
                self.check(value, at, depth + 1)
            elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
                for i, sub in enumerate(value):
                    self.check(sub, f"{at}/{i}", depth + 1)
        self._strings(schema, where)

    def _strings(self, schema: dict[str, Any], where: str) -> None:
        """This schema's own string limits, written (and so bounded) as the compile will write them."""
        lim = self.limits
        try:
            built = _string_grammar(schema, where, "check")
        except PatternTooLarge as e:
            if lim.max_pattern_rules is None:
                raise
            raise GrammarLimitExceeded(
                f"a string pattern/format with its length window expands into more than "
                f"{lim.max_pattern_rules} grammar rules at {e.where} ({e.feature})",
                "max_pattern_rules",
                e.where,
            ) from None
        if built is not None:
            self._count_rules(built, where)

    def _count_values(self, key: str, value: Any, at: str) -> None:
        if key not in ("enum", "const") or self.limits.max_enum is None:
            return
        self.enum += len(value) if key == "enum" and isinstance(value, list) else 1
        if self.enum > self.limits.max_enum:
            raise GrammarLimitExceeded(
                f"more than {self.limits.max_enum} enum/const values in the schema (at {at})", "max_enum", at
            )

    def _count_rules(self, built: tuple[str, dict[str, str]], where: str) -> None:
        expr, rules = built
        lim = self.limits
        if lim.max_pattern_rules is not None and len(rules) > lim.max_pattern_rules:
            raise GrammarLimitExceeded(
                f"a string pattern/format with its length window expands into {len(rules)} grammar "
                f"rules at {where or '/'}, over {lim.max_pattern_rules} (bound the lengths inside the "
                "pattern, or drop minLength/maxLength)",
                "max_pattern_rules",
                where,
            )
        self.ebnf_bytes += len(expr) + sum(len(k) + len(v) + 5 for k, v in rules.items())
        if lim.max_bytes is not None and self.ebnf_bytes > lim.max_bytes:
            raise GrammarLimitExceeded(
                f"the grammar written for the schema's string patterns exceeds {lim.max_bytes} bytes "
                f"(at {where or '/'})",
                "max_bytes",
                where,
            )


def _count(schema: dict[str, Any], key: str, where: str) -> int | None:
    value = schema.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UnsupportedSchema(f"{key} {value!r} (a non-negative integer is required)", f"{where}/{key}")
    return value


def _string_grammar(schema: dict[str, Any], where: str, prefix: str) -> tuple[str, dict[str, str]] | None:
    """The EBNF (expression, rules) of this schema's string limits, or None when it has none that
    we write (no limits, an unknown format, or a format xgrammar enforces alone)."""
    fmt = schema.get("format") if isinstance(schema.get("format"), str) else None
    ours = fmt if fmt in syntax.FORMATS else None
    limits = [k for k in _STRING_LIMITS if k in schema]
    if fmt in _XGRAMMAR_FORMATS and limits:
        raise UnsupportedSchema(f"format {fmt!r} together with {limits[0]}", f"{where}/format")
    if not limits and ours is None:
        return None
    types = _types(schema)
    if types is not None and "string" not in types:
        return None  # string keywords do not apply to other types (_rewrite drops them)
    first = (limits or ["format"])[0]
    if types is None:
        raise UnsupportedSchema(f'{first} without "type": "string"', f"{where}/{first}")
    if "enum" in schema or "const" in schema:
        raise UnsupportedSchema(
            f"{first} together with enum/const (list only the values that qualify)", where
        )
    lo, hi = _count(schema, "minLength", where) or 0, _count(schema, "maxLength", where)
    if hi is not None and hi < lo:
        raise UnsupportedSchema(f"minLength {lo} greater than maxLength {hi}", f"{where}/maxLength")
    pattern = schema.get("pattern")
    if pattern is not None and not isinstance(pattern, str):
        raise UnsupportedSchema(f"pattern of type {type(pattern).__name__}", f"{where}/pattern")
    if pattern is not None and ours is not None:
        raise UnsupportedSchema(f"format {fmt!r} together with pattern", f"{where}/format")
    source, key = (pattern, "pattern") if pattern is not None else (syntax.FORMATS.get(fmt or ""), "format")
    try:
        node = syntax.parse_pattern(source) if source is not None else syntax.ANY_STRING
        return rx.string_ebnf(node, lo, hi, prefix)
    except rx.RegexTooLarge as e:
        at = f"{where}/{key if source is not None else 'maxLength'}"
        raise PatternTooLarge(f"{key}: {e}", at) from None
    except syntax.RegexUnsupported as e:
        raise UnsupportedSchema(
            f"{key}: {e}", f"{where}/{key if source is not None else 'maxLength'}"
        ) from None


def _types(schema: dict[str, Any]) -> list[str] | None:
    t = schema.get("type")
    return t if isinstance(t, list) else [t] if isinstance(t, str) else None


_PLACEHOLDER = "mdxstr{}q"
_PLACEHOLDER_RE = re.compile(r'Regex\("\^mdxstr(\d+)q\$", json_string=true\)')


def _rewrite(schema: Any, pieces: list[tuple[str, dict[str, str]]]) -> Any:
    """A copy of a checked schema whose string limits are placeholder patterns; their EBNF goes
    into `pieces`, in placeholder order."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _rewrite(sub, pieces) for name, sub in value.items()}
        elif key in _SUBSCHEMAS:
            out[key] = _rewrite(value, pieces)
        elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
            out[key] = [_rewrite(sub, pieces) for sub in value]
        else:
            out[key] = copy.deepcopy(value)
    built = _string_grammar(schema, "", f"mdx{len(pieces)}")
    types = _types(schema)
    if types is not None and "string" not in types:
        for key in (*_STRING_LIMITS, "format"):
            out.pop(key, None)
    if built is not None:
        for key in (*_STRING_LIMITS, "format"):
            out.pop(key, None)
        out["pattern"] = "^" + _PLACEHOLDER.format(len(pieces)) + "$"
        pieces.append(built)
    return out


def schema_ebnf(schema_json: str, strict: bool = True) -> str | None:
    """The whole schema as EBNF with our string grammars spliced in; None when it has no string
    limits we write (xgrammar then compiles the schema itself)."""
    pieces: list[tuple[str, dict[str, str]]] = []
    rewritten = _rewrite(json.loads(schema_json), pieces)
    if not pieces:
        return None
    text = str(xgr.Grammar.from_json_schema(json.dumps(rewritten), any_whitespace=False, strict_mode=strict))
    used: set[int] = set()

    def splice(m: re.Match[str]) -> str:
        used.add(int(m.group(1)))
        return f"({pieces[int(m.group(1))][0]})"

    text = _PLACEHOLDER_RE.sub(splice, text)
    if used != set(range(len(pieces))):  # a string the grammar lost would be silently free
        raise ValueError("response_format: a string limit could not be placed in the grammar")
    rules = "\n".join(f"{name} ::= {body}" for _, extra in pieces for name, body in extra.items())
    return f"{text}\n{rules}\n"


def tool_tag_spec(
    call_schema: dict[str, Any],
    begin: str,
    end: str,
    stop_after_first: bool,
    limits: SchemaLimits | None = None,
) -> Structured:
    """Free text until `begin` appears; then a JSON call matching call_schema, closed by `end`
    (xgrammar's triggered structural tag). The call schema must have passed check_schema."""
    check_schema(call_schema, "", limits)
    _check_bytes(json.dumps(call_schema, separators=(",", ":")), limits)
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "triggered_tags",
            "triggers": [begin],
            "tags": [
                {
                    "type": "tag",
                    "begin": begin,
                    "content": {"type": "json_schema", "json_schema": call_schema},
                    "end": end,
                }
            ],
            "at_least_one": False,
            "stop_after_first": stop_after_first,
        },
    }
    return Structured("structural_tag", json.dumps(tag, separators=(",", ":")))


def schema_spec(kind: str, schema: Any = None, limits: SchemaLimits | None = None) -> Structured:
    """A Structured constraint with the schema checked and in canonical JSON (the cache key); with
    `limits`, GrammarLimitExceeded for a schema over them (its canonical JSON counts to max_bytes)."""
    if kind == "json_object":
        return Structured("json_object")
    check_schema(schema, "", limits)
    # key order is kept: it is the order the properties are generated in
    text = json.dumps(schema, separators=(",", ":"))
    _check_bytes(text, limits)
    return Structured("json_schema", text)


def _check_bytes(text: str, limits: SchemaLimits | None) -> None:
    size = len(text.encode())
    if limits is not None and limits.max_bytes is not None and size > limits.max_bytes:
        raise GrammarLimitExceeded(
            f"the schema is {size} bytes as compact JSON, over {limits.max_bytes}", "max_bytes"
        )


def _tag_with_ebnf(tag_json: str) -> str:
    """A structural tag whose JSON-schema contents with string limits become our EBNF grammars."""
    tag = json.loads(tag_json)
    for item in tag["format"].get("tags", []):
        content = item.get("content", {})
        if content.get("type") == "json_schema":
            ebnf = schema_ebnf(json.dumps(content["json_schema"]))
            if ebnf is not None:
                item["content"] = {"type": "grammar", "grammar": ebnf}
    return json.dumps(tag)


class GrammarCompiler:
    """Compiled grammars by schema hash, bounded LRU; `compile` may run on any thread."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: list[int], cache_size: int = 64):
        self.info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=eos_token_ids
        )
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        self.vocab_size = vocab_size
        self.cache_size = cache_size
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(spec: Structured) -> str:
        return hashlib.sha256(f"{spec.kind}\0{spec.schema or ''}".encode()).hexdigest()

    def compile(self, spec: Structured) -> CompileResult:
        """Compile (or fetch) and store it in spec.compiled; ValueError names an invalid schema."""
        start = time.perf_counter()
        key = self.key(spec)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
        cached = hit is not None
        if hit is None:
            hit = self._compile(spec)
            with self._lock:
                self._cache[key] = hit
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        spec.compiled = hit
        return CompileResult(hit, time.perf_counter() - start, cached)

    def _compile(self, spec: Structured) -> Any:
        if spec.kind == "json_object":
            schema, strict = '{"type": "object"}', False
        elif spec.schema is None:
            raise ValueError(f"response_format: a {spec.kind} constraint needs a schema")
        else:
            schema, strict = spec.schema, True
        try:
            if spec.kind == "structural_tag":
                return self.compiler.compile_structural_tag(_tag_with_ebnf(schema))
            ebnf = schema_ebnf(schema, strict)
            if ebnf is not None:
                return self.compiler.compile_grammar(ebnf)
            return self.compiler.compile_json_schema(schema, any_whitespace=False, strict_mode=strict)
        except (RuntimeError, ValueError) as e:
            raise ValueError(f"response_format: the schema cannot be compiled: {e}") from None

    def __len__(self) -> int:
        return len(self._cache)

    def matcher(self, spec: Structured) -> Any:
        compiled = spec.compiled if spec.compiled is not None else self.compile(spec).compiled
        return xgr.GrammarMatcher(compiled)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """xgrammar's masking kernel (CPU, CUDA) on the constrained rows, in place, in one call."""
    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True), indices=rows)
    return logits


class GrammarMasks:
    """The per-step side: one bitmask for the batch, filled for the constrained rows in one call."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self._batch = xgr.BatchGrammarMatcher(max_threads=1)

    def fill(self, seqs: list[Sequence]) -> tuple[torch.Tensor | None, list[int]]:
        rows = [i for i, s in enumerate(seqs) if s.grammar is not None]
        if not rows:
            return None, rows
        bitmask = xgr.allocate_token_bitmask(len(seqs), self.vocab_size)
        self._batch.batch_fill_next_token_bitmask([seqs[i].grammar for i in rows], bitmask, rows)
        return bitmask, rows

    @staticmethod
    def accept(seqs: list[Sequence], tokens: list[int], rows: list[int]) -> list[Sequence]:
        """Advance each constrained row's grammar; returns the sequences whose token it refused
        (it allowed none: cannot happen with its own mask, but must not take the engine down)."""
        if not rows:
            return []
        ok = xgr.BatchGrammarMatcher.batch_accept_token(
            [seqs[i].grammar for i in rows], [tokens[i] for i in rows]
        )
        return [seqs[r] for r, good in zip(rows, ok, strict=True) if not good]
