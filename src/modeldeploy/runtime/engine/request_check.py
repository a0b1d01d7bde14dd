"""The one prompt-length rule, shared by the engine, the async engine and the HTTP server.

A request must have a prompt, and the prompt plus the tokens it may generate must fit the
model's context (`max_model_len`). The server checks first, to answer 400 naming the field;
the async engine checks before queueing, and the engine once more as the backstop for offline
use. All three call `check_request`, so they cannot disagree.
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
