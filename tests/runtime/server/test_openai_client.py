"""The official `openai` client against the server: field-by-field compatibility in practice."""

from __future__ import annotations

import openai
import pytest

from modeldeploy.runtime import EngineConfig
from modeldeploy.runtime.server.config import ServerConfig
from modeldeploy_dev.harness import ThreadedServer


@pytest.fixture(scope="module")
def client(llama_dir):
    ecfg = EngineConfig(model=str(llama_dir), device="cpu", dtype="float32", max_num_seqs=4, bundle_id="oa")
    with ThreadedServer(ServerConfig(engine=ecfg, served_model_name="tiny", api_key="k1")) as s:
        yield openai.OpenAI(base_url=s.url + "/v1", api_key="k1", max_retries=0, timeout=60)


def test_models(client):
    assert [m.id for m in client.models.list()] == ["tiny"]


def test_completions_plain_and_stream(client):
    r = client.completions.create(model="tiny", prompt="The quick brown", max_tokens=6, temperature=0)
    assert r.object == "text_completion" and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    chunks = list(
        client.completions.create(
            model="tiny",
            prompt="The quick brown",
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_chat_plain_and_stream_with_usage(client):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    r = client.chat.completions.create(
        model="tiny", messages=msgs, max_completion_tokens=7, temperature=0, seed=3
    )
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens <= 7
    stream = client.chat.completions.create(
        model="tiny",
        messages=msgs,
        max_tokens=7,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
    )
    assert chunks[-1].usage.model_dump() == r.usage.model_dump() or (
        chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens
        and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    )


def test_responses_plain_and_stream(client):
    r = client.responses.create(model="tiny", input="hello", max_output_tokens=5, temperature=0)
    assert r.output_text == r.output[0].content[0].text and r.usage.output_tokens <= 5
    with client.responses.stream(model="tiny", input="hello", max_output_tokens=5, temperature=0) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == final.output_text == r.output_text
    assert final.usage.input_tokens == r.usage.input_tokens


def test_unsupported_field_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x", max_tokens=2, best_of=2)
    assert e.value.status_code == 400 and e.value.body["param"] == "best_of"
    assert "unsupported parameter: best_of" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], n=17)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="x", max_tokens=2)


def test_wrong_key_is_authentication_error(client):
    bad = client.with_options(api_key="nope")
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
