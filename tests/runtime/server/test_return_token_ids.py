"""vLLM's `return_token_ids` on /v1/completions and /v1/chat/completions: the prompt's ids and each
choice's generated ids, in vLLM's places, streamed and not, through both engine clients.

The ids are the engine's own: they decode back to the returned text, the prompt's are the tokenizer's
encoding of the prompt (chat: of the rendered template), a stream's chunks concatenate to the body's,
and a stop string's tokens stay in them (vLLM's output ids are not cut where the text is).
"""

from __future__ import annotations

import pytest
from support.sse import post, sse

from modeldeploy.runtime import EngineConfig
from modeldeploy.runtime.server.config import ServerConfig
from modeldeploy_dev.harness import ThreadedServer

PROMPT = "The quick brown"
MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "where do pods run?"}]


@pytest.fixture(scope="module", params=["process", "thread"])
def server(request, llama_dir):
    ecfg = EngineConfig(model=str(llama_dir), device="cpu", dtype="float32", max_num_seqs=4, bundle_id="ids")
    cfg = ServerConfig(engine=ecfg, served_model_name="tiny", engine_core=request.param)
    with ThreadedServer(cfg) as s:
        yield s


@pytest.fixture(scope="module")
def tok(llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(llama_dir)


def decoded(tok, ids: list[int]) -> str:
    """The text of generated ids as the server writes it: special tokens such as a final EOS dropped, and
    a multi-byte character that a length cut left incomplete (U+FFFD in a plain decode) held back, as
    the engine's detokenizer holds it back from the text."""
    return tok.decode(ids, skip_special_tokens=True).rstrip("\ufffd")


def chat_prompt_ids(tok, msgs, **kw) -> list[int]:
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **kw)
    return tok(text, add_special_tokens=False)["input_ids"]


def test_completions_body_carries_prompt_and_choice_ids(server, tok):
    r = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                                         "return_token_ids": True})  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    (c,) = body["choices"]
    assert c["prompt_token_ids"] == tok(PROMPT)["input_ids"]  # the tokenizer's encoding, specials included
    assert len(c["prompt_token_ids"]) == body["usage"]["prompt_tokens"]
    assert len(c["token_ids"]) == body["usage"]["completion_tokens"] > 0
    assert decoded(tok, c["token_ids"]) == c["text"]
    # Token-id prompts come back as sent; without the flag nothing is added.
    r = post(server, "/v1/completions", {"prompt": c["token_ids"], "max_tokens": 2, "return_token_ids": True})
    assert r.json()["choices"][0]["prompt_token_ids"] == c["token_ids"]
    plain = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2}).json()["choices"][0]
    assert "token_ids" not in plain and "prompt_token_ids" not in plain


def test_n_choices_each_carry_their_own_ids(server, tok):
    body = {"max_tokens": 12, "temperature": 1.0, "seed": 7, "n": 3, "return_token_ids": True}
    r = post(server, "/v1/completions", {"prompt": PROMPT, **body})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    for c in choices:
        assert decoded(tok, c["token_ids"]) == c["text"]
    assert len({tuple(c["token_ids"]) for c in choices}) > 1  # sampled apart, each its own ids
    assert sum(len(c["token_ids"]) for c in choices) == r.json()["usage"]["completion_tokens"]
    chat = post(server, "/v1/chat/completions", {"messages": MSGS, **body}).json()
    assert len(chat["choices"]) == 3
    for c in chat["choices"]:
        assert decoded(tok, c["token_ids"]) == c["message"]["content"]


def test_stop_string_tokens_stay_in_the_ids(server, tok):
    """The text is cut at the stop string; the ids are every token the engine generated, those that
    completed the stop string included (vLLM's output token ids)."""
    base = {
        "prompt": PROMPT,
        "max_tokens": 16,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    full = post(server, "/v1/completions", base).json()["choices"][0]
    text = full["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip() and len(text) > 4
    cut = post(server, "/v1/completions", {**base, "stop": [stop]}).json()["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["text"] == text[: text.index(stop)]
    assert cut["token_ids"] == full["token_ids"][: len(cut["token_ids"])]  # the same greedy ids, a prefix
    assert decoded(tok, cut["token_ids"]).startswith(cut["text"] + stop)


def test_echo_keeps_the_prompt_ids_apart(server, tok):
    """vLLM's choice with echo: `token_ids` are the generated ids only, the prompt's in
    `prompt_token_ids`; echo with max_tokens 0 generates none."""
    r = post(server, "/v1/completions", {"prompt": PROMPT, "echo": True, "max_tokens": 4, "temperature": 0,
                                         "return_token_ids": True})  # fmt: skip
    c = r.json()["choices"][0]
    assert c["prompt_token_ids"] == tok(PROMPT)["input_ids"] and len(c["token_ids"]) == 4
    assert c["text"] == PROMPT + decoded(tok, c["token_ids"])
    r = post(
        server, "/v1/completions", {"prompt": PROMPT, "echo": True, "max_tokens": 0, "return_token_ids": True}
    )
    c = r.json()["choices"][0]
    assert c["token_ids"] == [] and c["prompt_token_ids"] == tok(PROMPT)["input_ids"] and c["text"] == PROMPT


def test_completions_stream_chunks_concatenate_to_the_body(server, tok):
    body = {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "n": 2, "return_token_ids": True}
    whole = post(server, "/v1/completions", body).json()["choices"]
    chunks = sse(server, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    for i in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == i]
        assert mine[0]["prompt_token_ids"] == tok(PROMPT)["input_ids"]  # the first chunk of each choice
        assert all(ch["prompt_token_ids"] is None for ch in mine[1:])
        ids = [t for ch in mine for t in ch["token_ids"]]
        assert ids == whole[i]["token_ids"]
        assert "".join(ch["text"] for ch in mine) == whole[i]["text"] == decoded(tok, ids)
    assert chunks[-1]["usage"]["completion_tokens"] == sum(len(w["token_ids"]) for w in whole)


def test_chat_body_carries_template_ids_and_choice_ids(server, tok):
    r = post(server, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 8, "temperature": 0,
                                              "return_token_ids": True})  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["prompt_token_ids"] == chat_prompt_ids(tok, MSGS)  # vLLM's place for chat: the top level
    assert len(body["prompt_token_ids"]) == body["usage"]["prompt_tokens"]
    (c,) = body["choices"]
    assert "prompt_token_ids" not in c
    assert decoded(tok, c["token_ids"]) == c["message"]["content"]
    assert len(c["token_ids"]) == body["usage"]["completion_tokens"]
    plain = post(server, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 2}).json()
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]


def test_chat_stream_chunks_concatenate_to_the_body(server, tok):
    body = {"messages": MSGS, "max_tokens": 10, "temperature": 0, "n": 2, "return_token_ids": True}
    whole = post(server, "/v1/chat/completions", body).json()
    chunks = sse(server, "/v1/chat/completions", body)
    for i in (0, 1):
        mine = [c for c in chunks if c["choices"][0]["index"] == i]
        role = mine[0]
        assert role["choices"][0]["delta"]["role"] == "assistant"
        assert role["prompt_token_ids"] == whole["prompt_token_ids"] == chat_prompt_ids(tok, MSGS)
        assert all("prompt_token_ids" not in c for c in mine[1:])
        ids = [t for c in mine[1:] for t in c["choices"][0]["token_ids"]]
        assert ids == whole["choices"][i]["token_ids"]
        content = "".join(c["choices"][0]["delta"].get("content") or "" for c in mine)
        assert content == whole["choices"][i]["message"]["content"] == decoded(tok, ids)
        assert mine[-1]["choices"][0]["finish_reason"] == whole["choices"][i]["finish_reason"]


@pytest.mark.parametrize("value", ["yes", 1, 0, [], {}])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_non_boolean_is_400_naming_the_field(server, path, value):
    body = {"prompt": PROMPT} if path == "/v1/completions" else {"messages": MSGS}
    r = post(server, path, {**body, "max_tokens": 1, "return_token_ids": value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "return_token_ids"
    assert "return_token_ids" in r.json()["error"]["message"]


def test_null_and_false_add_nothing(server):
    for value in (None, False):
        r = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "return_token_ids": value})
        assert r.status_code == 200, r.text
        assert "token_ids" not in r.json()["choices"][0]


def test_openai_client_reads_them_from_extra_body(server, tok):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    r = client.chat.completions.create(
        model="tiny",
        messages=MSGS,  # type: ignore[arg-type]
        max_tokens=4,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    assert (r.model_extra or {})["prompt_token_ids"] == chat_prompt_ids(tok, MSGS)
    assert decoded(tok, (r.choices[0].model_extra or {})["token_ids"]) == r.choices[0].message.content


@pytest.fixture(scope="module")
def tool_server(tool_model_dir):
    ecfg = EngineConfig(
        model=str(tool_model_dir), device="cpu", dtype="float32", max_model_len=1024, bundle_id="ids-tools"
    )
    with ThreadedServer(ServerConfig(engine=ecfg, served_model_name="tiny")) as s:
        yield s


def test_streamed_tool_call_ids_concatenate_to_the_body(tool_server):
    """Tool-call deltas (several chunks from one output, or none while a call's name is still being
    written) lose no id and repeat none."""
    from modeldeploy_dev.tool_model import TOOLS

    ask = [{"role": "user", "content": "Weather in Paris for 3 days in celsius?"}]
    body = {"messages": ask, "tools": TOOLS, "max_tokens": 120, "temperature": 0, "return_token_ids": True}
    whole = post(tool_server, "/v1/chat/completions", body).json()
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["token_ids"], choice
    chunks = sse(tool_server, "/v1/chat/completions", body)
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert [t for c in chunks[1:] for t in c["choices"][0]["token_ids"]] == choice["token_ids"]
    assert any(c["choices"][0]["delta"].get("tool_calls") for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
