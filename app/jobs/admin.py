"""Who may use the operators' routes (/jobs, /corpora): the Bearer token of
PENCIL_ADMIN_TOKEN; and the Idempotency-Key header they honour."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.errors import ApiError

MAX_IDEMPOTENCY_KEY = 200

# Declares the scheme in the OpenAPI (Swagger UI's "Authorize"); require_admin answers in our error shape.
BEARER = HTTPBearer(auto_error=False, scheme_name="adminToken", description="the PENCIL_ADMIN_TOKEN of the server")


def require_admin(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]
) -> None:
    """The Bearer token of PENCIL_ADMIN_TOKEN, compared in constant time."""
    token = request.app.state.settings.admin_token
    if not token:
        raise ApiError(
            503,
            "admin_disabled",
            (
                "batch jobs are disabled: set PENCIL_ADMIN_TOKEN (environment or .env) to a secret and "
                "restart, then send it as 'Authorization: Bearer <token>'"
            ),
        )
    given = credentials.credentials if credentials is not None else ""
    if not hmac.compare_digest(given.encode(), token.get_secret_value().encode()):
        raise ApiError(
            401,
            "unauthorized",
            "this endpoint needs 'Authorization: Bearer <PENCIL_ADMIN_TOKEN>'",
            {"WWW-Authenticate": "Bearer"},
        )


def idempotency_key(request: Request) -> str | None:
    """The request's Idempotency-Key header, or None; 400 bad_idempotency_key when it is
    empty or longer than MAX_IDEMPOTENCY_KEY characters."""
    key = request.headers.get("idempotency-key")
    if key is not None and not 0 < len(key) <= MAX_IDEMPOTENCY_KEY:
        raise ApiError(400, "bad_idempotency_key", f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} characters")
    return key
