"""Constrained output text -> OpenAI tool calls, whole or in streamed pieces.

One parser (`parse`) serves both: the non-streamed answer is `parse(plan, text, final=True)`, and
a stream sends, after each engine output, what `parse(plan, text_so_far, final)` added since the
last one. So the concatenated streamed argument fragments equal the non-streamed arguments by
construction, and a stream never sends a character it later has to take back:

- `named`: the whole output is the arguments.
- `required`: the output is `{"name": ..., "arguments": {...}}` (the grammar fixes that order): the
  name is known once `"arguments":` has appeared; the arguments stream up to, not including, a
  trailing `}` that may be the outer object's end.
- `auto`: text outside `<tool_call>...</tool_call>` is content (stripped of leading and trailing
  whitespace, so trailing whitespace is held back until more text follows); each tag's body is a
  call as in `required`. A possible start of the tag at the end of the text is held back too.

Arguments are the model's own text (the grammar's compact JSON), never re-serialised. An output
cut by max_tokens inside a call keeps the call with its arguments as far as they got (and
finish_reason `length`), as OpenAI does.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

CALL_BEGIN, CALL_END = "<tool_call>", "</tool_call>"
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
_DECODER = json.JSONDecoder()


@dataclass
class Call:
    name: str
    arguments: str  # the JSON text so far (all of it once `complete`)
    complete: bool


def _body(body: str, final: bool) -> Call | None:
    """One `{"name", "arguments"}` call body (None until its name is known)."""
    m = _HEADER.match(body)
    if m is None:
        return None
    name = json.loads(f'"{m.group(1)}"')
    rest = body[m.end() :]
    start = len(body) - len(body.lstrip())
    try:
        _, end = _DECODER.raw_decode(body, start)
    except json.JSONDecodeError:
        if final:  # cut by max_tokens or a stop string: the arguments as far as they got
            return Call(name, rest, False)
        held = rest.rstrip()
        held = held[:-1].rstrip() if held.endswith("}") else rest  # maybe the outer object's end
        return Call(name, held, False)
    args = body[m.end() : end].rstrip()
    return Call(name, args[:-1].rstrip(), True)  # without the outer object's closing brace


def _held_prefix(text: str) -> int:
    """How many characters at the end of `text` could be the start of CALL_BEGIN."""
    for k in range(min(len(CALL_BEGIN) - 1, len(text)), 0, -1):
        if text.endswith(CALL_BEGIN[:k]):
            return k
    return 0


def parse(mode: str, function: str | None, text: str, final: bool) -> tuple[str, list[Call]]:
    """(content, calls) of a tool-mode output seen so far; `final` once the output has ended."""
    if mode == "named":
        return "", [Call(function or "", text, final)]
    if mode == "required":
        c = _body(text, final)
        return "", [c] if c else []
    content, calls, pos = [], [], 0
    while True:
        at = text.find(CALL_BEGIN, pos)
        if at < 0:
            tail = text[pos:]
            content.append(tail if final else tail[: len(tail) - _held_prefix(tail)])
            break
        content.append(text[pos:at])
        start = at + len(CALL_BEGIN)
        end = text.find(CALL_END, start)
        c = _body(text[start:] if end < 0 else text[start:end], final or end >= 0)
        if c is not None:
            calls.append(c)
        if end < 0:
            break
        pos = end + len(CALL_END)
    return "".join(content).strip(), calls  # trailing whitespace waits until text follows it


def call(name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": "call_" + uuid.uuid4().hex[:24],
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def final_calls(mode: str, function: str | None, text: str) -> tuple[str | None, list[dict[str, Any]] | None]:
    """A finished output -> (content or None, OpenAI tool_calls or None)."""
    content, calls = parse(mode, function, text, final=True)
    if not calls:
        return content or None, None
    return content or None, [call(c.name, c.arguments) for c in calls]


@dataclass
class Piece:
    """One streamed piece: content text, a call opened (id and name), or an argument fragment."""

    kind: Literal["content", "open", "arguments"]
    text: str = ""
    index: int = 0  # the call's index
    call: dict[str, Any] | None = None  # for "open": id, type, function.name, arguments ""


@dataclass
class ToolStream:
    """Per choice: what has been sent; `feed` returns the new pieces of the output so far."""

    mode: str
    function: str | None
    content_sent: int = 0
    args_sent: list[int] = field(default_factory=list)  # per opened call
    calls: list[dict[str, Any]] = field(default_factory=list)  # the opened calls (id, name)

    def feed(self, text: str, final: bool) -> list[Piece]:
        content, calls = parse(self.mode, self.function, text, final)
        pieces = []
        if len(content) > self.content_sent:
            pieces.append(Piece("content", content[self.content_sent :]))
            self.content_sent = len(content)
        for k, c in enumerate(calls):
            if k == len(self.calls):
                opened = call(c.name, "")
                self.calls.append(opened)
                self.args_sent.append(0)
                pieces.append(Piece("open", index=k, call=opened))
            if len(c.arguments) > self.args_sent[k]:
                pieces.append(Piece("arguments", c.arguments[self.args_sent[k] :], index=k))
                self.args_sent[k] = len(c.arguments)
        return pieces
