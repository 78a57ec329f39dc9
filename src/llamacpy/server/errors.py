"""llama-server's error shape: ``{"error": {"code", "message", "type"}}`` with the HTTP status
as ``code``, plus extra fields for some errors (``n_prompt_tokens``/``n_ctx``)."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    414: "invalid_request_error",
    415: "invalid_request_error",
    421: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


class APIError(Exception):
    """An error answered to the client as JSON with status ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str | None = None,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or ERROR_TYPES.get(status, "server_error")
        self.headers = headers
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.status, "message": self.message, "type": self.type,
                          **self.extra}}  # fmt: skip

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, **extra: Any) -> APIError:
    return APIError(400, message, **extra)


def not_supported(message: str) -> APIError:
    return APIError(501, message)
