"""Request -> decoding constraint: response_format, /v1/responses text.format, and tool calls.

The schema checks and the grammar itself live in the engine (xgrammar); this file maps the
OpenAI request shapes onto it, turns an unsupported schema feature into a 400 naming the
feature and where it came from, and turns a constrained tool-call output back into OpenAI
`tool_calls` (toolcalls.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from modeldeploy.runtime.engine.structured_output.limits import GrammarLimitExceeded, SchemaLimits
from modeldeploy.runtime.server.errors import APIError
from modeldeploy.runtime.server.limits import SCHEMA_FLAG
from modeldeploy.runtime.server.toolcalls import CALL_BEGIN, CALL_END


def _spec(kind: str, schema: Any, param: str, limits: SchemaLimits | None = None) -> Any:
    from modeldeploy.runtime.engine.structured_output.grammar import UnsupportedSchema, schema_spec

    if kind == "json_schema" and not isinstance(schema, dict | bool):
        raise APIError(400, f"{param}: a JSON Schema object is required", param=param)
    try:
        return schema_spec(kind, schema, limits)
    except UnsupportedSchema as e:
        raise APIError(400, f"{param}: {e}", param=param, code="unsupported_schema_feature") from None
    except GrammarLimitExceeded as e:
        raise limit_error(param, e) from None
    except RecursionError:  # a value nested deeper than the interpreter's stack (an enum or const)
        raise APIError(400, f"{param}: nested too deeply", param=param, code="grammar_too_large") from None


def limit_error(param: str, e: GrammarLimitExceeded) -> APIError:
    """A 400 naming the field, the bound and the `serve` flag that sets it."""
    flag = SCHEMA_FLAG.get(e.limit, e.limit)
    return APIError(400, f"{param}: {e} (limit: {flag})", param=param, code="grammar_too_large")


def from_response_format(rf: Any, limits: SchemaLimits | None = None) -> Any:
    """response_format -> Structured (None for type text)."""
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        return _spec("json_object", None, "response_format")
    if rf.json_schema is None:
        raise APIError(
            400,
            "response_format.json_schema: required when type is json_schema",
            param="response_format.json_schema",
        )
    return _spec("json_schema", rf.json_schema.schema_, "response_format.json_schema.schema", limits)


def from_text_format(text: Any, limits: SchemaLimits | None = None) -> Any:
    """/v1/responses text.format -> Structured (None for type text)."""
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return _spec("json_object", None, "text.format")
    if fmt.schema_ is None or fmt.name is None:
        raise APIError(400, "text.format: name and schema are required for json_schema", param="text.format")
    return _spec("json_schema", fmt.schema_, "text.format.schema", limits)


# The Hermes/Qwen tool-call format (toolcalls.py); `auto` is offered where the chat template uses it.


@dataclass
class ToolPlan:
    """How a chat request's tools shape decoding: `named` or `required` constrain the whole output to
    a call; `auto` leaves text free until the template's call tag opens, then constrains the call;
    `none` (or no tools) leaves it free."""

    mode: str
    structured: Any = None
    function: str | None = None  # the named function


def _params_schema(
    tool: Any, i: int, where: str = "tools.{i}.function.parameters", limits: SchemaLimits | None = None
) -> Any:
    schema = tool.function.parameters if tool.function.parameters is not None else {"type": "object"}
    param = where.format(i=i)
    _spec("json_schema", schema, param, limits)  # checked here so the 400 names the tool
    return schema


def check_tool_count(n: int, max_tools: int, param: str = "tools") -> None:
    """Before any tool is rendered into the prompt or checked: the count alone decides."""
    if n > max_tools:
        raise APIError(
            400,
            f"{param}: {n} tools given, at most {max_tools} are allowed (limit: --max-tools)",
            param=param,
            code="too_many_tools",
        )


def tool_plan(
    req: Any,
    template: str | None,
    where: str = "tools.{i}.function.parameters",
    limits: SchemaLimits | None = None,
) -> ToolPlan:
    """`where` names a tool's parameters in 400s (/v1/responses: tools.{i}.parameters); `limits`
    bound each tool's schema and all of them together."""
    tools, choice = req.tools or [], req.tool_choice
    uses_tools = tools or any(m.role == "tool" or m.tool_calls for m in req.messages)
    if uses_tools and "tool" not in (template or ""):
        raise APIError(
            400,
            "tools: this model's chat template cannot express tools or tool messages",
            param="tools" if tools else "messages",
            code="tools_unsupported",
        )
    if choice is not None and not tools and choice != "none":
        raise APIError(400, "tool_choice: given without tools", param="tool_choice")
    if not tools or choice == "none":
        return ToolPlan("none")
    if req.response_format is not None and req.response_format.type != "text":
        raise APIError(400, "response_format: cannot be combined with tools", param="response_format")
    if req.n != 1:
        raise APIError(400, "n: must be 1 when tools are given", param="n")
    if choice is None or choice == "auto":
        if CALL_BEGIN not in (template or ""):
            raise APIError(
                400,
                f"tool_choice: 'auto' needs a chat template with the {CALL_BEGIN} call format; "
                "use 'required' or a named function",
                param="tool_choice",
                code="unsupported_value",
            )
        from modeldeploy.runtime.engine.structured_output.grammar import UnsupportedSchema, tool_tag_spec

        try:
            spec = tool_tag_spec(
                _call_schema(tools, where, limits),
                CALL_BEGIN,
                CALL_END,
                req.parallel_tool_calls is False,
                limits,
            )
        except UnsupportedSchema as e:
            raise APIError(400, f"tools: {e}", param="tools", code="unsupported_schema_feature") from None
        except GrammarLimitExceeded as e:
            raise limit_error("tools", e) from None
        return ToolPlan("auto", spec)
    by_name = {t.function.name: (i, t) for i, t in enumerate(tools)}
    if not isinstance(choice, str):
        if choice.function.name not in by_name:
            raise APIError(400, f"tool_choice: no tool named {choice.function.name!r}", param="tool_choice")
        i, tool = by_name[choice.function.name]
        return ToolPlan(
            "named",
            _spec("json_schema", _params_schema(tool, i, where, limits), where.format(i=i), limits),
            tool.function.name,
        )
    return ToolPlan("required", _spec("json_schema", _call_schema(tools, where, limits), "tools", limits))


def _call_schema(tools: list[Any], where: str, limits: SchemaLimits | None = None) -> dict[str, Any]:
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t.function.name},
                "arguments": _params_schema(t, i, where, limits),
            },
            "required": ["name", "arguments"],
        }
        for i, t in enumerate(tools)
    ]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def with_text(out: Any, text: str | None) -> Any:
    """A copy of an engine output with its text replaced (the content left around `auto` tool calls)."""
    import dataclasses

    return dataclasses.replace(out, text=text)
