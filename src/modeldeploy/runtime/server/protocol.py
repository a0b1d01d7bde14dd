"""Request schemas of the OpenAI-compatible API, strict on purpose.

Every model forbids unknown fields: a client that sends `logit_bias` must learn that it
was not honoured (400 naming the field) rather than get a silently different answer.
Bodies are validated here, never by FastAPI, so a bad body is a 400 in OpenAI's error
format and never FastAPI's default 422.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    Tag,
    ValidationError,
    model_validator,
)

from modeldeploy.runtime.server.errors import APIError

_STRICT = ConfigDict(extra="forbid", strict=True)
Number = Annotated[float, Field(allow_inf_nan=False)]  # strict float still takes ints (temperature=1)


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: StrictBool = False


class JSONSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    name: Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: StrictStr | None = None
    schema_: dict[str, Any] | StrictBool = Field(default_factory=dict, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's response_format: text (unconstrained), json_object, or json_schema."""

    model_config = _STRICT
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class TextFormat(BaseModel):
    """/v1/responses `text.format`: the json_schema fields sit beside `type`."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[StrictStr, Field(min_length=1, max_length=64)] | None = None
    description: StrictStr | None = None
    schema_: dict[str, Any] | StrictBool | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class TextConfig(BaseModel):
    model_config = _STRICT
    format: TextFormat | None = None


class GenerationRequest(BaseModel):
    """Fields shared by the three generation endpoints (sampling, stop, stream)."""

    model_config = _STRICT
    model: Annotated[StrictStr, Field(max_length=256)]
    temperature: Annotated[Number, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[Number, Field(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[StrictInt, Field(ge=-1)] = -1
    seed: Annotated[StrictInt, Field(ge=0, lt=2**63)] | None = None
    stop: StrictStr | Annotated[list[StrictStr], Field(max_length=16)] | None = None
    stream: StrictBool = False
    user: StrictStr | None = None
    ignore_eos: StrictBool = False  # extension (as in vLLM): fixed-length outputs for load tests
    presence_penalty: Annotated[Number, Field(ge=-2.0, le=2.0)] = 0.0
    frequency_penalty: Annotated[Number, Field(ge=-2.0, le=2.0)] = 0.0
    repetition_penalty: Annotated[Number, Field(gt=0.0, le=10.0)] = 1.0  # extension (vLLM)
    logit_bias: dict[StrictStr, Annotated[Number, Field(ge=-100.0, le=100.0)]] | None = None
    min_tokens: Annotated[StrictInt, Field(ge=0)] = 0  # extension (vLLM)

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        if any(s == "" for s in stops):
            raise APIError(400, "stop: stop sequences must be non-empty strings", param="stop")
        return stops


class ChoicesRequest(GenerationRequest):
    """Completions and chat: `n` choices, `stream_options` and `response_format`."""

    n: Annotated[StrictInt, Field(ge=1, le=16)] = 1
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    # vLLM's extension: the prompt's and each choice's token ids beside the text (null: false, as vLLM)
    return_token_ids: StrictBool | None = None

    def check_n(self) -> None:
        """`stream_options` only on a streamed request (OpenAI refuses it otherwise)."""
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options: only allowed when stream is true", param="stream_options")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


PromptLogprobs = Annotated[StrictInt, Field(ge=0, le=20)] | None  # vLLM's extension: score the prompt


class CompletionRequest(ChoicesRequest):
    prompt: StrictStr | list[StrictInt]
    max_tokens: Annotated[StrictInt, Field(ge=0)] | None = 16  # 0 only with echo (scoring a text)
    logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = (
        None  # top-k per token, as OpenAI's legacy API
    )
    echo: StrictBool = False  # the prompt before the completion; with logprobs, its tokens' logprobs too
    prompt_logprobs: PromptLogprobs = None

    @model_validator(mode="after")
    def check_echo(self) -> CompletionRequest:
        """max_tokens 0 is the legacy scoring idiom (echo the prompt, generate nothing); an echo is
        not streamed, and the scores it needs are not streamed either. (An APIError is not wrapped
        by pydantic: it leaves parse_body as the 400 naming the field.)"""
        if self.max_tokens == 0 and not self.echo:
            raise APIError(400, "max_tokens: 0 is only allowed with echo true", param="max_tokens")
        if self.stream and self.echo:
            raise APIError(400, "echo: not supported with stream true", param="echo")
        if self.stream and self.prompt_logprobs is not None:
            raise APIError(400, "prompt_logprobs: not supported with stream true", param="prompt_logprobs")
        return self


class TextPart(BaseModel):
    model_config = _STRICT
    type: Literal["text", "input_text", "output_text"]
    text: StrictStr


class FunctionCall(BaseModel):
    model_config = _STRICT
    name: StrictStr
    arguments: StrictStr  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    model_config = _STRICT
    id: StrictStr
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[TextPart] | None = None
    name: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None  # assistant turns that called tools
    tool_call_id: StrictStr | None = None  # role "tool": which call this answers

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)

    def render(self) -> dict[str, Any]:
        """The message as the chat template sees it (tool calls with parsed arguments, as HF
        templates expect)."""
        msg: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            msg["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": _args(c)}}
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            msg["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            msg["name"] = self.name
        return msg


def _args(call: ToolCall) -> Any:
    try:
        return json.loads(call.function.arguments)
    except json.JSONDecodeError:
        raise APIError(
            400,
            f"messages: tool call {call.id} has arguments that are not JSON",
            param="messages.tool_calls.function.arguments",
        ) from None


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class Tool(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = _STRICT
    name: StrictStr


class NamedToolChoice(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(ChoicesRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    add_generation_prompt: StrictBool = True  # vLLM's: open an assistant turn after the messages
    continue_final_message: StrictBool = False  # vLLM's: leave the last (assistant) message open
    prompt_logprobs: PromptLogprobs = None

    def check_prompt_options(self) -> None:
        """vLLM's rules for the template flags, and prompt scores only in a non-streamed body."""
        if self.continue_final_message:
            if self.add_generation_prompt:
                raise APIError(
                    400,
                    "continue_final_message: cannot be true while add_generation_prompt is true",
                    param="continue_final_message",
                )
            if self.messages[-1].role != "assistant":
                raise APIError(
                    400,
                    "continue_final_message: the last message must have role 'assistant', "
                    f"got {self.messages[-1].role!r}",
                    param="continue_final_message",
                )
        if self.stream and self.prompt_logprobs is not None:
            raise APIError(400, "prompt_logprobs: not supported with stream true", param="prompt_logprobs")

    def token_limit(self) -> int | None:
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise APIError(
                400,
                "max_tokens and max_completion_tokens are mutually exclusive",
                param="max_completion_tokens",
            )
        return self.max_completion_tokens or self.max_tokens


class InputMessage(ChatMessage):
    type: Literal["message"] = "message"


class FunctionCallItem(BaseModel):
    """/v1/responses input: a call the model made earlier (rendered as an assistant tool call)."""

    model_config = _STRICT
    type: Literal["function_call"]
    call_id: StrictStr
    name: StrictStr
    arguments: StrictStr
    id: StrictStr | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutputItem(BaseModel):
    """/v1/responses input: the answer to a call (rendered as a `tool` message)."""

    model_config = _STRICT
    type: Literal["function_call_output"]
    call_id: StrictStr
    output: StrictStr
    id: StrictStr | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class ResponsesTool(BaseModel):
    """/v1/responses function tool: the FunctionDef fields sit beside `type` (only `function`)."""

    model_config = _STRICT
    type: Literal["function"]
    name: Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class ResponsesNamedTool(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    name: StrictStr


LOGPROBS_INCLUDE = "message.output_text.logprobs"
_ITEM_TYPES = ("message", "function_call", "function_call_output")


def _item_type(v: Any) -> str:
    t = v.get("type", "message") if isinstance(v, dict) else getattr(v, "type", "message")
    return t if t in _ITEM_TYPES else "message"  # an unknown type then fails on `type`, naming it


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(_item_type),
]


class ResponsesRequest(GenerationRequest):
    input: StrictStr | Annotated[list[InputItem], Field(min_length=1)]
    max_output_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    text: TextConfig | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ResponsesNamedTool | None = None
    parallel_tool_calls: StrictBool | None = None
    include: list[Literal["message.output_text.logprobs"]] | None = None  # the only one we can fill
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = None

    @property
    def logprobs(self) -> int | None:
        """Top-k per output token when `include` asks for output text logprobs, else None."""
        if LOGPROBS_INCLUDE not in (self.include or []):
            if self.top_logprobs is not None:
                raise APIError(
                    400, f"top_logprobs: requires include [{LOGPROBS_INCLUDE!r}]", param="top_logprobs"
                )
            return None
        if self.tools and self.tool_choice != "none":
            raise APIError(400, f"include: {LOGPROBS_INCLUDE} cannot be combined with tools", param="include")
        return self.top_logprobs or 0

    def as_chat(self) -> ChatCompletionRequest:
        """The same conversation and tools as a chat request (one tool planner and template for both)."""
        msgs: list[dict[str, Any]] = []
        items = [InputMessage(role="user", content=self.input)] if isinstance(self.input, str) else self.input
        for it in items:
            if isinstance(it, FunctionCallItem):
                call = {
                    "id": it.call_id,
                    "type": "function",
                    "function": {"name": it.name, "arguments": it.arguments},
                }
                if msgs and msgs[-1]["role"] == "assistant" and msgs[-1].get("tool_calls"):
                    msgs[-1]["tool_calls"].append(call)  # parallel calls: one assistant turn
                else:
                    msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif isinstance(it, FunctionCallOutputItem):
                msgs.append({"role": "tool", "tool_call_id": it.call_id, "content": it.output})
            else:
                msgs.append(it.model_dump(exclude_none=True, exclude={"type"}))
        choice = self.tool_choice
        if isinstance(choice, ResponsesNamedTool):
            choice = {"type": "function", "function": {"name": choice.name}}
        tools = [
            {"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})}
            for t in self.tools or []
        ]
        return ChatCompletionRequest.model_validate(
            {
                "model": self.model,
                "messages": msgs,
                "tools": tools or None,
                "tool_choice": choice,
                "parallel_tool_calls": self.parallel_tool_calls,
            }
        )


Body = TypeVar("Body", bound=BaseModel)


def parse_body(raw: bytes, model: type[Body]) -> Body:
    """Decode and validate a JSON body, raising a 400 APIError that names the field. JSON bodies are
    UTF-8 (RFC 8259): invalid UTF-8, or a lone surrogate escape (\\ud800: no UTF-8 spelling, the
    tokenizer could not take it), is a 400 naming the byte or field, never a 500 further in."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(
            400,
            f"invalid JSON body: not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}: {e.reason}) "
            "- JSON bodies must be UTF-8",
            code="invalid_encoding",
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise APIError(400, f"invalid JSON body: {e}") from None
    except RecursionError:
        raise APIError(400, "invalid JSON body: nested too deeply", code="invalid_value") from None
    if not isinstance(data, dict):
        raise APIError(400, f"request body must be a JSON object, got {type(data).__name__}")
    if _SURROGATE_ESCAPE.search(text):
        _check_surrogates(data, "")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _to_api_error(e) from None
    except RecursionError:
        raise APIError(400, "invalid JSON body: nested too deeply", code="invalid_value") from None


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _check_surrogates(value: Any, where: str) -> None:
    """A 400 naming the first string holding an unpaired surrogate (json.loads pairs the valid ones)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            param = where or None
            raise APIError(
                400,
                f"{where or 'request body'}: unpaired surrogate \\u{ord(value[e.start]):04x} "
                f"at character {e.start}; text must be valid Unicode",
                param=param,
                code="invalid_encoding",
            ) from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_surrogates(k, where)
            _check_surrogates(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_surrogates(v, f"{where}.{i}")


def _to_api_error(e: ValidationError) -> APIError:
    errs = e.errors(include_url=False)
    # for a union (str | list[int]) the deepest error says most: "prompt.0: not an integer"
    err = max(
        errs,
        key=lambda x: (x["type"] == "extra_forbidden", len([p for p in x["loc"] if not _is_union_tag(p)])),
    )
    loc = [str(p) for p in err["loc"] if not _is_union_tag(p)]
    param = ".".join(loc) or None
    if err["type"] == "extra_forbidden":
        return APIError(400, f"unsupported parameter: {param}", param=param, code="unsupported_parameter")
    if err["type"] == "missing":
        return APIError(400, f"missing required parameter: {param}", param=param, code="missing_parameter")
    return APIError(400, f"invalid value for {param}: {err['msg']}", param=param, code="invalid_value")


def _is_union_tag(part: Any) -> bool:
    # pydantic reports which union member failed ("str", "list[int]", "function-after[...]"); not a field
    return isinstance(part, str) and (part in {"str", "int", "float", "bool", *_ITEM_TYPES} or "[" in part)
