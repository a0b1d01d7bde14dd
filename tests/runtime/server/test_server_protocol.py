"""Unit tests of the server's request schemas, error format and admission queue (no engine)."""

from __future__ import annotations

import asyncio
import json

import pytest

from modeldeploy.runtime.server.admission import Admission
from modeldeploy.runtime.server.errors import APIError
from modeldeploy.runtime.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ResponsesRequest,
    parse_body,
)


def _err(body, model=CompletionRequest) -> APIError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(APIError) as e:
        parse_body(raw, model)
    assert e.value.status == 400
    return e.value


def test_unsupported_parameter_is_named():
    e = _err({"model": "m", "prompt": "hi", "best_of": 2})
    assert e.body() == {
        "error": {
            "message": "unsupported parameter: best_of",
            "type": "invalid_request_error",
            "param": "best_of",
            "code": "unsupported_parameter",
        }
    }


@pytest.mark.parametrize(
    "body,param",
    [
        ({"prompt": "hi"}, "model"),
        ({"model": "m", "prompt": "hi", "max_tokens": "3"}, "max_tokens"),
        ({"model": "m", "prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"model": "m", "prompt": "hi", "temperature": 2.5}, "temperature"),
        ({"model": "m", "prompt": "hi", "temperature": True}, "temperature"),
        ({"model": "m", "prompt": "hi", "top_p": 0}, "top_p"),
        ({"model": "m", "prompt": "hi", "stream": "yes"}, "stream"),
        (
            {"model": "m", "prompt": "hi", "stream": True, "stream_options": {"include_usage": True, "x": 1}},
            "stream_options.x",
        ),
        ({"model": "m", "prompt": ["a", "b"]}, "prompt.0"),
        ({"model": "m", "prompt": "hi", "stop": [1]}, "stop.0"),
    ],
)
def test_bad_fields_are_named(body, param):
    e = _err(body)
    assert e.param == param, e.message
    assert param.split(".")[0] in e.message


def test_invalid_json_and_non_object():
    assert "invalid JSON" in _err(b'{"model": ').message
    assert "JSON object" in _err(b"[1, 2]").message
    assert "invalid JSON" in _err(b"\xff\xfe").message
    assert "temperature" in _err(b'{"model": "m", "prompt": "x", "temperature": NaN}').message


def test_valid_bodies_parse():
    c = parse_body(
        b'{"model": "m", "prompt": [1, 2, 3], "max_tokens": 4, "stop": "x", "n": 1, "user": "u"}',
        CompletionRequest,
    )
    assert c.prompt == [1, 2, 3] and c.stop_list() == ["x"] and c.temperature == 1.0
    ch = parse_body(
        json.dumps(
            {
                "model": "m",
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    },
                ],
                "max_completion_tokens": 3,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode(),
        ChatCompletionRequest,
    )
    assert ch.messages[1].text() == "ab" and ch.token_limit() == 3 and ch.include_usage
    r = parse_body(b'{"model": "m", "input": "hello", "max_output_tokens": 5}', ResponsesRequest)
    assert [m.render() for m in r.as_chat().messages] == [{"role": "user", "content": "hello"}]


def test_semantic_checks_name_the_field():
    with pytest.raises(APIError, match="n: Input should be less than or equal to 16"):
        parse_body(b'{"model": "m", "prompt": "x", "n": 17}', CompletionRequest).check_n()
    with pytest.raises(APIError, match="stream_options"):
        parse_body(b'{"model": "m", "prompt": "x", "stream_options": {}}', CompletionRequest).check_n()
    with pytest.raises(APIError, match="mutually exclusive"):
        parse_body(
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1, '
            b'"max_completion_tokens": 2}',
            ChatCompletionRequest,
        ).token_limit()
    with pytest.raises(APIError, match="stop"):
        parse_body(b'{"model": "m", "prompt": "x", "stop": [""]}', CompletionRequest).stop_list()


async def test_admission_bounds_running_and_waiting():
    adm = Admission(max_running=2, max_queue=1)
    a, b, c = adm.enter(), adm.enter(), adm.enter()
    with pytest.raises(APIError) as e:
        adm.enter()
    assert e.value.status == 429 and e.value.headers["Retry-After"] == "1"
    await a.acquire()
    await b.acquire()
    assert (adm.running, adm.waiting) == (2, 1)
    waiter = asyncio.ensure_future(c.acquire())
    await asyncio.sleep(0.01)
    assert not waiter.done()  # third one waits for a slot
    a.release()
    await asyncio.wait_for(waiter, 1)
    assert (adm.running, adm.waiting, adm.max_running_seen) == (2, 0, 2)
    a.release()  # idempotent
    assert adm.running == 2
    drained = asyncio.ensure_future(adm.drain(5))
    await asyncio.sleep(0.01)
    with pytest.raises(APIError) as e:
        adm.enter()
    assert e.value.status == 503
    b.release()
    c.release()
    assert await drained is True and (adm.running, adm.waiting) == (0, 0)


async def test_admission_cancelled_waiter_leaves_queue():
    adm = Admission(max_running=1, max_queue=4)
    a, b = adm.enter(), adm.enter()
    await a.acquire()
    w = asyncio.ensure_future(b.acquire())
    await asyncio.sleep(0.01)
    w.cancel()
    with pytest.raises(asyncio.CancelledError):
        await w
    assert (adm.running, adm.waiting) == (1, 0)
    a.release()
    assert adm.running == 0 and await adm.drain(0.01) is not False
