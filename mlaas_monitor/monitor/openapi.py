"""The OpenAPI fragment for the monitor's admin routes (``service.add_routes`` adds both)."""

from __future__ import annotations

from functools import partial
from typing import Any

from mlaas_monitor.monitor.config import ACTIONS, METHODS
from mlaas_monitor.openapi import admin_op, path_param, query_param, ref

MODEL = path_param("model", "model id")
GROUP = path_param("name", "group name")
op = partial(admin_op, tag="monitor")
UNKNOWN_MODEL = {"404": "unknown model"}
UNKNOWN_SUBJECT = {"404": "unknown model, or no such user or group"}
UNKNOWN_GROUP = {"404": "unknown group"}


def _obj(required: list[str] | None = None, **props: Any) -> dict[str, Any]:
    o: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        o["required"] = required
    return o


def _list(key: str, items: dict[str, Any]) -> dict[str, Any]:
    return _obj([key], **{key: {"type": "array", "items": items}})


def monitor_openapi(max_group_members: int, group_name_pattern: str) -> dict[str, Any]:
    num, integer, string = {"type": "number"}, {"type": "integer"}, {"type": "string"}
    unit = {"type": "number", "minimum": 0, "maximum": 1}
    method = {"type": "string", "enum": list(METHODS)}
    status = _obj(list(METHODS), **dict.fromkeys(METHODS, unit))
    names = {"type": "array", "items": string}
    schemas = {
        "MonitorStatus": {**status, "description": "extraction status per method, from 0 to 1"},
        "MonitorConfig": {
            **_obj(
                thresholds={
                    "type": "object",
                    "additionalProperties": {**unit, "nullable": True},
                    "description": "method: threshold; "
                    "a PUT replaces the whole map (a method left out or null is not warned on)",
                },
                default_method=method,
                first_eval={"type": "integer", "minimum": 1, "maximum": 1_000_000,
                            "description": "queries before a subject's first evaluation (then every min_refit or more)"},
                min_refit={"type": "integer", "minimum": 1, "maximum": 1_000_000},
                refit_fraction={"type": "number", "minimum": 0, "maximum": 10},
                ig_refit_fraction={"type": "number", "minimum": 0, "maximum": 10},
                auto_k={
                    "type": "integer",
                    "minimum": 0,
                    "maximum": 1000,
                    "description": "0 (off) or 2 to 1000",
                },
                auto_link={"type": "boolean", "description": "pool accounts whose queries differ in one feature"},
                link_min={"type": "integer", "minimum": 1, "maximum": 1_000_000},
                prada_delta={**unit, "description": "PRADA alarm when Shapiro-Wilk W < delta"},
                prada_min_queries={"type": "integer", "minimum": 1, "maximum": 1_000_000},
                ood_alarm={**unit, "description": "intent alarm when the out-of-distribution status reaches this"},
                ood_min_queries={"type": "integer", "minimum": 1, "maximum": 1_000_000},
                boundary_alarm={**unit, "description": "Quiring et al.'s alarm on the mean in-margin ratio (reported only)"},
                enforcement={
                    **_obj(action={"type": "string", "enum": list(ACTIONS)}, method=method, threshold=unit,
                           intent={"type": "boolean", "description": "act only on an attack-like stream"}),
                    "additionalProperties": False,
                },
                pool={"type": "boolean", "description": "pool rows by what they are, from any account (auto:pool, "
                                                        "auto:young, auto:model)"},
                reveal_eval={"type": "boolean", "description": "evaluate a subject when an answer shows it a new leaf identity"},
                pool_threshold={**unit, "description": "auto:pool is warned when its default-method status reaches this"},
                young_budget={**unit, "nullable": True,
                              "description": "warn when auto:young (rows of accounts before their first evaluation) "
                                             "reaches this; null: reported only"},
                pool_response={
                    **_obj(action={"type": "string", "enum": list(ACTIONS)},
                           top={"type": "integer", "minimum": 0, "maximum": 1_000_000,
                                "description": "accounts ranked by how much auto:pool's extent falls without them"},
                           extracting={"type": "boolean", "description": "also every account most of whose rows join "
                                                                          "the pool"},
                           new_accounts={"type": "boolean", "description": "also accounts first seen since the warning once "
                                                                              "the pool has taken one of their rows"},
                           hold={"type": "integer", "minimum": 0, "maximum": 1_000_000,
                                 "description": "the warning stands while the pool took a row within this many rows"}),
                    "additionalProperties": False,
                    "description": "what enforcement does while auto:pool's warning stands",
                },
            ),
            "additionalProperties": False,
            "description": "PUT takes any subset of the fields and answers the whole config",
        },
        "MonitorSubject": _obj(
            ["subject", "n_queries", "evaluated_at", "status", "warned"],
            subject={"type": "string", "description": "a user, group:NAME, auto:topK or auto:link-USER"},
            n_queries=integer,
            evaluated_at={"type": "integer", "description": "n_queries at the last evaluation"},
            status=ref("MonitorStatus"),
            warned={"type": "array", "items": method},
            members={**names, "description": "groups only"},
        ),
        "MonitorModel": _obj(
            ["model", "last_seq", "total_queries", "config", "default_method", "users", "groups"],
            model=string,
            last_seq={"type": "integer", "description": "the last query-log seq folded in"},
            total_queries=integer,
            config=ref("MonitorConfig"),
            default_method=method,
            users={"type": "array", "items": ref("MonitorSubject")},
            groups={"type": "array", "items": ref("MonitorSubject")},
            pools={"type": "array", "items": ref("MonitorSubject"),
                   "description": "auto:pool, auto:young and auto:model: rows pooled by what they are, from any account"},
            exposure={**unit, "description": "best_copy over every answered row of the model (a running maximum)"},
            pool_standing={"type": "boolean", "description": "auto:pool is warned and still growing"},
            attribution={"type": "array", "description": "while auto:pool is warned: how much its extent falls without "
                                                         "each account's rows, largest first",
                         "items": _obj(["account", "fall", "pooled_rows"], account=string, fall=unit, pooled_rows=integer)},
        ),
        "MonitorSubjectDetail": {
            "allOf": [
                ref("MonitorSubject"),
                _obj(
                    ["model", "leaves", "history"],
                    model=string,
                    leaves=_obj(
                        ["nodes", "counts", "covered_fraction"],
                        nodes={"type": "array", "items": integer, "description": "the model's leaf node ids"},
                        counts={"type": "array", "items": integer, "description": "queries per leaf"},
                        covered_fraction={"type": "array", "items": unit},
                    ),
                    history={
                        "type": "array",
                        "description": "status against number of queries, one point per evaluation",
                        "items": _obj(
                            ["n_queries", "seq", "ts"],
                            n_queries=integer,
                            seq=integer,
                            ts=num,
                            members=names,
                            **dict.fromkeys(METHODS, unit),
                        ),
                    },
                    member_status={
                        "type": "object",
                        "additionalProperties": ref("MonitorStatus"),
                        "description": "groups only: each member's status",
                    },
                ),
            ]
        },
        "ExtractionWarning": _obj(
            ["id", "model", "subject", "method", "threshold", "status", "n_queries", "seq", "ts"],
            id=integer,
            model=string,
            subject=string,
            method=method,
            threshold=unit,
            status=unit,
            n_queries=integer,
            seq=integer,
            ts=num,
        ),
        "MonitorGroup": {
            **_obj(
                ["name", "members"],
                name={"type": "string", "pattern": group_name_pattern},
                members={
                    "type": "array",
                    "items": string,
                    "minItems": 1,
                    "maxItems": max_group_members,
                    "description": "user names",
                },
            ),
            "additionalProperties": False,
        },
    }
    subject_detail = ref("MonitorSubjectDetail")
    paths = {
        "/v1/admin/monitor": {
            "get": op("Every model's monitor state", response=_list("models", ref("MonitorModel")))
        },
        "/v1/admin/monitor/{model}": {
            "get": op(
                "One model's monitor state", [MODEL], response=ref("MonitorModel"), errors=UNKNOWN_MODEL
            )
        },
        "/v1/admin/monitor/{model}/evaluate": {
            "post": op(
                "Evaluate (and refit) every subject of the model now",
                [MODEL],
                response=ref("MonitorModel"),
                errors=UNKNOWN_MODEL,
            )
        },
        "/v1/admin/monitor/{model}/config": {
            "get": op(
                "The model's monitor config", [MODEL], response=ref("MonitorConfig"), errors=UNKNOWN_MODEL
            ),
            "put": op(
                "Change the model's monitor config",
                [MODEL],
                ref("MonitorConfig"),
                ref("MonitorConfig"),
                UNKNOWN_MODEL,
            ),
        },
        "/v1/admin/monitor/{model}/users/{name}": {
            "get": op(
                "A user's status, history and per-leaf coverage",
                [MODEL, path_param("name", "user name")],
                response=subject_detail,
                errors=UNKNOWN_SUBJECT,
            )
        },
        "/v1/admin/monitor/{model}/groups/{name}": {
            "get": op(
                "A group's status, history, per-leaf coverage and member status",
                [MODEL, GROUP],
                response=subject_detail,
                errors=UNKNOWN_SUBJECT,
            )
        },
        "/v1/admin/monitor/{model}/subjects/{subject}": {
            "get": op(
                "Any subject: a user, group:NAME or auto:topK",
                [MODEL, path_param("subject", "a user, group:NAME or auto:topK")],
                response=subject_detail,
                errors=UNKNOWN_SUBJECT,
            )
        },
        "/v1/admin/monitor/{model}/actions": {
            "get": op(
                "Enforcement decisions taken, changed or lifted on the model (action none: lifted), each with its "
                "reason, and those in force",
                [MODEL],
                response=_obj(["model", "actions", "current"], model=string,
                              actions={"type": "array", "items": _obj(
                                  ["id", "user", "action", "reason", "seq", "ts"], id=integer, model=string, user=string,
                                  action={"type": "string", "enum": list(ACTIONS)}, reason=string, seq=integer, ts=num)},
                              current={"type": "array", "items": _obj(
                                  ["user", "action", "reason"], user=string, action={"type": "string", "enum": list(ACTIONS)},
                                  reason=string)}),
                errors=UNKNOWN_MODEL,
            )
        },
        "/v1/admin/warnings": {
            "get": op(
                "Extraction warnings, oldest first",
                [query_param("model", "only this model's"), query_param("subject", "only this subject's")],
                response=_list("warnings", ref("ExtractionWarning")),
                errors={"404": "unknown model (?model=)"},
            )
        },
        "/v1/admin/groups": {
            "get": op("Declared groups of colluding users", response=_list("groups", ref("MonitorGroup"))),
            "post": op(
                "Declare a group (evaluated at once on every model its members queried)",
                body=ref("MonitorGroup"),
                response=ref("MonitorGroup"),
                errors={"409": "the group exists"},
            ),
        },
        "/v1/admin/groups/{name}": {
            "get": op(
                "A group and its status per model",
                [GROUP],
                response=_obj(
                    ["name", "members", "models"],
                    name=string,
                    members=names,
                    models={
                        "type": "object",
                        "additionalProperties": ref("MonitorSubject"),
                        "description": "model id: the group's status",
                    },
                ),
                errors=UNKNOWN_GROUP,
            ),
            "delete": op(
                "Remove a group",
                [GROUP],
                response=_obj(["name", "deleted"], name=string, deleted={"type": "boolean"}),
                errors=UNKNOWN_GROUP,
            ),
        },
    }
    return {"paths": paths, "components": {"schemas": schemas}}
