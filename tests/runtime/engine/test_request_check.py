"""check_request: the one prompt-length rule the engine, the async engine and the server share."""

from __future__ import annotations

import pytest

from modeldeploy.runtime.engine.request_check import RequestError, check_adapter, check_request


def test_fits_returns_max_tokens_or_the_room_left() -> None:
    assert check_request(10, 6, 16) == 6
    assert check_request(10, None, 16) == 6


@pytest.mark.parametrize(
    ("n_prompt", "max_tokens", "field", "code", "text"),
    [
        (0, 4, "prompt", None, "prompt: the prompt is empty"),
        (16, None, "prompt", "context_length_exceeded", "the prompt has 16 tokens, the model's maximum"),
        (10, 7, "max_tokens", "context_length_exceeded", "max_tokens: prompt (10 tokens) + max_tokens"),
    ],
)  # fmt: skip
def test_refusals_name_the_field(
    n_prompt: int, max_tokens: int | None, field: str, code: str | None, text: str
) -> None:
    with pytest.raises(RequestError) as e:
        check_request(n_prompt, max_tokens, 16)
    assert (e.value.field, e.value.code) == (field, code) and text in str(e.value)
    assert isinstance(e.value, ValueError)  # the engine's callers catch ValueError


def test_the_server_names_its_own_fields() -> None:
    with pytest.raises(RequestError) as e:
        check_request(10, 7, 16, prompt_field="input", tokens_field="max_output_tokens")
    assert e.value.field == "max_output_tokens" and str(e.value).startswith(
        "max_output_tokens: prompt (10 tokens)"
    )


def test_adapter_rule_names_the_configured_adapters() -> None:
    check_adapter(None, [])
    check_adapter("", ["a"])
    check_adapter("a", ["a", "b"])
    with pytest.raises(ValueError, match="unknown adapter 'c'; adapters: a, b"):
        check_adapter("c", ["a", "b"])
    with pytest.raises(ValueError, match="unknown adapter 'c'; no adapters are configured"):
        check_adapter("c", [])
