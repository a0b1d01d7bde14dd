"""Errors in OpenAI's format: `{"error": {"message", "type", "param", "code"}}`.

The server raises `APIError` wherever a request is refused; one exception handler turns
it into JSON, so every refusal (400, 401, 404, 429, 503) reads the same to a client.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",  # a body over --max-body-bytes (OpenAI's type for oversized input)
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": _TYPES.get(self.status, "invalid_request_error"),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)
