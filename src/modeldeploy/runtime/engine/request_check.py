"""The request rules shared by the engine, its clients and the HTTP server.

A request must have a prompt, and the prompt plus the tokens it may generate must fit the
model's context (`max_model_len`); its adapter, if any, must be a configured one. The server
checks first, to answer 400 naming the field; the engine clients check before queueing, and the
engine once more as the backstop for offline use. All of them call these functions, so they
cannot disagree. A request's grammar has bounds of its own (structured_output/limits.py).
"""

from __future__ import annotations

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # OpenAI's error code for this case


class RequestError(ValueError):
    """A request the model's context cannot take; `field` names the parameter, `code` the error kind."""

    def __init__(self, message: str, field: str, code: str | None = None) -> None:
        super().__init__(message)
        self.field, self.code = field, code


def check_request(
    n_prompt: int,
    max_tokens: int | None,
    max_model_len: int,
    prompt_field: str = "prompt",
    tokens_field: str = "max_tokens",
) -> int:
    """`max_tokens`, or the room left in the context when it is None; RequestError when it cannot fit."""
    if n_prompt == 0:
        raise RequestError(f"{prompt_field}: the prompt is empty", prompt_field)
    if n_prompt >= max_model_len:
        raise RequestError(
            f"{prompt_field}: the prompt has {n_prompt} tokens, the model's maximum context "
            f"length is {max_model_len}",
            prompt_field,
            CONTEXT_LENGTH_EXCEEDED,
        )
    if max_tokens is None:
        return max_model_len - n_prompt
    if n_prompt + max_tokens > max_model_len:
        raise RequestError(
            f"{tokens_field}: prompt ({n_prompt} tokens) + {tokens_field} ({max_tokens}) exceeds the "
            f"model's maximum context length {max_model_len}",
            tokens_field,
            CONTEXT_LENGTH_EXCEEDED,
        )
    return max_tokens


def check_adapter(name: str | None, adapters: list[str]) -> None:
    """ValueError unless `name` is None or '' (the base model) or one of the configured `adapters`."""
    if not name:
        return
    if not adapters:
        raise ValueError(f"model: unknown adapter {name!r}; no adapters are configured")
    if name not in adapters:
        raise ValueError(f"model: unknown adapter {name!r}; adapters: {', '.join(adapters)}")
