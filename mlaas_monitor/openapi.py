"""The OpenAPI 3 description of the REST API, served at GET /v1/openapi.json.

``openapi_spec()`` describes the core gateway's routes. An extension that adds routes also
adds a fragment describing them (``http_app.add_openapi``: ``{"paths": ...,
"components": {"schemas": ...}}``); the served document is ``openapi_spec(*fragments)``, so a
gateway advertises exactly the routes it serves. The helpers below are for fragments too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

ADMIN_ONLY = "Needs the admin key (403 with a user's key)."
OBJECT: dict[str, Any] = {"type": "object"}


def ref(schema: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{schema}"}


def err(desc: str) -> dict[str, Any]:
    """An error response: the shared ``Error`` body, ``{"error": {"code", "message", "field"?}}``."""
    return {"description": desc, "content": {"application/json": {"schema": ref("Error")}}}


def ok(desc: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"description": desc, "content": {"application/json": {"schema": schema or OBJECT}}}


def path_param(name: str, desc: str | None = None) -> dict[str, Any]:
    p: dict[str, Any] = {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
    if desc:
        p["description"] = desc
    return p


def query_param(name: str, desc: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": desc, "schema": {"type": "string"}}


AUTH_ERRORS = {"401": err("missing, invalid or revoked API key"), "403": err("not allowed for this key")}
BODY_ERRORS = {
    "400": err("malformed JSON or a bad field; 'field' names it"),
    "413": err("body larger than the gateway's limit"),
}
ID = path_param("id", "model id")
USER = path_param("name", "user name")


def admin_op(
    summary: str,
    params: Iterable[dict[str, Any]] = (),
    body: dict[str, Any] | None = None,
    response: dict[str, Any] | None = None,
    errors: Mapping[str, str] | None = None,
    tag: str = "admin",
) -> dict[str, Any]:
    """An operation that needs the admin key: JSON ``body`` schema (adds 400 and 413), 200
    ``response`` schema, and further ``errors`` as {status: description}."""
    op: dict[str, Any] = {"summary": summary, "description": ADMIN_ONLY, "tags": [tag]}
    if params:
        op["parameters"] = list(params)
    responses = {"200": ok("done", response), **AUTH_ERRORS}
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
        responses.update(BODY_ERRORS)
    responses.update({status: err(desc) for status, desc in (errors or {}).items()})
    op["responses"] = dict(sorted(responses.items()))
    return op


def merge(spec: dict[str, Any], fragment: Mapping[str, Any]) -> None:
    """Add a fragment's paths and components to ``spec``; describing an operation or a
    component twice is an error."""
    for path, ops in fragment.get("paths", {}).items():
        mine = spec["paths"].setdefault(path, {})
        if twice := mine.keys() & ops.keys():
            raise ValueError(f"{sorted(twice)} {path} described twice")
        mine.update(ops)
    for kind, items in fragment.get("components", {}).items():
        mine = spec["components"].setdefault(kind, {})
        if twice := mine.keys() & items.keys():
            raise ValueError(f"components.{kind} {sorted(twice)} described twice")
        mine.update(items)


IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "Makes a retry safe: a retry with the same key by the same user returns the original "
    "answer without charging again, with the response header Idempotent-Replayed: true. "
    "Reusing the key for a different request is 422; while the first request is still being "
    "answered, 409.",
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]{1,255}$"},
}


def openapi_spec(*fragments: Mapping[str, Any]) -> dict[str, Any]:
    """The core description with the extensions' ``fragments`` merged in."""
    value = {"oneOf": [{"type": "number"}, {"type": "string"}]}
    spec: dict[str, Any] = {
        "openapi": "3.0.3",
        "info": {
            "title": "AnalySIM MLaaS gateway",
            "version": "1",
            "description": "Decision-tree models served pay-per-query. Every answered row is charged at the "
            "model's price; rejected requests are never charged.",
        },
        "components": {
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A user's API key or the admin key",
                }
            },
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["code", "message"],
                            "properties": {
                                "code": {"type": "string"},
                                "message": {"type": "string"},
                                "field": {"type": "string"},
                            },
                        }
                    },
                },
                "PredictRequest": {
                    "type": "object",
                    "required": ["rows"],
                    "properties": {
                        "rows": {
                            "type": "array",
                            "minItems": 1,
                            "items": {
                                "oneOf": [
                                    {
                                        "type": "array",
                                        "items": value,
                                        "description": "values in feature order",
                                    },
                                    {
                                        "type": "object",
                                        "additionalProperties": value,
                                        "description": "by feature name",
                                    },
                                ]
                            },
                        }
                    },
                },
                "PredictResponse": {
                    "type": "object",
                    "properties": {
                        "predictions": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "label": value,
                                    "confidence": {
                                        "type": "number",
                                        "description": "if the policy reveals it",
                                    },
                                    "leaf": {"type": "integer", "description": "if the policy reveals it"},
                                },
                            },
                        },
                        "query_id": {"type": "integer"},
                        "charged": {"type": "number"},
                    },
                },
            },
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/models": {
                "get": {"summary": "List models", "responses": {"200": ok("models"), **AUTH_ERRORS}}
            },
            "/v1/models/{id}": {
                "get": {
                    "summary": "Input schema, model card and response policy (never the tree)",
                    "parameters": [ID],
                    "responses": {"200": ok("model"), "404": err("unknown model"), **AUTH_ERRORS},
                }
            },
            "/v1/models/{id}/predict": {
                "post": {
                    "summary": "Predict (charged per answered row)",
                    "parameters": [ID, IDEMPOTENCY_KEY],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": ref("PredictRequest")}},
                    },
                    "responses": {
                        "200": {
                            **ok("predictions", ref("PredictResponse")),
                            "headers": {
                                "Idempotent-Replayed": {
                                    "description": "'true' when this is the original answer to an earlier request "
                                    "with the same Idempotency-Key (not charged again)",
                                    "schema": {"type": "string", "enum": ["true"]},
                                }
                            },
                        },
                        "400": err(
                            "malformed JSON, a bad row or a malformed Idempotency-Key; 'field' names it"
                        ),
                        "401": AUTH_ERRORS["401"],
                        "403": err(
                            "not allowed for this key: the admin key, or queries refused by enforcement"
                        ),
                        "404": err("unknown model"),
                        "409": err(
                            "request_in_progress: a request with this Idempotency-Key is still being answered"
                        ),
                        "413": err("body or batch too large"),
                        "422": err(
                            "idempotency_key_reused: the Idempotency-Key was used for a different request"
                        ),
                        "429": err("quota exceeded or rate limited"),
                        "503": err("the ledger could not be read or written (nothing charged); answer_unreadable: "
                                   "the answer logged for this Idempotency-Key is damaged (send a new key)"),
                    },
                }
            },
            "/v1/usage": {
                "get": {
                    "summary": "The caller's queries and charges (admin: ?user=NAME)",
                    "parameters": [query_param("user", "another user's usage (admin only)")],
                    "responses": {"200": ok("usage"), "404": err("unknown user"), **AUTH_ERRORS},
                }
            },
            "/v1/openapi.json": {
                "get": {
                    "summary": "This document",
                    "responses": {"200": ok("OpenAPI"), "401": AUTH_ERRORS["401"]},
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "description": ADMIN_ONLY,
                    "tags": ["admin"],
                    "responses": {
                        "200": {
                            "description": "Prometheus text",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        },
                        **AUTH_ERRORS,
                    },
                }
            },
            "/v1/admin/users": {
                "get": admin_op("List users"),
                "post": admin_op(
                    "Create a user {name, quota_rows?, rate_limit?}; the API key is shown once",
                    body=OBJECT,
                    errors={"409": "the user exists"},
                ),
            },
            "/v1/admin/users/{name}": {
                "patch": admin_op(
                    "Set quota_rows / rate_limit", [USER], OBJECT, errors={"404": "unknown user"}
                )
            },
            "/v1/admin/users/{name}/rotate": {
                "post": admin_op(
                    "Issue a new key; the old one stops working", [USER], errors={"404": "unknown user"}
                )
            },
            "/v1/admin/users/{name}/revoke": {
                "post": admin_op("Revoke the user's key", [USER], errors={"404": "unknown user"})
            },
            "/v1/admin/models/{id}/policy": {
                "get": admin_op("Response policy and price", [ID], errors={"404": "unknown model"}),
                "put": admin_op(
                    "Change reveal_confidence, confidence_decimals, reveal_leaf, price",
                    [ID],
                    OBJECT,
                    errors={"404": "unknown model"},
                ),
            },
        },
    }
    for fragment in fragments:
        merge(spec, fragment)
    return spec
