"""The OpenAPI 3 description of the REST API, served at GET /v1/openapi.json."""

from __future__ import annotations

from typing import Any


def _err(desc: str) -> dict[str, Any]:
    return {"description": desc, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _ok(desc: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"description": desc, "content": {"application/json": {"schema": schema or {"type": "object"}}}}


AUTH_ERRORS = {"401": _err("missing, invalid or revoked API key"), "403": _err("not allowed for this key")}
ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
USER = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}


def _admin(summary: str, body: bool = False) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "tags": ["admin"], "responses": {"200": _ok("done"), **AUTH_ERRORS}}
    if body:
        op["requestBody"] = {"content": {"application/json": {"schema": {"type": "object"}}}}
        op["responses"]["400"] = _err("bad field")
    return op


def openapi_spec() -> dict[str, Any]:
    value = {"oneOf": [{"type": "number"}, {"type": "string"}]}
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "AnalySIM MLaaS gateway",
            "version": "1",
            "description": "Decision-tree models served pay-per-query. Every answered row is charged at the "
            "model's price; rejected requests are never charged.",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
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
                                    {"type": "array", "items": value, "description": "values in feature order"},
                                    {"type": "object", "additionalProperties": value, "description": "by feature name"},
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
                                    "confidence": {"type": "number", "description": "if the policy reveals it"},
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
            "/v1/models": {"get": {"summary": "List models", "responses": {"200": _ok("models"), **AUTH_ERRORS}}},
            "/v1/models/{id}": {
                "get": {
                    "summary": "Input schema, model card and response policy (never the tree)",
                    "parameters": [ID],
                    "responses": {"200": _ok("model"), "404": _err("unknown model"), **AUTH_ERRORS},
                }
            },
            "/v1/models/{id}/predict": {
                "post": {
                    "summary": "Predict (charged per answered row)",
                    "parameters": [ID],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/PredictRequest"}}},
                    },
                    "responses": {
                        "200": _ok("predictions", {"$ref": "#/components/schemas/PredictResponse"}),
                        "400": _err("malformed JSON or a bad row; 'field' names it"),
                        "404": _err("unknown model"),
                        "413": _err("body or batch too large"),
                        "429": _err("quota exceeded or rate limited"),
                        **AUTH_ERRORS,
                    },
                }
            },
            "/v1/usage": {
                "get": {
                    "summary": "The caller's queries and charges (admin: ?user=NAME)",
                    "parameters": [{"name": "user", "in": "query", "schema": {"type": "string"}}],
                    "responses": {"200": _ok("usage"), **AUTH_ERRORS},
                }
            },
            "/v1/openapi.json": {"get": {"summary": "This document", "responses": {"200": _ok("OpenAPI")}}},
            "/metrics": {"get": {"summary": "Prometheus metrics (admin)", "responses": {"200": {"description": "text"}}}},
            "/v1/admin/users": {
                "get": _admin("List users"),
                "post": _admin("Create a user {name, quota_rows?, rate_limit?}; the API key is shown once", True),
            },
            "/v1/admin/users/{name}": {"patch": {**_admin("Set quota_rows / rate_limit", True), "parameters": [USER]}},
            "/v1/admin/users/{name}/rotate": {"post": {**_admin("Issue a new key; the old one stops working"), "parameters": [USER]}},
            "/v1/admin/users/{name}/revoke": {"post": {**_admin("Revoke the user's key"), "parameters": [USER]}},
            "/v1/admin/models/{id}/policy": {
                "get": {**_admin("Response policy and price"), "parameters": [ID]},
                "put": {
                    **_admin("Change reveal_confidence, confidence_decimals, reveal_leaf, price", True),
                    "parameters": [ID],
                },
            },
        },
    }
