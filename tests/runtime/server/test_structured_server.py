"""The OpenAI request surface on a real server: response_format (chat, completions, responses),
streaming, 400s naming unsupported schema features, logprobs, n, tool calls (the official client).
Random-weight tiny llama; schemas bound their strings by patterns (see test_structured_engine)."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from support.sse import post, sse

from modeldeploy.runtime import EngineConfig
from modeldeploy.runtime.server.config import ServerConfig
from modeldeploy_dev.harness import ThreadedServer
from modeldeploy_dev.tool_model import TOOL_TEMPLATE

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "pattern": "^[A-Z][a-z]{1,9}$"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit", "days"],
}
MSGS = [{"role": "user", "content": "Weather please"}]
TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Forecast for a city", "parameters": SCHEMA},
}


def _cfg(model_dir, name: str) -> ServerConfig:
    ecfg = EngineConfig(
        model=str(model_dir),
        device="cpu",
        dtype="float32",
        max_num_seqs=32,
        max_model_len=512,
        bundle_id=name,
    )
    return ServerConfig(engine=ecfg, served_model_name="tiny")


@pytest.fixture(scope="module")
def server(llama_dir):
    with ThreadedServer(_cfg(llama_dir, "structured")) as s:
        yield s


@pytest.fixture(scope="module")
def tool_server(llama_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("tool-model")
    shutil.copytree(llama_dir, d, dirs_exist_ok=True)
    cfg_path = d / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = TOOL_TEMPLATE
    cfg_path.write_text(json.dumps(cfg))
    (d / "chat_template.jinja").unlink(missing_ok=True)
    with ThreadedServer(_cfg(d, "tools")) as s:
        yield s


RF = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True}}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_chat_json_schema_stream_equals_non_stream(server, temperature):
    body = {"messages": MSGS, "response_format": RF, "max_tokens": 120, "temperature": temperature, "seed": 5}
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)
    chunks = sse(server, "/v1/chat/completions", body)
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert streamed == choice["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_completions_json_schema(server):
    body = {"prompt": "Forecast:", "response_format": RF, "max_tokens": 120, "temperature": 0}
    r = post(server, "/v1/completions", body)
    text = r.json()["choices"][0]["text"]
    jsonschema.validate(json.loads(text), SCHEMA)
    chunks = sse(server, "/v1/completions", body)
    assert "".join(c["choices"][0]["text"] for c in chunks) == text
    # json_object: 100/100 on a model that knows JSON, test_tools_trained_model


def test_responses_text_format(server):
    fmt = {"type": "json_schema", "name": "weather", "schema": SCHEMA, "strict": True}
    body = {"input": "Weather please", "text": {"format": fmt}, "max_output_tokens": 120, "temperature": 0}
    r = post(server, "/v1/responses", body)
    assert r.status_code == 200, r.text
    text = r.json()["output"][0]["content"][0]["text"]
    jsonschema.validate(json.loads(text), SCHEMA)
    events = sse(server, "/v1/responses", body)
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == text


@pytest.mark.parametrize(
    ("path", "body", "param", "feature"),
    [
        (
            "/v1/chat/completions",
            {
                "messages": MSGS,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}},
                },
            },
            "response_format.json_schema.schema",
            "uniqueItems",
        ),
        (
            "/v1/completions",
            {
                "prompt": "x",
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {"type": "object", "properties": {"a": {"not": {"type": "null"}}}},
                    },
                },
            },
            "response_format.json_schema.schema",
            "'not' at /properties/a",
        ),
        (
            "/v1/responses",
            {
                "input": "x",
                "text": {
                    "format": {
                        "type": "json_schema",
                        "name": "x",
                        "schema": {"type": "string", "pattern": "^a(?=b)", "maxLength": 3},
                    }
                },
            },
            "text.format.schema",
            "lookaround '(?=...)' at position 2 of the pattern' at /pattern",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": MSGS,
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "object", "if": {}}},
                    }
                ],
                "tool_choice": "required",
            },
            "tools.0.function.parameters",
            "'if'",
        ),
    ],
)
def test_unsupported_schema_feature_is_400_naming_it(server, tool_server, path, body, param, feature):
    s = tool_server if "tools" in body else server
    r = post(s, path, {**body, "max_tokens": 4} if path != "/v1/responses" else body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and feature in err["message"], err


def test_bundle_names_the_grammar_library_and_metrics_time_compiles(server):
    b = httpx.get(server.url + "/v1/bundle").json()
    assert b["grammar_library"]["name"] == "xgrammar" and b["grammar_library"]["version"].count(".") >= 2
    post(server, "/v1/completions", {"prompt": "x", "response_format": RF, "max_tokens": 2})
    m = httpx.get(server.url + "/metrics").text
    assert "modeldeploy_grammar_compile_seconds_count{" in m
    counts = [ln for ln in m.splitlines() if ln.startswith("modeldeploy_grammar_compile_seconds_count")]
    assert sum(float(ln.rsplit(" ", 1)[1]) for ln in counts) >= 1


def test_n_and_logprobs(server):
    r = post(
        server,
        "/v1/chat/completions",
        {
            "messages": MSGS,
            "n": 4,
            "max_tokens": 6,
            "temperature": 1.0,
            "seed": 2,
            "logprobs": True,
            "top_logprobs": 3,
        },
    )
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    for c in body["choices"]:
        content = c["logprobs"]["content"]
        assert len(content) == 6 or c["finish_reason"] == "stop"
        assert all(len(t["top_logprobs"]) == 3 and t["logprob"] <= 0 for t in content)
    assert body["usage"]["completion_tokens"] == sum(len(c["logprobs"]["content"]) for c in body["choices"])
    r = post(server, "/v1/completions", {"prompt": "abc", "max_tokens": 5, "temperature": 0, "logprobs": 2})
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 5
    assert "".join(lp["tokens"]) == r.json()["choices"][0]["text"]
    chunks = sse(
        server, "/v1/completions", {"prompt": "abc", "max_tokens": 5, "temperature": 0, "logprobs": 2}
    )
    assert sum(len(c["choices"][0]["logprobs"]["tokens"]) for c in chunks if c["choices"][0]["logprobs"]) == 5


def test_tools_need_a_template_that_can_express_them(server):
    r = post(server, "/v1/chat/completions", {"messages": MSGS, "tools": [TOOL], "tool_choice": "required"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "tools_unsupported"


def test_named_tool_100_arguments_validate(tool_server):
    def one(i: int) -> dict:
        body = {
            "messages": MSGS,
            "tools": [TOOL],
            "max_tokens": 120,
            "temperature": 1.0,
            "seed": i,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        }
        return post(tool_server, "/v1/chat/completions", body).json()

    with ThreadPoolExecutor(16) as pool:
        bodies = list(pool.map(one, range(100)))
    for b in bodies:
        choice = b["choices"][0]
        assert choice["finish_reason"] == "tool_calls", b
        call = choice["message"]["tool_calls"][0]
        assert call["function"]["name"] == "get_weather" and choice["message"]["content"] is None
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMA)


def test_openai_client_round_trips_a_tool_call(tool_server):
    client = openai.OpenAI(base_url=tool_server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    r = client.chat.completions.create(
        model="tiny", messages=msgs, tools=[TOOL], tool_choice="required", max_tokens=120, temperature=0
    )
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMA)
    stream = client.chat.completions.create(
        model="tiny",
        messages=msgs,
        tools=[TOOL],
        max_tokens=120,
        temperature=0,
        stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    parts = [tc for ch in stream if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    assert parts[0].function.name == "get_weather" and parts[0].id
    jsonschema.validate(json.loads("".join(p.function.arguments or "" for p in parts)), SCHEMA)
    msgs += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "sunny"}'},
    ]
    final = client.chat.completions.create(
        model="tiny", messages=msgs, tools=[TOOL], tool_choice="none", max_tokens=8, temperature=0
    )
    assert final.choices[0].message.role == "assistant" and final.choices[0].message.tool_calls is None
    assert final.usage.prompt_tokens > r.usage.prompt_tokens  # the call and its answer were rendered


def test_auto_tool_choice_on_a_random_model(tool_server, server):
    """auto on a model that never calls: plain text, streamed the same. The trained model's calls are
    in test_tools_trained_model; here the grammar side is checked on the compiled constraint."""
    body = {"messages": MSGS, "tools": [TOOL], "max_tokens": 16, "temperature": 0}
    r = post(tool_server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] in ("stop", "length") and not choice["message"].get("tool_calls")
    chunks = sse(tool_server, "/v1/chat/completions", body)
    assert (
        "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == choice["message"]["content"]
    )
    from modeldeploy.runtime.engine.structured_output.grammar import GrammarCompiler
    from modeldeploy.runtime.server.protocol import ChatCompletionRequest
    from modeldeploy.runtime.server.structured import tool_plan

    req = ChatCompletionRequest.model_validate({"model": "tiny", "messages": MSGS, "tools": [TOOL]})
    plan = tool_plan(req, TOOL_TEMPLATE)
    assert plan.mode == "auto"
    # the server's constraint compiled here (the engine's compiler lives in the engine core process)
    vocab = json.loads((Path(tool_server.ctx.cfg.engine.model) / "config.json").read_text())["vocab_size"]
    tok = tool_server.ctx.engine.tokenizer
    grammars = GrammarCompiler(tok, vocab, [tok.eos_token_id], 4)
    m = grammars.matcher(plan.structured)
    assert m.accept_string("Let me check. <tool_call>")
    assert not m.accept_string('{"name": "other"')  # inside the tag only a valid call fits
    m = grammars.matcher(plan.structured)
    good = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius", "days": 2}}'
    assert m.accept_string(f"Sure. <tool_call>{good}</tool_call>") and m.is_completed()
    r = post(server, "/v1/chat/completions", body)  # the stock template cannot express tools at all
    assert r.status_code == 400 and r.json()["error"]["code"] == "tools_unsupported"


def test_pydantic_limits_through_the_openai_client(server):
    """What clients write: pydantic `Field(min_length, max_length, pattern)` and `conlist` as the
    official client sends them (`response_format=Model` -> strict json_schema); 20 seeded samples,
    each parsed back by pydantic itself and validated by jsonschema."""
    from typing import Annotated

    from pydantic import BaseModel, Field, conlist

    class Ticket(BaseModel):
        title: str = Field(min_length=2, max_length=12)
        code: str = Field(pattern=r"^[A-Z]{2}-\d{1,3}$", max_length=5)
        labels: conlist(Annotated[str, Field(max_length=4)], min_length=1, max_length=3)  # type: ignore[valid-type]

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    schema = Ticket.model_json_schema()
    for seed in range(20):
        r = client.beta.chat.completions.parse(
            model="tiny",
            messages=[{"role": "user", "content": "A ticket please"}],
            response_format=Ticket,
            max_tokens=200,
            temperature=1.0,
            seed=seed,
        )
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice
        assert isinstance(choice.message.parsed, Ticket)
        jsonschema.validate(json.loads(choice.message.content or ""), schema)
