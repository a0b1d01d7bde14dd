"""String and array limits as clients write them (pydantic `Field(max_length=..., pattern=...)`,
`conlist`): `minLength`/`maxLength`, `pattern`, `format`, `minItems`/`maxItems`.

Three kinds of evidence: (1) the compiled grammar accepts exactly the valid strings, checked
exhaustively over every short string of a small alphabet (quote, backslash and newline included)
against Python's `re.search` and the length window; (2) a random-weight model sampling under the
grammar produces only documents jsonschema validates; (3) what cannot be enforced, or would not
compile in bounded time, is refused by name and path."""

from __future__ import annotations

import datetime
import ipaddress
import itertools
import json
import re
import time
import uuid

import jsonschema
import pytest

from modeldeploy.runtime import LLM, SamplingParams
from modeldeploy.runtime.engine.structured_output import grammar_regex as rx
from modeldeploy.runtime.engine.structured_output.grammar import UnsupportedSchema, check_schema, schema_spec

ALPHABET = ["a", "b", "-", '"', "\\", "\n", "é"]


@pytest.fixture(scope="module")
def llm(llama_dir):
    return LLM(llama_dir, dtype="float32", max_num_seqs=128, max_model_len=512)


def _accepts(llm, schema, text: str) -> bool:
    m = llm.engine.grammars.matcher(schema_spec("json_schema", schema))
    return bool(m.accept_string(text) and m.is_completed())


def _strings(max_len: int):
    for n in range(max_len + 1):
        for chars in itertools.product(ALPHABET, repeat=n):
            yield "".join(chars)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "maxLength": 2},
        {"type": "string", "minLength": 2, "maxLength": 3},
        {"type": "string", "minLength": 3},
        {"type": "string", "pattern": "^[ab]+$", "maxLength": 2},
        {"type": "string", "pattern": "ab"},  # unanchored: contains "ab"
        {"type": "string", "pattern": "^a|b$"},  # anchors bind per alternative
        {"type": "string", "pattern": '^(a|"|\\\\)*-?$', "minLength": 1, "maxLength": 3},
        {"type": "string", "pattern": "^(ab|a)+$", "minLength": 2, "maxLength": 3},
        {"type": "string", "pattern": "^[^a-]{2}$"},
        {"type": "string", "pattern": "^.\\n?$"},
        {"type": "string", "pattern": "^[a-b]+-[a-b]*$", "maxLength": 3},
    ],
)
def test_grammar_accepts_exactly_the_valid_strings(llm, schema):
    """Every string of up to 3 characters over ALPHABET (343 + 57 strings), JSON-encoded as the
    model would write it (shortest escapes, raw UTF-8): accepted iff jsonschema's semantics say so."""
    pattern = schema.get("pattern")
    if pattern is not None:  # ECMA-262's '$' is the end; Python's also matches before a final newline
        pattern = pattern.replace("$", "\\Z")
    lo, hi = schema.get("minLength", 0), schema.get("maxLength", 10**9)
    mismatches = []
    for s in _strings(3):
        want = lo <= len(s) <= hi and (pattern is None or re.search(pattern, s) is not None)
        got = _accepts(llm, schema, json.dumps(s, ensure_ascii=False))
        if want != got:
            mismatches.append((s, want, got))
    assert not mismatches, mismatches[:10]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "pattern": "^(ab|a)+$", "minLength": 2, "maxLength": 3},
        {"type": "string", "pattern": "^[a-b]+-[a-b]*$", "maxLength": 3},
        {"type": "string", "pattern": "a|-", "minLength": 2},
        {"type": "string", "pattern": '^(a|"|\\\\)*-?$', "minLength": 1, "maxLength": 3},
    ],
)
def test_automaton_fallback_accepts_exactly_the_valid_strings(llm, schema, monkeypatch):
    """The automaton x length product (used where the exact split is too large), forced here by a
    zero split budget: the same exhaustive comparison."""
    monkeypatch.setattr(rx, "MAX_ALTERNATIVES", 0)
    rx._string_ebnf.cache_clear()
    schema = {**schema, "title": "automaton"}  # another grammar-cache key than the split's
    pattern = schema["pattern"].replace("$", "\\Z")
    lo, hi = schema.get("minLength", 0), schema.get("maxLength", 10**9)
    try:
        for s in _strings(3):
            want = lo <= len(s) <= hi and re.search(pattern, s) is not None
            assert _accepts(llm, schema, json.dumps(s, ensure_ascii=False)) == want, s
    finally:
        rx._string_ebnf.cache_clear()


def test_raw_control_characters_are_never_admitted(llm):
    """The xgrammar 0.2.9 bug that made us refuse maxLength: a raw newline inside the string."""
    for schema in ({"type": "string", "maxLength": 4}, {"type": "string", "pattern": "^[\\n\\t]{1,2}$"}):
        assert not _accepts(llm, schema, '"\n"')
        assert not _accepts(llm, schema, '"\t"')
        assert _accepts(llm, schema, '"\\n"')


FORMAT_CASES = {
    "date": (["2024-02-29", "1999-12-31"], ["2023-02-29", "2024-13-01", "2024-04-31", "24-01-01"]),
    "time": (["23:59:59Z", "00:00:00.5+05:30"], ["24:00:00Z", "12:00:00", "12:60:00Z"]),
    "date-time": (["2024-01-02T03:04:05Z"], ["2024-01-02 03:04:05Z", "2024-01-02T03:04:05"]),
    "email": (["a.b+c@example.com", "x@y.io"], ["a@b", "@x.com", "a..b@x.com", "a b@x.com"]),
    "uuid": (["123e4567-e89b-12d3-a456-426614174000"], ["123e4567e89b12d3a456426614174000", "g" * 36]),
    "ipv4": (["192.168.0.1", "0.0.0.0"], ["256.1.1.1", "1.2.3", "01.2.3.4"]),
    "uri": (["https://example.com/a?b=1#c", "urn:isbn:123"], ["no scheme", "1http://x", "http://a b"]),
}


@pytest.mark.parametrize("fmt", list(FORMAT_CASES))
def test_formats_accept_and_refuse(llm, fmt):
    good, bad = FORMAT_CASES[fmt]
    schema = {"type": "string", "format": fmt}
    for s in good:
        assert _accepts(llm, schema, json.dumps(s)), (fmt, s)
    for s in bad:
        assert not _accepts(llm, schema, json.dumps(s)), (fmt, s)


def test_unknown_format_is_an_annotation(llm):
    """As vLLM/xgrammar and JSON Schema 2020-12's default: an unknown format constrains nothing."""
    schema = {"type": "string", "format": "credit-card", "maxLength": 3}
    check_schema(schema)
    assert _accepts(llm, schema, '"abc"') and not _accepts(llm, schema, '"abcd"')


def _fail(v: str) -> None:
    raise ValueError(v)


def _format_ok(fmt: str, s: str) -> bool:
    checks = {
        "date": lambda v: datetime.date.fromisoformat(v),
        "date-time": lambda v: datetime.datetime.fromisoformat(v.replace("Z", "+00:00")),
        "time": lambda v: datetime.time.fromisoformat(v.replace("Z", "+00:00")),
        "uuid": uuid.UUID,
        "ipv4": ipaddress.IPv4Address,
        "email": lambda v: re.fullmatch(r"[^@\s]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+", v) or _fail(v),
    }
    try:
        checks[fmt](s)
    except ValueError:
        return False
    return True


SAMPLED = {
    "limits": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 2, "maxLength": 6},
            "code": {"type": "string", "pattern": "^[A-Z][a-z0-9]*$", "maxLength": 5},
            "tags": {
                "type": "array",
                "items": {"type": "string", "maxLength": 3},
                "minItems": 1,
                "maxItems": 3,
            },
            "note": {"type": "string", "pattern": "x|y", "maxLength": 4},
        },
        "required": ["name", "code", "tags", "note"],
    },
    "formats": {
        "type": "object",
        "properties": {
            **{f: {"type": "string", "format": f} for f in ("date", "time", "uuid", "ipv4")},
            "email": {"type": "string", "format": "email", "maxLength": 24},
        },
        "required": ["date", "time", "uuid", "ipv4", "email"],
    },
}


@pytest.mark.parametrize("name", list(SAMPLED))
def test_sampled_outputs_validate(llm, name):
    """100 seeded samples at temperature 1 from the random model: every finished output validates
    (jsonschema, formats checked with the standard library); none is left unfinished."""
    schema = SAMPLED[name]
    params = [
        SamplingParams(max_tokens=300, temperature=1.0, seed=i, structured=schema_spec("json_schema", schema))
        for i in range(100)
    ]
    outs = llm.generate([f"Record {i}: " for i in range(100)], params)
    for o in outs:
        assert o.finish_reason == "stop", (o.finish_reason, o.text)
        doc = json.loads(o.text)
        jsonschema.validate(doc, schema)
        if name == "formats":
            assert all(_format_ok(f, doc[f]) for f in doc), doc
    assert len({o.text for o in outs}) > 50  # the grammar constrains, it does not fix the output


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        (
            {"type": "string", "pattern": "^(?=a)b"},
            "lookaround '(?=...)' at position 1 of the pattern' at /pattern",
        ),
        ({"type": "string", "pattern": "(?<!a)b"}, "lookaround '(?<!...)'"),
        ({"type": "string", "pattern": "(a)\\1"}, "backreference '\\1' at position 3"),
        ({"type": "string", "pattern": "\\bword"}, "word boundary '\\b'"),
        ({"type": "string", "pattern": "\\p{L}+"}, "Unicode property escape '\\p'"),
        ({"type": "string", "pattern": "(?i)abc"}, "inline flag group '(?i...)'"),
        ({"type": "string", "pattern": "[[:alpha:]]"}, "POSIX class"),
        ({"type": "string", "pattern": "a$b"}, "anchor '$' inside the pattern"),
        ({"type": "string", "pattern": "(a"}, "unterminated group"),
        ({"type": "string", "pattern": "[b-a]"}, "character range out of order"),
        ({"type": "string", "pattern": "\\Aabc\\Z"}, "anchor '\\A'"),
        (
            {"type": "object", "properties": {"x": {"type": "string", "pattern": "a**"}}},
            "at /properties/x/pattern",
        ),
        (
            {"type": "string", "minLength": 1.5},
            "minLength 1.5 (a non-negative integer is required)' at /minLength",
        ),
        ({"type": "string", "pattern": "^[a-c]{2}$", "minLength": 3}, "no string satisfies"),
        ({"type": "string", "format": "date", "pattern": "^2"}, "format 'date' together with pattern"),
        ({"maxLength": 2}, 'maxLength without "type": "string"\' at /maxLength'),
        ({"type": "string", "enum": ["abcdef", "x"], "maxLength": 3}, "maxLength together with enum/const"),
    ],
)
def test_unenforceable_patterns_are_refused_by_name_and_path(schema, named):
    with pytest.raises(UnsupportedSchema) as e:
        check_schema(schema)
    assert named in str(e.value)


def test_string_keywords_apply_to_strings_only(llm):
    """JSON Schema: maxLength on an integer constrains nothing; on a nullable string, the string."""
    assert _accepts(llm, {"type": "integer", "maxLength": 1}, "12345")
    nullable = {"type": ["string", "null"], "maxLength": 2}
    assert _accepts(llm, nullable, "null") and _accepts(llm, nullable, '"ab"')
    assert not _accepts(llm, nullable, '"abc"')


def test_compile_stays_bounded(llm):
    """Huge bounds compile in milliseconds (xgrammar counts repetitions natively); a pattern x
    length window that would split into too many pieces is refused naming the limit."""
    g = llm.engine.grammars
    for schema in (
        {"type": "string", "maxLength": 10**6},
        {"type": "string", "minLength": 10**5, "maxLength": 10**6},
        {"type": "string", "pattern": "^(a{0,1000}b){0,1000}$"},
        {"type": "array", "items": {"type": "string", "maxLength": 10**6}, "maxItems": 10**6},
        {"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$", "maxLength": 64},
    ):
        start = time.perf_counter()
        g.compile(schema_spec("json_schema", schema))
        assert time.perf_counter() - start < 5, schema
    assert _accepts(llm, {"type": "string", "maxLength": 10**6}, json.dumps("x" * 3000))
    with pytest.raises(UnsupportedSchema) as e:
        check_schema({"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$", "maxLength": 10**6})
    assert f"more than {rx.MAX_ALTERNATIVES} pieces or {rx.MAX_DEPTH} nested splits" in str(e.value)


def test_pattern_with_length_window_on_two_variable_parts(llm):
    """An exact split, not an approximation: 'a-bb' fits maxLength 4, 'aa-bb' does not."""
    schema = {"type": "string", "pattern": "^[a-z]+-[a-z]+$", "minLength": 4, "maxLength": 4}
    assert _accepts(llm, schema, '"a-bb"') and _accepts(llm, schema, '"aa-b"')
    assert not _accepts(llm, schema, '"aa-bb"') and not _accepts(llm, schema, '"a-b"')


def test_tool_tag_carries_string_limits(llm):
    """`tool_choice: auto` compiles through xgrammar's structural tag: the call's string limits
    become our EBNF there too."""
    from modeldeploy.runtime.engine.structured_output.grammar import tool_tag_spec

    call = {
        "type": "object",
        "properties": {"name": {"const": "f"}, "arguments": {"type": "string", "maxLength": 2}},
        "required": ["name", "arguments"],
    }
    spec = tool_tag_spec(call, "<tool_call>", "</tool_call>", True)
    m = llm.engine.grammars.matcher(spec)
    assert m.accept_string('hi <tool_call>{"name": "f", "arguments": "ab"}</tool_call>')
    m = llm.engine.grammars.matcher(spec)
    assert not m.accept_string('hi <tool_call>{"name": "f", "arguments": "abc"}')
