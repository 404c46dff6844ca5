"""A refused request, protocol-neutral: the front ends map it to an HTTP status or a gRPC
code. Its own module so that the store can refuse too (503 while its database is down)."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A refused request: HTTP-like status, a stable code, a message naming the problem."""

    def __init__(
        self, status: int, code: str, message: str, field: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        # The HTTP status, a stable error code, the message, and the field it names (None: none)
        self.status, self.code, self.message, self.field = status, code, message, field
        self.headers = headers or {}  # protocol headers the status calls for (Retry-After, Allow, ...)

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field is not None:
            err["field"] = self.field
        return {"error": err}
