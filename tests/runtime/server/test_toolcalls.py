"""The tool-call parser the server streams through: fed an output a character at a time, the
pieces it sends concatenate to exactly the non-streamed answer, for named, required and auto."""

from __future__ import annotations

import json

import pytest

from modeldeploy.runtime.server.toolcalls import ToolStream, final_calls, parse

ARGS = '{"city": "Paris}", "unit": "celsius", "nested": {"a": [1, {"b": 2}]}}'
CALL = '{"name": "get_weather", "arguments": ' + ARGS + "}"


def _stream(mode: str, function: str | None, text: str) -> tuple[str, list[dict], list[str]]:
    """Feed `text` one character at a time: (content, opened calls, arguments per call)."""
    ts = ToolStream(mode, function)
    content, opened, args = "", [], []
    for i in range(1, len(text) + 1):
        for p in ts.feed(text[:i], final=i == len(text)):
            if p.kind == "content":
                content += p.text
            elif p.kind == "open":
                assert p.index == len(opened) and p.call["function"]["arguments"] == ""
                opened.append(p.call)
                args.append("")
            else:
                args[p.index] += p.text
    return content, opened, args


@pytest.mark.parametrize(
    ("mode", "function", "text", "content", "calls"),
    [
        ("named", "get_weather", ARGS, None, [("get_weather", ARGS)]),
        ("required", None, CALL, None, [("get_weather", ARGS)]),
        (
            "auto",
            None,
            "Let me check. <tool_call>" + CALL + "</tool_call>",
            "Let me check.",
            [("get_weather", ARGS)],
        ),
        (
            "auto",
            None,
            "<tool_call>" + CALL + "</tool_call>\n<tool_call>" + CALL + "</tool_call>",
            None,
            [("get_weather", ARGS)] * 2,
        ),
        ("auto", None, "Hello there, a <tool or two.  ", "Hello there, a <tool or two.", []),
    ],
)
def test_streamed_pieces_equal_the_whole(mode, function, text, content, calls):
    whole_content, whole_calls = final_calls(mode, function, text)
    assert whole_content == content
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in whole_calls or []] == calls
    s_content, opened, args = _stream(mode, function, text)
    assert s_content == (content or "")
    assert [(c["function"]["name"], a) for c, a in zip(opened, args, strict=True)] == calls
    for a in args:
        json.loads(a)


def test_a_call_opens_once_its_name_is_known_and_never_sends_the_outer_brace():
    ts = ToolStream("required", None)
    assert ts.feed('{"name": "get_wea', final=False) == []
    pieces = ts.feed('{"name": "get_weather", "arguments": {"a": 1}', final=False)
    assert [p.kind for p in pieces] == ["open", "arguments"] and pieces[1].text == '{"a": 1'
    assert [p.text for p in ts.feed('{"name": "get_weather", "arguments": {"a": 1}}', final=True)] == ["}"]


def test_cut_by_max_tokens_keeps_the_partial_call():
    content, calls = parse("auto", None, 'Hi <tool_call>{"name": "f", "arguments": {"a": ', final=True)
    assert (
        content == "Hi" and calls[0].name == "f" and calls[0].arguments == '{"a": ' and not calls[0].complete
    )
