"""Constrained decoding in the engine (xgrammar): every output validates, batching and preemption
change nothing, and unsupported schema features are refused by name. Random-weight tiny model."""

from __future__ import annotations

import json

import jsonschema
import pytest

from modeldeploy.runtime import LLM, SamplingParams
from modeldeploy.runtime.engine.structured_output.grammar import UnsupportedSchema, check_schema, schema_spec
from modeldeploy_dev.structured_schemas import SCHEMAS

PROMPTS = [f"Record {i}: " for i in range(100)]


@pytest.fixture(scope="module")
def llm(llama_dir):
    return LLM(llama_dir, dtype="float32", max_num_seqs=128, max_model_len=512)


def _validate(outs, schema) -> None:
    for o in outs:
        assert o.finish_reason == "stop", (o.finish_reason, o.text)
        jsonschema.validate(json.loads(o.text), schema)


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_100_outputs_validate_greedy_and_seeded(llm, name):
    schema = SCHEMAS[name]
    for temperature in (0.0, 1.0):
        params = [
            SamplingParams(
                max_tokens=200, temperature=temperature, seed=i, structured=schema_spec("json_schema", schema)
            )
            for i in range(100)
        ]
        outs = llm.generate(PROMPTS, params)
        assert len(outs) == 100
        _validate(outs, schema)


def _mixed_params(seed: int) -> list[SamplingParams]:
    names = ["person", "order", "reading"]
    out = []
    for i in range(8):
        kw = dict(
            max_tokens=200 if i < 6 else 60,
            temperature=0.0 if i % 2 else 1.0,
            seed=seed + i,
            ignore_eos=i >= 6,
        )
        if i < 6:
            kw["structured"] = schema_spec("json_schema", SCHEMAS[names[i % 3]])
        out.append(SamplingParams(**kw))
    return out


def _record_steps(engine) -> list[tuple[int, int, int]]:
    """Wrap the sampler: per engine step, (rows sampled, constrained rows, rows the mask covered)."""
    steps: list[tuple[int, int, int]] = []
    sample = engine.sampler.sample

    def recording_sample(logits, seqs, bitmask, masked, *a, **k):
        steps.append((len(seqs), sum(s.grammar is not None for s in seqs), len(masked)))
        return sample(logits, seqs, bitmask, masked, *a, **k)

    engine.sampler.sample = recording_sample
    return steps


def test_mixed_batch_equals_each_alone(llm):
    prompts = PROMPTS[:8]
    alone = [llm.generate([p], [sp])[0] for p, sp in zip(prompts, _mixed_params(7), strict=True)]
    engine = llm.engine
    steps = _record_steps(engine)
    steps_before = engine.steps_total
    try:
        together = llm.generate(prompts, _mixed_params(7))
    finally:
        del engine.sampler.sample  # back to the class's method for the module's other tests
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    # Batched, not run kind by kind: every row samples one token per step from the first step on, so
    # the steps are as many as the longest output, and step i samples exactly the rows still running,
    # constrained and unconstrained together, the grammar mask covering the constrained ones.
    lens = [len(o.token_ids) for o in together]
    constrained = [sp.structured is not None for sp in _mixed_params(7)]
    assert engine.steps_total - steps_before == len(steps) == max(lens)
    assert steps[0] == (8, 6, 6)
    for i, step in enumerate(steps):
        c = sum(n > i for n, k in zip(lens, constrained, strict=True) if k)
        u = sum(n > i for n, k in zip(lens, constrained, strict=True) if not k)
        assert step == (c + u, c, c), i
    assert sum(0 < c < n for n, c, _ in steps) >= min(n for n, k in zip(lens, constrained, strict=True) if k)
    for o, name in zip(together[:6], ["person", "order", "reading"] * 2, strict=True):
        jsonschema.validate(json.loads(o.text), SCHEMAS[name])


def test_constraint_survives_preemption_and_chunked_prefill(llama_dir):
    """Few KV blocks: sequences are preempted and recomputed mid-output; the grammar state stays with
    the sequence, so outputs equal an unpreempted run and still validate. Same with prompts prefilled
    in 16-token chunks."""
    schema = SCHEMAS["order"]
    prompts = [f"A longer prompt that takes blocks, number {i}, " * 2 for i in range(6)]
    params = [
        SamplingParams(max_tokens=80, temperature=1.0, seed=i, structured=schema_spec("json_schema", schema))
        for i in range(6)
    ]
    roomy = LLM(llama_dir, dtype="float32", max_model_len=160, num_kv_blocks=200)
    tight = LLM(llama_dir, dtype="float32", max_model_len=160, num_kv_blocks=24, block_size=8)
    chunked = LLM(llama_dir, dtype="float32", max_model_len=160, max_num_batched_tokens=16)
    a, b, c = (
        roomy.generate(prompts, params),
        tight.generate(prompts, params),
        chunked.generate(prompts, params),
    )
    assert tight.engine.stats().preemptions_total > 0
    assert [o.token_ids for o in a] == [o.token_ids for o in b] == [o.token_ids for o in c]
    _validate(b, schema)


def test_n_choices_each_follow_the_grammar(llm):
    schema = SCHEMAS["reading"]
    outs = llm.generate(
        PROMPTS[:2],
        SamplingParams(
            max_tokens=200, temperature=1.0, seed=4, n=3, structured=schema_spec("json_schema", schema)
        ),
    )
    assert [o.index for o in outs] == [0, 1, 2, 0, 1, 2]
    _validate(outs, schema)
    assert len({o.text for o in outs}) > 1


def test_stop_string_and_length_finish_reasons(llm):
    schema = SCHEMAS["order"]
    cut = llm.generate(
        PROMPTS[:1], SamplingParams(max_tokens=3, structured=schema_spec("json_schema", schema))
    )[0]
    assert cut.finish_reason == "length"
    stopped = llm.generate(
        PROMPTS[:1],
        SamplingParams(
            max_tokens=100, temperature=0, stop=['"items"'], structured=schema_spec("json_schema", schema)
        ),
    )[0]
    assert stopped.finish_reason == "stop" and stopped.text.startswith('{"id": "ORD-')
    assert '"items"' not in stopped.text


@pytest.mark.parametrize(
    ("schema", "feature"),
    [
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"not": {"type": "integer"}}, "not"),
        ({"type": "object", "properties": {"a": {"if": {"type": "integer"}, "then": {}}}}, "if"),
        ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, "allOf with more than one subschema"),
        ({"type": "string", "maxLength": 2, "minLength": 5}, "minLength 5 greater than maxLength 2"),
        ({"$ref": "https://example.com/s.json"}, "$ref to"),
        ({"type": "string", "format": "ipv6", "maxLength": 9}, "format 'ipv6' together with maxLength"),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired"),
    ],
)
def test_unsupported_features_are_named(schema, feature):
    with pytest.raises(UnsupportedSchema) as e:
        check_schema(schema)
    assert feature in str(e.value)


def test_supported_keywords_are_enforced(llm):
    """The allow-list is honest: a violating document is rejected by the compiled grammar."""
    import xgrammar as xgr

    cases = [
        ({"type": "integer", "minimum": 3}, "1"),
        ({"type": "integer", "multipleOf": 3}, "4"),
        ({"type": "string", "pattern": "^[a-c]+$"}, '"xyz"'),
        ({"type": "string", "format": "date"}, '"nope"'),
        ({"type": "array", "items": {"type": "integer"}, "minItems": 2}, "[1]"),
        ({"enum": ["a", "b"]}, '"c"'),
        ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, "{}"),
        ({"$defs": {"A": {"type": "integer"}}, "$ref": "#/$defs/A"}, '"x"'),
        ({"type": "object", "maxProperties": 1}, '{"b":1,"c":2}'),
    ]
    for schema, bad in cases:
        check_schema(schema)
        spec = schema_spec("json_schema", schema)
        m = llm.engine.grammars.matcher(spec)
        assert not (m.accept_string(bad) and m.is_completed()), schema
        assert isinstance(m, xgr.GrammarMatcher)


def test_compile_cache_is_bounded_and_keyed_by_schema(llm):
    g = llm.engine.grammars
    first = g.compile(schema_spec("json_schema", {"type": "integer", "minimum": 123456}))
    again = g.compile(schema_spec("json_schema", {"type": "integer", "minimum": 123456}))
    assert not first.cached and again.cached and again.compiled is first.compiled
    for i in range(g.cache_size + 5):
        g.compile(schema_spec("json_schema", {"type": "integer", "maximum": i}))
    assert len(g) == g.cache_size
    assert not g.compile(schema_spec("json_schema", {"type": "integer", "minimum": 123456})).cached


def test_min_tokens_leaves_the_end_to_the_grammar(llm):
    """min_tokens masks EOS, which is all a complete grammar allows: the grammar wins, no crash."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    out = llm.generate(
        PROMPTS[:2],
        SamplingParams(max_tokens=40, min_tokens=30, structured=schema_spec("json_schema", schema)),
    )
    for o in out:
        assert o.finish_reason == "stop" and len(o.token_ids) < 30
        jsonschema.validate(json.loads(o.text), schema)


async def test_compile_never_blocks_the_step_loop(llama_dir):
    """A compile held open on the compile thread: an unconstrained request submitted after it runs
    to completion meanwhile; the constrained one starts once its grammar is ready (no timing)."""
    import asyncio
    import threading

    from modeldeploy.runtime import AsyncEngine, EngineConfig

    eng = AsyncEngine(EngineConfig(model=str(llama_dir), dtype="float32", max_model_len=256))
    await eng.start()
    gate, entered = threading.Event(), threading.Event()
    compile_ = eng.engine.grammars.compile

    def held(spec):
        entered.set()
        gate.wait(60)
        return compile_(spec)

    eng.engine.grammars.compile = held
    schema = SCHEMAS["reading"]

    async def constrained():
        p = SamplingParams(max_tokens=200, temperature=0, structured=schema_spec("json_schema", schema))
        return [o async for o in eng.generate("big", "Record:", p)][-1]

    task = asyncio.create_task(constrained())
    await asyncio.to_thread(entered.wait, 60)
    free = [o async for o in eng.generate("free", "Hello", SamplingParams(max_tokens=8, ignore_eos=True))]
    assert free[-1].finished and len(free[-1].token_ids) == 8
    assert not task.done() and eng.engine.seqs.get("big") is None  # still compiling, never queued
    gate.set()
    out = await task
    jsonschema.validate(json.loads(out.text), schema)
    await eng.shutdown()
