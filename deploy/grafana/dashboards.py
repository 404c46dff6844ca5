"""The Grafana dashboards, as code: ``python deploy/grafana/dashboards.py`` writes
deploy/grafana/dashboards/*.json (committed; tests/test_deploy_grafana.py fails when they are
stale). Panels read the recording rules of deploy/prometheus/rules where one exists; template
variables (datasource, VC, GPU model, agent, model, user, subject, method) instead of fixed
values. Grafana schema version 39 (Grafana 11)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards"
SCHEMA_VERSION = 39
DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"


@dataclass
class Panel:
    title: str
    exprs: list[tuple[str, str]]  # (PromQL, legend)
    unit: str = "short"
    kind: str = "timeseries"
    width: int = 12
    height: int = 8
    description: str = ""
    max: float | None = None
    stack: bool = False
    instant: bool = False

    def to_json(self, pid: int, x: int, y: int) -> dict[str, Any]:
        defaults: dict[str, Any] = {"unit": self.unit}
        if self.max is not None:
            defaults.update(min=0, max=self.max)
        if self.kind == "timeseries":
            defaults["custom"] = {"fillOpacity": 20 if self.stack else 5, "lineWidth": 1, "showPoints": "never",
                                  "stacking": {"mode": "normal" if self.stack else "none", "group": "A"}}
        options: dict[str, Any] = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                                   "tooltip": {"mode": "multi", "sort": "desc"}}
        if self.kind in ("stat", "bargauge"):
            options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                       "orientation": "horizontal"}
        if self.kind == "table":
            options = {"showHeader": True}
        return {
            "id": pid, "type": self.kind, "title": self.title, "description": self.description, "datasource": DS,
            "gridPos": {"x": x, "y": y, "w": self.width, "h": self.height},
            "fieldConfig": {"defaults": defaults, "overrides": []}, "options": options,
            "targets": [
                {"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": legend,
                 "range": not self.instant, "instant": self.instant, **({"format": "table"} if self.kind == "table" else {})}
                for i, (expr, legend) in enumerate(self.exprs)
            ],
        }  # fmt: skip


@dataclass
class Var:
    name: str
    label: str
    query: str  # label_values(...)
    multi: bool = True
    default_all: bool = True
    default: str | None = None  # the value chosen at first (a single-value variable)

    def to_json(self) -> dict[str, Any]:
        current = {"selected": True, "text": ["All"], "value": ["$__all"]} if self.default_all else \
            {"selected": True, "text": self.default, "value": self.default} if self.default else {}
        return {
            "name": self.name, "label": self.label, "type": "query", "datasource": DS,
            "query": {"query": self.query, "refId": f"var-{self.name}"}, "definition": self.query,
            "refresh": 2, "sort": 1, "multi": self.multi, "includeAll": True, "allValue": ".*",
            "current": current, "options": [], "hide": 0,
        }  # fmt: skip


@dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    rows: list[tuple[str, list[Panel]]]
    variables: list[Var] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        panels: list[dict[str, Any]] = []
        y, pid = 0, 1
        for row_title, row in self.rows:
            panels.append({"id": pid, "type": "row", "title": row_title, "collapsed": False, "panels": [],
                           "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}})
            pid, y, x, row_h = pid + 1, y + 1, 0, 0
            for p in row:
                if x + p.width > 24:
                    x, y, row_h = 0, y + row_h, 0
                panels.append(p.to_json(pid, x, y))
                pid, x, row_h = pid + 1, x + p.width, max(row_h, p.height)
            y += row_h
        datasource = {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
                      "current": {}, "hide": 0, "options": [], "refresh": 1}
        return {
            "uid": self.uid, "title": self.title, "description": self.description, "tags": ["analysim"],
            "schemaVersion": SCHEMA_VERSION, "version": 1, "editable": True, "graphTooltip": 1,
            "time": {"from": "now-30m", "to": "now"}, "refresh": "10s", "timezone": "browser",
            "timepicker": {}, "fiscalYearStartMonth": 0, "liveNow": False, "weekStart": "",
            "annotations": {"list": [{
                "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
                "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"}]},
            "links": [{"title": "AnalySIM", "type": "dashboards", "tags": ["analysim"], "asDropdown": True}],
            "templating": {"list": [datasource, *(v.to_json() for v in self.variables)]},
            "panels": panels,
        }  # fmt: skip


VC_GPU = 'vc=~"$vc", gpu_model=~"$gpu_model"'


def cluster() -> Dashboard:
    return Dashboard("analysim-cluster", "AnalySIM / Cluster",
        "The scheduler's view of the emulated cluster: allocation by VC and GPU model, the queue, job "
        "completion and queueing times, fragmentation, preemptions and migrations, virtual-time speed.",
        [("Allocation", [
            Panel("GPUs allocated by VC", [(f"sum by (vc) (analysim_allocated_gpus{{{VC_GPU}}})", "{{vc}}")],
                  stack=True, description="GPUs held by running jobs (fractional for GPU-sharing jobs)."),
            Panel("Allocation by GPU model", [('analysim:gpu_allocation:ratio_by_model{gpu_model=~"$gpu_model"}',
                                               "{{gpu_model}}")], unit="percentunit", max=1),
            Panel("Allocation by VC and GPU model", [(f"analysim:gpu_allocation:ratio_by_vc_model{{{VC_GPU}}}",
                                                      "{{vc}} {{gpu_model}}")], unit="percentunit", stack=True),
            Panel("Cluster allocation", [("analysim:gpu_allocation:ratio", "allocated")], unit="percentunit",
                  kind="stat", width=6, max=1),
            Panel("GPUs up", [('sum by (gpu_model) (analysim_cluster_gpus{gpu_model=~"$gpu_model"})', "{{gpu_model}}")],
                  kind="stat", width=6),
        ]),
         ("Queue and jobs", [
            Panel("Pending jobs by VC", [('analysim:pending_jobs:sum_by_vc{vc=~"$vc"}', "{{vc}}")], stack=True),
            Panel("Pending GPU demand by VC", [('sum by (vc) (analysim_pending_gpus{vc=~"$vc"})', "{{vc}}")], stack=True),
            Panel("Job completion time", [("analysim:job_completion_time_seconds:quantile_rate5m", "p{{quantile}}")],
                  unit="s", description="Virtual seconds from submission to completion (quantiles over 5 minutes)."),
            Panel("Queueing delay", [("analysim:job_queueing_delay_seconds:quantile_rate5m", "p{{quantile}}")],
                  unit="s", description="Virtual seconds from submission to first start."),
            Panel("Jobs started and completed per wall second", [
                (f'sum by (vc) (rate(analysim_jobs_started_total{{vc=~"$vc"}}[{RATE}]))', "started {{vc}}"),
                (f'sum(rate(analysim_jobs_completed_total{{vc=~"$vc"}}[{RATE}]))', "completed")], unit="ops"),
            Panel("Preemptions and migrations per wall second", [
                (f'sum by (vc) (rate(analysim_jobs_preempted_total{{vc=~"$vc"}}[{RATE}]))', "preempted {{vc}}"),
                (f'sum by (vc) (rate(analysim_jobs_migrated_total{{vc=~"$vc"}}[{RATE}]))', "migrated {{vc}}")], unit="ops"),
        ]),
         ("Fragmentation, time and the scheduler", [
            Panel("Fragmentation", [("analysim_fragmentation_ratio", "fragmented / cluster GPUs")], unit="percentunit",
                  width=8, description="Free GPUs the head-of-line job cannot use, over the cluster's GPUs."),
            Panel("Virtual-time speed", [("analysim:virtual_time:deriv1m", "achieved"),
                                         ("analysim_clock_speed_ratio", "reported")], unit="x", width=8,
                  description="Virtual seconds per wall second."),
            Panel("Nodes", [("sum by (state) (analysim_nodes)", "{{state}}"),
                            ("analysim_agents_connected", "agents connected")], width=8),
            Panel("Decision latency p99", [("analysim:scheduler_decision_latency_seconds:quantile_rate5m", "p99")],
                  unit="s", width=12),
            Panel("gRPC calls by method and code", [
                (f"sum by (grpc_method, grpc_code) (rate(analysim_grpc_server_handled_total[{RATE}]))",
                 "{{grpc_method}} {{grpc_code}}")], unit="reqps", width=12),
        ])],
        [Var("vc", "VC", "label_values(analysim_jobs_submitted_total, vc)"),
         Var("gpu_model", "GPU model", "label_values(analysim_cluster_gpus, gpu_model)")])  # fmt: skip


AGENT = 'instance=~"$agent", gpu_model=~"$gpu_model"'


def nodes() -> Dashboard:
    return Dashboard("analysim-nodes", "AnalySIM / Nodes",
        "Per-agent GPU telemetry (synthetic, from each fake node agent) and the agents' liveness.",
        [("GPUs", [
            Panel("GPU utilization by node", [(f"avg by (node) (analysim_gpu_utilization_ratio{{{AGENT}}})", "{{node}}")],
                  unit="percentunit", max=1),
            Panel("GPU allocation by node", [(f"avg by (node) (analysim_gpu_allocated_ratio{{{AGENT}}})", "{{node}}")],
                  unit="percentunit", max=1),
            Panel("GPU memory used", [(f"sum by (instance) (analysim_gpu_memory_used_bytes{{{AGENT}}})", "{{instance}}"),
                                      (f"sum(analysim_gpu_memory_total_bytes{{{AGENT}}})", "total")], unit="bytes"),
            Panel("Board power by agent", [(f"sum by (instance) (analysim_gpu_power_watts{{{AGENT}}})", "{{instance}}")],
                  unit="watt", stack=True),
            Panel("Hottest GPU by node", [(f"max by (node) (analysim_gpu_temperature_celsius{{{AGENT}}})", "{{node}}")],
                  unit="celsius"),
            Panel("Healthy GPUs by agent", [(f"sum by (instance) (analysim_gpu_healthy{{{AGENT}}})", "{{instance}}")],
                  stack=True),
        ]),
         # dcgm-exporter's names (node_agent/metrics.py): what dashboards for real GPU clusters read.
         ("GPUs under dcgm-exporter's names", [
            Panel("GPU utilization by job (pod)", [
                ('avg by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL{instance=~"$agent", pod!=""})', "{{namespace}}/{{pod}}")],
                  unit="percent", max=100, width=8,
                  description="DCGM_FI_DEV_GPU_UTIL of the GPUs each running job holds (pod = the job)."),
            Panel("Framebuffer used by GPU model", [
                ('sum by (modelName) (DCGM_FI_DEV_FB_USED{instance=~"$agent"})', "used {{modelName}}"),
                ('sum by (modelName) (DCGM_FI_DEV_FB_FREE{instance=~"$agent"})', "free {{modelName}}")],
                  unit="mbytes", width=8),
            Panel("Power draw by node", [('sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE{instance=~"$agent"})', "{{Hostname}}")],
                  unit="watt", stack=True, width=8),
            Panel("GPU temperature (hottest) by node", [
                ('max by (Hostname) (DCGM_FI_DEV_GPU_TEMP{instance=~"$agent"})', "{{Hostname}}")], unit="celsius", width=8),
            Panel("SM clock by node", [('avg by (Hostname) (DCGM_FI_DEV_SM_CLOCK{instance=~"$agent"}) * 1e6', "{{Hostname}}")],
                  unit="hertz", width=8),
            Panel("XID errors", [('max by (Hostname) (DCGM_FI_DEV_XID_ERRORS{instance=~"$agent"})', "{{Hostname}}")],
                  width=8, description="The last XID error of any GPU of the node (0: none)."),
        ]),
         ("Agents", [
            Panel("Agents up (scraped) and connected (stream open)", [
                ('up{job="agent", instance=~"$agent"}', "up {{instance}}"),
                ('analysim_agent_connected{instance=~"$agent"}', "connected {{instance}}")], max=1, width=8),
            Panel("Heartbeats and stream messages", [
                (f'sum by (instance, direction) (rate(analysim_agent_stream_messages_total{{instance=~"$agent"}}[{RATE}]))',
                 "{{instance}} {{direction}}")], unit="ops", width=8,
                  description="Each agent's messages to and from the scheduler: heartbeats, job events, commands."),
            Panel("Running jobs by agent", [('analysim_agent_running_jobs{instance=~"$agent"}', "{{instance}}")],
                  stack=True, width=8),
            Panel("Agent memory", [('process_resident_memory_bytes{job="agent", instance=~"$agent"}', "{{instance}}")],
                  unit="bytes", width=12),
            Panel("Agent sessions lost (scheduler)", [("increase(analysim_agents_lost_total[5m])", "lost in 5m")],
                  width=12),
        ])],
        [Var("agent", "Agent", 'label_values(up{job="agent"}, instance)'),
         Var("gpu_model", "GPU model", "label_values(analysim_gpu_utilization_ratio, gpu_model)")])  # fmt: skip


def gateway() -> Dashboard:
    return Dashboard("analysim-gateway", "AnalySIM / Gateway",
        "The MLaaS gateway: requests and rows by route, model and user, latency, refusals, and the ledger.",
        [("Traffic", [
            Panel("Requests by route and status", [
                (f'sum by (protocol, route, status) (rate(analysim_gateway_requests_total{{route=~"$route"}}[{RATE}]))',
                 "{{protocol}} {{route}} {{status}}")], unit="reqps"),
            Panel("Rows answered by model", [
                (f'sum by (model) (rate(analysim_gateway_rows_answered_total{{model=~"$model"}}[{RATE}]))', "{{model}}")],
                  unit="rowsps", stack=True),
            # max: every replica exports the shared ledger's per-user rows alike.
            Panel("Rows by user", [(f'max by (user) (rate(analysim_gateway_user_rows_total{{user=~"$user"}}[{RATE}]))',
                                    "{{user}}")], unit="rowsps", stack=True),
            Panel("Latency", [
                (f'histogram_quantile(0.5, sum by (le, route) (rate(analysim_gateway_request_duration_seconds_bucket{{route=~"$route"}}[{RATE}])))',
                 "p50 {{route}}"),
                (f'histogram_quantile(0.99, sum by (le, route) (rate(analysim_gateway_request_duration_seconds_bucket{{route=~"$route"}}[{RATE}])))',
                 "p99 {{route}}")], unit="s"),
        ]),
         ("Refusals and errors", [
            Panel("Refusals by reason", [(f"sum by (reason) (rate(analysim_gateway_rejections_total[{RATE}]))",
                                          "{{reason}}")], unit="reqps", stack=True,
                  description="Requests refused: bad input, auth, quotas, rate limits, extraction enforcement."),
            Panel("Server error ratio", [("analysim:gateway_errors:ratio_rate5m", "5xx and gRPC server errors")],
                  unit="percentunit"),
        ]),
         ("Ledger", [
            Panel("Credits charged by model", [
                (f'sum by (model) (rate(analysim_gateway_charged_credits_total{{model=~"$model"}}[{RATE}]))', "{{model}}")],
                  unit="short", width=8),
            Panel("Rows charged by user", [('max by (user) (analysim_gateway_user_rows_total{user=~"$user"})', "{{user}}")],
                  kind="bargauge", width=8, instant=True),
            Panel("Quota used by user", [('analysim:gateway_quota_used:ratio{user=~"$user"}', "{{user}}")],
                  kind="bargauge", unit="percentunit", width=8, max=1, instant=True),
            Panel("Queries per group commit", [
                (f"histogram_quantile(0.5, sum by (le) (rate(analysim_gateway_commit_batch_queries_bucket[{RATE}])))",
                 "median batch")], width=12),
            Panel("Gateway memory", [('process_resident_memory_bytes{job="gateway"}', "resident memory")],
                  unit="bytes", width=12),
        ])],
        [Var("model", "Model", "label_values(analysim_gateway_rows_answered_total, model)"),
         Var("user", "User", "label_values(analysim_gateway_user_rows_total, user)"),
         Var("route", "Route", "label_values(analysim_gateway_requests_total, route)")])  # fmt: skip


SUBJ = 'model=~"$model", subject=~"$subject"'


def extraction() -> Dashboard:
    return Dashboard("analysim-extraction", "AnalySIM / Extraction monitor",
        "How much of each served model each user and each colluding group has extracted, the warnings, "
        "the alerts and the enforcement.",
        [("Status", [
            Panel("Extraction status by subject", [
                (f'max by (subject) (analysim_extraction_status{{{SUBJ}, method=~"$method"}})', "{{subject}}"),
                ('max(analysim_extraction_threshold{model=~"$model", method=~"$method"})', "threshold")],
                  unit="percentunit", max=1, width=16,
                  description="Per user and per group (group:NAME, auto:topK); the method picks the measure."),
            Panel("Subjects over their threshold", [
                ('ALERTS{alertname="AnalysimExtractionThresholdCrossed", alertstate="firing", model=~"$model"}',
                 "{{subject}}")], kind="table", width=8, instant=True),
            Panel("Groups", [('analysim_extraction_status{model=~"$model", subject=~"group:.*", method=~"$method"}',
                              "{{subject}}")], unit="percentunit", max=1, width=12),
            Panel("Every method, now", [(f"analysim_extraction_status{{{SUBJ}}}", "{{subject}} {{method}}")],
                  kind="table", width=12, instant=True),
        ]),
         ("Pooled by what the queries are", [
            Panel("Model exposure and the pools", [
                ('max by (model) (analysim_extraction_exposure_ratio{model=~"$model"})', "{{model}} exposure"),
                ('max by (model, subject) (analysim_extraction_status{model=~"$model", subject=~"auto:(pool|young)", '
                 'method=~"$method"})', "{{model}} {{subject}}")],
                  unit="percentunit", max=1, width=24,
                  description="Exposure: the best copy every answer of the model, to every account, makes together "
                              "(reported, never alarmed: on an easy model customers reveal it). auto:pool: rows one "
                              "feature from an earlier row and out of distribution or in a boundary margin, from any "
                              "account; auto:young: rows of accounts before their first evaluation."),
            Panel("Pool attribution", [
                ('max by (model, account) (analysim_extraction_attribution_ratio{model=~"$model"})', "{{account}}")],
                  kind="table", width=12, instant=True,
                  description="While auto:pool is warned: how much its best copy falls without each account's rows "
                              "(the accounts with the most pooled rows); the pool response acts on the first."),
            Panel("Enforcement actions", [
                ('sum by (rule, action) (analysim_monitor_actions_total{model=~"$model"})', "{{rule}} {{action}}")],
                  kind="stat", width=12,
                  description="Decisions taken (degrade, refuse) or lifted (none), by the per-subject rule or the pool "
                              "response; each with its reason at /v1/admin/monitor/MODEL/actions."),
        ]),
         ("Warnings and enforcement", [
            Panel("Warnings by method", [('sum by (method) (analysim_extraction_warnings_total{model=~"$model"})',
                                          "{{method}}")], kind="stat", width=8),
            Panel("Queries refused by enforcement", [
                (f'sum(rate(analysim_gateway_rejections_total{{reason="extraction_refused"}}[{RATE}]))', "refused")],
                  unit="reqps", width=8),
            Panel("Monitor cost", [
                (f"histogram_quantile(0.99, sum by (le) (rate(analysim_monitor_update_duration_seconds_bucket[{RATE}])))",
                 "update p99"),
                (f'sum(rate(analysim_monitor_refits_total{{model=~"$model"}}[{RATE}]))', "evaluations/s")], width=8),
        ]),
         ("Monitor", [
            Panel("Monitor lag behind the query log", [
                ('analysim:monitor_lag_seconds:quantile_rate5m{quantile="0.5"}', "p50"),
                ('analysim:monitor_lag_seconds:quantile_rate5m{quantile="0.99"}', "p99")], unit="s",
                  description="From a query's commit to the monitor folding it in: enforcement comes this much later."),
            Panel("Gateways subscribed to the monitor", [("analysim_gateway_monitor_up", "{{instance}}")], max=1,
                  description="1 while a gateway's decisions feed from the monitor answers (0: it enforces the last "
                              "decisions it received)."),
        ])],
        [Var("model", "Model", "label_values(analysim_extraction_status, model)"),
         Var("subject", "Subject", 'label_values(analysim_extraction_status{model=~"$model"}, subject)'),
         Var("method", "Method", "label_values(analysim_extraction_status, method)", multi=False, default_all=False)])  # fmt: skip


CQ = 'cluster_queue=~"$cluster_queue"'
CQ_RES = f'{CQ}, resource=~"$resource"'
WAIT = f"sum by (le) (rate(kueue_admission_wait_time_seconds_bucket{{{CQ}}}[{RATE}]))"


def kueue() -> Dashboard:
    """Kueue's own metric names (scheduler_svc/kueue_metrics.py), as a Kueue dashboard reads them:
    a run under a partition (--partition) exports them."""
    return Dashboard("analysim-kueue", "AnalySIM / Kueue",
        "The scheduler under a Kueue partition (--partition), read through Kueue's own metrics: pending "
        "workloads by status, admissions and their wait (virtual seconds), usage against each ClusterQueue's "
        "nominal quota, borrowing, evictions and preemptions by reason.",
        [("Workloads", [
            Panel("Pending workloads by status", [
                (f"sum by (status) (kueue_pending_workloads{{{CQ}}})", "{{status}}")], stack=True, width=8,
                  description="active: in the admission queue; inadmissible: the ClusterQueue's quota cannot "
                              "admit it now (BestEffortFIFO)."),
            Panel("Pending workloads by ClusterQueue", [
                (f"sum by (cluster_queue) (kueue_pending_workloads{{{CQ}}})", "{{cluster_queue}}")], stack=True,
                  width=8),
            Panel("Admitted active workloads", [
                (f"sum by (cluster_queue) (kueue_admitted_active_workloads{{{CQ}}})", "{{cluster_queue}}")],
                  stack=True, width=8),
            Panel("Admissions per wall second", [
                (f"sum by (cluster_queue) (rate(kueue_admitted_workloads_total{{{CQ}}}[{RATE}]))", "{{cluster_queue}}")],
                  unit="ops", stack=True),
            Panel("Admission wait", [
                (f"histogram_quantile(0.5, {WAIT})", "p50"), (f"histogram_quantile(0.9, {WAIT})", "p90"),
                (f"histogram_quantile(0.99, {WAIT})", "p99")], unit="s",
                  description="From a workload's creation (or its requeue) to its admission, in virtual seconds."),
        ]),
         ("Quota", [
            Panel("Usage and nominal quota by ClusterQueue", [
                (f"sum by (cluster_queue) (kueue_cluster_queue_resource_usage{{{CQ_RES}}})", "usage {{cluster_queue}}"),
                (f"sum by (cluster_queue) (kueue_cluster_queue_nominal_quota{{{CQ_RES}}})", "nominal {{cluster_queue}}")],
                  width=12, description="In Kubernetes' units: nvidia.com/gpu in GPUs, cpu in cores, memory in bytes."),
            Panel("Usage over nominal quota", [
                (f"sum by (cluster_queue) (kueue_cluster_queue_resource_usage{{{CQ_RES}}}) / "
                 f"sum by (cluster_queue) (kueue_cluster_queue_nominal_quota{{{CQ_RES}}} > 0)", "{{cluster_queue}}")],
                  kind="bargauge", unit="percentunit", width=12, instant=True,
                  description="Above 100%: the ClusterQueue borrows from its cohort."),
            Panel("Borrowing (usage past nominal quota)", [
                (f"sum by (cluster_queue) (clamp_min(kueue_cluster_queue_resource_usage{{{CQ_RES}}} - "
                 f"kueue_cluster_queue_nominal_quota{{{CQ_RES}}}, 0))", "{{cluster_queue}}")], stack=True, width=8),
            Panel("Usage by cohort", [
                ('sum by (cohort) (kueue_cluster_queue_resource_usage{resource=~"$resource"})', "{{cohort}}")],
                  stack=True, width=8),
            Panel("Borrowing limits", [
                (f"kueue_cluster_queue_borrowing_limit{{{CQ_RES}}} < +Inf", "{{cluster_queue}} {{flavor}}")],
                  kind="bargauge", width=8, instant=True,
                  description="ClusterQueues with a borrowingLimit (the others may borrow all their cohort lends)."),
        ]),
         ("Evictions and preemptions", [
            Panel("Evictions by reason", [
                (f"sum by (reason) (rate(kueue_evicted_workloads_total{{{CQ}}}[{RATE}]))", "{{reason}}")],
                  unit="ops", stack=True,
                  description="Preempted: to make room for another workload; NodeFailures: its nodes went down."),
            Panel("Preemptions by reason and preempting ClusterQueue", [
                (f'sum by (preempting_cluster_queue, reason) (rate(kueue_preempted_workloads_total'
                 f'{{preempting_cluster_queue=~"$cluster_queue"}}[{RATE}]))', "{{preempting_cluster_queue}} {{reason}}")],
                  unit="ops", stack=True),
        ])],
        [Var("cluster_queue", "ClusterQueue", "label_values(kueue_pending_workloads, cluster_queue)"),
         Var("resource", "Resource", "label_values(kueue_cluster_queue_nominal_quota, resource)", multi=False,
             default_all=False, default="nvidia.com/gpu")])  # fmt: skip


DASHBOARDS = {"cluster": cluster, "nodes": nodes, "gateway": gateway, "extraction": extraction, "kueue": kueue}


def render() -> dict[str, str]:
    """File name -> JSON text."""
    return {f"{name}.json": json.dumps(make().to_json(), indent=2) + "\n" for name, make in DASHBOARDS.items()}


def main() -> int:
    OUT.mkdir(exist_ok=True)
    for name, text in render().items():
        (OUT / name).write_text(text)
        print(f"wrote {OUT / name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
