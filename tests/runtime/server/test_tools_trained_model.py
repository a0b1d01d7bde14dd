"""Tool calls and json_object on a model that has learned them (tests/conftest.py `tool_model_dir`:
the tiny llama fine-tuned on Hermes <tool_call> samples, plain replies and small JSON objects).

- tool_choice auto: the model itself opens <tool_call> for a weather question (a parsed, schema-valid
  call) and answers a greeting in plain text; the official client round-trips both.
- Streaming tool calls arrive as OpenAI streams them (a first delta with id and name, then argument
  fragments) for required, named and auto; the fragments concatenate to the non-streamed arguments;
  the client's streaming helper accepts them.
- json_object: 100/100 sampled outputs parse, with no logit_bias: the model closes its strings.
- /v1/responses: function tools and tool_choice, function_call items (streamed as argument
  deltas), function_call_output in the input, output-text logprobs; 400s naming the field.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from support.sse import post, sse

from modeldeploy.runtime import LLM, EngineConfig, SamplingParams
from modeldeploy.runtime.engine.structured_output.grammar import schema_spec
from modeldeploy.runtime.server.config import ServerConfig
from modeldeploy_dev.harness import ThreadedServer
from modeldeploy_dev.tool_model import CITIES, TOOLS, WEATHER

ASK = [{"role": "user", "content": "Weather in Paris for 3 days in celsius?"}]
HELLO = [{"role": "user", "content": "Hello"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
R_TOOL = {"type": "function", **TOOLS[0]["function"]}  # /v1/responses: the function's fields beside type


@pytest.fixture(scope="module")
def server(tool_model_dir):
    ecfg = EngineConfig(
        model=str(tool_model_dir),
        device="cpu",
        dtype="float32",
        max_num_seqs=16,
        max_model_len=1024,
        bundle_id="t",
    )
    with ThreadedServer(ServerConfig(engine=ecfg, served_model_name="tiny")) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def test_auto_calls_a_tool_when_asked_and_answers_text_otherwise(client):
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=120, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    r = client.chat.completions.create(
        model="tiny", messages=HELLO, tools=TOOLS, max_tokens=60, temperature=0
    )
    choice = r.choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert choice.message.content and "<tool_call>" not in choice.message.content
    # the call and its answer go back through the template; the model then answers in text
    msgs = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "sunny"}'},
    ]
    final = client.chat.completions.create(
        model="tiny", messages=msgs, tools=TOOLS, tool_choice="none", max_tokens=8
    )
    assert final.choices[0].message.tool_calls is None and final.usage.prompt_tokens > r.usage.prompt_tokens


def test_auto_samples_mostly_call_and_every_call_validates(server):
    """Sampled at temperature 1: whatever the model does, a call it opens is complete and valid."""
    calls = 0
    for seed in range(20):
        body = {"messages": ASK, "tools": TOOLS, "max_tokens": 120, "temperature": 1.0, "seed": seed}
        choice = post(server, "/v1/chat/completions", body).json()["choices"][0]
        for c in choice["message"].get("tool_calls") or []:
            calls += 1
            assert choice["finish_reason"] == "tool_calls"
            jsonschema.validate(json.loads(c["function"]["arguments"]), WEATHER)
    assert calls >= 15, calls


@pytest.mark.parametrize("choice", ["auto", "required", "named"])
def test_streamed_call_arrives_in_pieces_equal_to_the_whole(server, choice):
    tool_choice = NAMED if choice == "named" else choice
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": tool_choice, "max_tokens": 120, "temperature": 0}
    whole = post(server, "/v1/chat/completions", body).json()["choices"][0]
    assert whole["finish_reason"] == "tool_calls", whole
    args = whole["message"]["tool_calls"][0]["function"]["arguments"]
    parts = [
        tc
        for c in sse(server, "/v1/chat/completions", body)
        if c["choices"]
        for tc in c["choices"][0]["delta"].get("tool_calls") or []
    ]
    first, rest = parts[0], parts[1:]
    assert first["id"].startswith("call_") and first["type"] == "function"
    assert first["function"] == {"name": "get_weather", "arguments": ""}
    assert len(rest) > 3 and all("id" not in p and "name" not in p["function"] for p in rest)
    assert "".join(p["function"]["arguments"] for p in rest) == args
    jsonschema.validate(json.loads(args), WEATHER)


def test_openai_stream_helper_accumulates_the_call(client):
    whole = client.chat.completions.create(
        model="tiny", messages=ASK, tools=TOOLS, max_tokens=120, temperature=0
    )
    deltas = []
    with client.chat.completions.stream(
        model="tiny", messages=ASK, tools=TOOLS, max_tokens=120, temperature=0
    ) as stream:
        for ev in stream:
            if ev.type == "tool_calls.function.arguments.delta":
                deltas.append(ev.arguments_delta)
            elif ev.type == "tool_calls.function.arguments.done":
                assert ev.name == "get_weather" and ev.arguments == "".join(deltas)
        final = stream.get_final_completion()
    assert len(deltas) > 3
    got = final.choices[0].message.tool_calls[0].function
    assert got.arguments == whole.choices[0].message.tool_calls[0].function.arguments == "".join(deltas)
    assert final.choices[0].finish_reason == "tool_calls"


def test_json_object_100_outputs_parse_without_a_nudge(tool_model_dir):
    """No logit_bias: a model that has seen JSON closes its strings; the grammar keeps every token valid."""
    llm = LLM(tool_model_dir, dtype="float32", max_num_seqs=100, max_model_len=512)
    prompts = [
        llm.tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Give me JSON for {CITIES[i % len(CITIES)]}"}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for i in range(100)
    ]
    params = [
        SamplingParams(max_tokens=120, temperature=1.0, seed=i, structured=schema_spec("json_object"))
        for i in range(100)
    ]
    outs = llm.generate(prompts, params)
    for o in outs:
        assert o.finish_reason == "stop", o.text
        assert isinstance(json.loads(o.text), dict)


def test_responses_function_tools_auto_stream_and_round_trip(client, server):
    r = client.responses.create(
        model="tiny", input=ASK[0]["content"], tools=[R_TOOL], max_output_tokens=120, temperature=0
    )
    assert r.status == "completed" and [o.type for o in r.output] == ["function_call"]
    call = r.output[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    assert r.tool_choice == "auto" and r.tools[0].name == "get_weather"
    deltas, done = [], None
    with client.responses.stream(
        model="tiny", input=ASK[0]["content"], tools=[R_TOOL], max_output_tokens=120, temperature=0
    ) as stream:
        for ev in stream:
            if ev.type == "response.function_call_arguments.delta":
                deltas.append(ev.delta)
            elif ev.type == "response.function_call_arguments.done":
                done = ev.arguments
        final = stream.get_final_response()
    assert len(deltas) > 3 and "".join(deltas) == done == call.arguments == final.output[0].arguments
    # named, then the answer to the call in the input; tool_choice none answers in text
    named = post(
        server,
        "/v1/responses",
        {
            "input": "Forecast Oslo 2 days celsius please",
            "tools": [R_TOOL],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "max_output_tokens": 120,
            "temperature": 0,
        },
    ).json()
    jsonschema.validate(json.loads(named["output"][0]["arguments"]), WEATHER)
    follow = [
        {"role": "user", "content": ASK[0]["content"]},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"forecast": "sunny"}'},
    ]
    r2 = client.responses.create(
        model="tiny", input=follow, tools=[R_TOOL], tool_choice="none", max_output_tokens=8
    )
    assert [o.type for o in r2.output] == ["message"] and r2.usage.input_tokens > r.usage.input_tokens
    hello = client.responses.create(
        model="tiny", input="Hello", tools=[R_TOOL], max_output_tokens=60, temperature=0
    )
    assert [o.type for o in hello.output] == ["message"] and hello.output_text


def _same(a: list[dict], b: list[dict]) -> None:
    """Equal tokens, logprobs equal to float32 tolerance (a request may run in a differently shaped batch)."""

    def flat(x: list[dict]) -> list[tuple[str, str, float]]:
        return [(e["token"], v["token"], v["logprob"]) for e in x for v in [e, *e["top_logprobs"]]]

    assert [t[:2] for t in flat(a)] == [t[:2] for t in flat(b)]
    assert [t[2] for t in flat(a)] == pytest.approx([t[2] for t in flat(b)], abs=1e-4)


def test_responses_logprobs(server, client):
    body = {
        "input": "Hello",
        "max_output_tokens": 6,
        "temperature": 0,
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 2,
    }
    r = post(server, "/v1/responses", body).json()
    part = r["output"][0]["content"][0]
    lps = part["logprobs"]
    assert len(lps) == r["usage"]["output_tokens"] and "".join(t["token"] for t in lps) == part["text"]
    assert all(t["logprob"] <= 0 and len(t["top_logprobs"]) == 2 for t in lps)
    chat = post(
        server,
        "/v1/chat/completions",
        {"messages": HELLO, "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 2},
    ).json()
    _same(lps, chat["choices"][0]["logprobs"]["content"])
    events = sse(server, "/v1/responses", body)
    _same([t for e in events if e["type"] == "response.output_text.delta" for t in e["logprobs"]], lps)
    done = next(e for e in events if e["type"] == "response.output_text.done")
    _same(done["logprobs"], lps)
    sdk = client.responses.create(
        model="tiny",
        input="Hello",
        max_output_tokens=6,
        temperature=0,
        include=["message.output_text.logprobs"],
        top_logprobs=2,
    )
    sdk_lps = [t.logprob for t in sdk.output[0].content[0].logprobs]  # float32 tolerance, as in _same
    assert sdk_lps == pytest.approx([t["logprob"] for t in lps], abs=1e-4)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        (
            {
                "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "not": {}}}],
                "tool_choice": "required",
            },
            "tools.0.parameters",
        ),
        ({"tools": [R_TOOL], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"include": ["file_search_call.results"]}, "include.0"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"top_logprobs": 21, "include": ["message.output_text.logprobs"]}, "top_logprobs"),
        ({"tools": [R_TOOL], "include": ["message.output_text.logprobs"]}, "include"),
        ({"tools": [R_TOOL], "text": {"format": {"type": "json_object"}}}, "text.format"),
        ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input.0.output"),
    ],
)
def test_responses_unsupported_or_invalid_is_400_naming_the_field(server, body, param):
    r = post(server, "/v1/responses", {"input": "Hello", "max_output_tokens": 4, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_json_object_on_the_server_streamed_equals_whole(client):
    kw = dict(
        model="tiny",
        messages=[{"role": "user", "content": "Reply with a JSON object about Oslo"}],
        response_format={"type": "json_object"},
        max_tokens=120,
        temperature=1.0,
        seed=3,
    )
    whole = client.chat.completions.create(**kw)
    assert whole.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(whole.choices[0].message.content), dict)
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(**kw, stream=True)
        if c.choices
    )
    assert streamed == whole.choices[0].message.content
