"""What a running stack must show through Prometheus' HTTP API, whichever way it runs: as local
processes (tests/test_deploy_stack.py) or in containers (tests/test_deploy_containers.py). Every
wait polls its condition until a deadline."""

from __future__ import annotations

import json
import math
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.polling import wait_until
from tests.test_deploy_grafana import dashboards, expand, panels

EXTRACTION = "AnalysimExtractionThresholdCrossed"
# The tests' changes to compose's environment: attackers at 100 requests/s and jobs at 5/s (so
# that it all happens within seconds), the scheduler at 3000x.
TEST_RATES = {"traffic-gateway": {"ANALYSIM_ATTACK_RATE": "100", "ANALYSIM_QUERY_RATE": "10"},
              "traffic-jobs": {"ANALYSIM_JOB_RATE": "5"}, "scheduler": {"ANALYSIM_SPEED": "3000"}}
ATTACKERS = {"attacker-pathfinding", "group:ring"}
# Both stack tests run the scheduler under this compose overlay: the demo cluster's Kueue
# partition, whose metrics the Kueue dashboard reads.
KUEUE_OVERLAY = Path(__file__).resolve().parent.parent / "deploy" / "compose.kueue.yaml"
BENIGN = ["benign-0", "benign-1", "benign-2"]


class Prom:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: str) -> Any:
        q = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{q}", timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """An instant query, at ``at`` (Unix seconds) or at Prometheus' now."""
        params = {"query": expr} if at is None else {"query": expr, "time": repr(at)}
        return self.get("/api/v1/query", **params)["result"]

    def has_data(self, expr: str) -> bool:
        """At least one sample with a number (not NaN: a quantile of nothing is no data)."""
        return any(not math.isnan(float(r["value"][1])) for r in self.query(expr))

    def alerts(self, name: str, state: str = "firing") -> list[dict]:
        return [a["labels"] for a in self.get("/api/v1/alerts")["alerts"]
                if a["labels"]["alertname"] == name and a["state"] == state]  # fmt: skip


def wait_targets_up(prom: Prom, count: int, deadline_s: float, what: str) -> None:
    def up() -> bool:
        active = prom.get("/api/v1/targets")["activeTargets"]
        return len(active) == count and all(t["health"] == "up" for t in active)

    wait_until(up, deadline_s, f"every target scraped ({what})", poll_s=0.2)


def wait_extraction_alerts(prom: Prom, deadline_s: float) -> None:
    """The extraction alert fires for the pathfinding attacker and for the colluding group."""
    try:
        wait_until(lambda: {a["subject"] for a in prom.alerts(EXTRACTION)} >= ATTACKERS, deadline_s,
                   "the extraction alert for the pathfinding attacker and the group", poll_s=0.2)
    except AssertionError as e:
        status = {(r["metric"]["subject"], r["metric"]["method"]): r["value"][1]
                  for r in prom.query("max by (subject, method) (analysim_extraction_status)")}
        intent = {r["metric"]["subject"]: r["value"][1] for r in prom.query("analysim_extraction_intent_alarm")}
        raise AssertionError(f"{e}: firing {prom.alerts(EXTRACTION)}, pending {prom.alerts(EXTRACTION, 'pending')}, "
                             f"status {status}, intent {intent}") from None


# The dashboard panels of the pooled subjects, the exposure and the attribution.
POOL_PANELS = ("Model exposure and the pools", "Pool attribution")
POOL_SERIES = {"auto:pool": 'analysim_extraction_status{subject="auto:pool", method="best_copy"}',
               "exposure": "analysim_extraction_exposure_ratio", "attribution": "analysim_extraction_attribution_ratio"}


def wait_pool_warned(prom: Prom, deadline_s: float) -> dict[str, list[float]]:
    """The attackers' probes (one feature from earlier rows, out of distribution or in a
    margin) make auto:pool warn: its status, the model's exposure and the attribution (a
    series only while the pool is warned) are all non-empty series of shares (0..1), the
    pool's above 0, and every query of the panels that draw them has data. The values seen."""
    seen: dict[str, list[float]] = {}

    def all_there() -> bool:
        seen.update({k: [float(r["value"][1]) for r in prom.query(q)] for k, q in POOL_SERIES.items()})
        return all(seen.values()) and max(seen["auto:pool"]) > 0

    try:
        wait_until(all_there, deadline_s, "auto:pool warned: its status, the exposure and the attribution", poll_s=0.5)
    except AssertionError as e:
        raise AssertionError(f"{e}: {seen}") from None
    assert all(0.0 <= v <= 1.0 for vs in seen.values() for v in vs), seen
    queries = [(what, q) for what, q in panel_queries() if what.split(": ", 1)[-1] in POOL_PANELS]
    assert len(queries) >= 3, queries
    missing = [what for what, q in queries if not prom.has_data(q)]
    assert not missing, f"no data for: {missing}"
    return seen


# The dashboard of a scheduler run under a Kueue partition (deploy/compose.kueue.yaml): without one
# its metrics do not exist.
KUEUE_DASHBOARD = "kueue.json"


def panel_queries(skip: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(what, PromQL) of every panel query and every template variable of every dashboard (but
    those named in ``skip``)."""
    shown = {name: d for name, d in dashboards().items() if name not in skip}
    queries = [(f"{name}: {p['title']}", expand(t["expr"], d))
               for name, d in shown.items() for p in panels(d) for t in p["targets"]]  # fmt: skip
    for name, d in shown.items():
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                metric, label = v["query"]["query"][len("label_values("):-1].rsplit(", ", 1)
                queries.append((f"{name}: ${v['name']}", expand(f"count by ({label}) ({metric})", d)))
    return queries


def wait_every_panel_has_data(prom: Prom, deadline_s: float, skip: tuple[str, ...] = ()) -> None:
    missing = panel_queries(skip)

    def all_have_data() -> bool:
        nonlocal missing
        missing = [(what, q) for what, q in missing if not prom.has_data(q)]
        return not missing

    try:
        wait_until(all_have_data, deadline_s, "data for every panel", poll_s=0.5)
    except AssertionError:
        raise AssertionError(f"no data for: {missing}") from None


def agent_down_alert_fires_and_clears(prom: Prom, instance: str, kill: Callable[[], None],
                                      start: Callable[[], None], deadline_s: float) -> None:
    """AnalysimAgentDown fires for exactly that agent once it is killed, and clears once it is back."""
    kill()
    wait_until(lambda: [a["instance"] for a in prom.alerts("AnalysimAgentDown")] == [instance], deadline_s,
               f"AnalysimAgentDown for {instance}", poll_s=0.2)
    start()
    wait_until(lambda: not prom.alerts("AnalysimAgentDown", "firing") and not prom.alerts("AnalysimAgentDown", "pending"),
               deadline_s, "AnalysimAgentDown to clear", poll_s=0.2)


def assert_benign_users_never_alerted(prom: Prom) -> None:
    benign = prom.query(f'count_over_time(ALERTS{{alertname="{EXTRACTION}", subject=~"benign-.*"}}[10m])')
    assert benign == [], f"the extraction alert was raised for benign users: {benign}"
    # A benign user may well hold the small model by now (its fidelity warning says so: that is
    # true), but its queries never look like an attack, which is what the alert pages for.
    intent = {r["metric"]["subject"]: float(r["value"][1])
              for r in prom.query('analysim_extraction_intent_alarm{subject=~"benign-.*"}')}
    assert sorted(intent) == BENIGN and set(intent.values()) == {0.0}, intent
    attackers = {r["metric"]["subject"] for r in prom.query("analysim_extraction_intent_alarm == 1")}
    assert attackers >= ATTACKERS, attackers


def kueue_partition() -> dict[str, dict]:
    """The ClusterQueues of the partition compose.kueue.yaml mounts, read with a plain YAML parser."""
    overlay = yaml.safe_load(KUEUE_OVERLAY.read_text())["services"]["scheduler"]
    (mount,) = overlay["volumes"]
    host, target = mount.split(":")[:2]
    path = (KUEUE_OVERLAY.parent / host / Path(overlay["environment"]["ANALYSIM_PARTITION"]).relative_to(target))
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "ClusterQueue"}


def wait_kueue_metrics(prom: Prom, deadline_s: float) -> None:
    """Kueue's metrics through Prometheus, against the partition file and the scheduler's own
    metrics of the same scrape: the file's nominal quotas and borrowing limits; the GPUs the
    ClusterQueues use (from the quota tree) are the GPUs running jobs hold (from their placements),
    and some are in use; as many pending workloads as pending jobs; one admission per launch,
    each with its wait observed; and no ClusterQueue past its nominal quota plus borrowing limit."""
    cqs = kueue_partition()
    gpu = 'resource="nvidia.com/gpu"'

    def by_queue(expr: str) -> dict[str, float]:
        return {r["metric"]["cluster_queue"]: float(r["value"][1]) for r in prom.query(expr)}

    want = {q: float(d["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"]) for q, d in cqs.items()}
    assert by_queue(f"kueue_cluster_queue_nominal_quota{{{gpu}}}") == want
    limits = {q: float(r["borrowingLimit"]) for q, d in cqs.items()
              for r in d["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
              if r["name"] == "nvidia.com/gpu" and "borrowingLimit" in r}
    assert limits and by_queue(f"kueue_cluster_queue_borrowing_limit{{{gpu}}} < +Inf") == limits

    # Each wait is one PromQL expression, evaluated at one instant over one scrape of the
    # scheduler: the counters move on every scrape, and sides queried one after another (CI, under
    # load) straddle a scrape more often than not.
    def equal(*pairs: tuple[str, str]) -> str:
        return " and ".join(f"(sum({a}) == sum({b}))" for a, b in pairs)

    def wait_equal(what: str, *pairs: tuple[str, str], also: str = "") -> None:
        expr = f"({also}) and {equal(*pairs)}" if also else equal(*pairs)
        try:
            wait_until(lambda: prom.query(expr), deadline_s, what, poll_s=0.5)
        except AssertionError as e:  # say what each side was, both at one instant
            at = float(prom.get("/api/v1/query", query="time()")["result"][1])
            sides = {x: [r["value"][1] for r in prom.query(f"sum({x})", at)] for pair in pairs for x in pair}
            raise AssertionError(f"{e}; at {at}: {sides}") from None

    wait_equal("GPUs in use by the ClusterQueues = GPUs held by running jobs",
               (f"kueue_cluster_queue_resource_usage{{{gpu}}}", "analysim_allocated_gpus"),
               also=f"sum(kueue_cluster_queue_resource_usage{{{gpu}}}) > 0")
    wait_equal("Kueue's workload counts = the scheduler's job counts",
               ("kueue_pending_workloads", "analysim_pending_jobs"),
               ("kueue_admitted_workloads_total", "analysim_jobs_started_total"),
               ("kueue_admission_wait_time_seconds_count", "kueue_admitted_workloads_total"),
               ("kueue_admitted_active_workloads", "analysim_running_jobs"))
    over = prom.query(f"kueue_cluster_queue_resource_usage{{{gpu}}} > on (cluster_queue) "
                      f"(kueue_cluster_queue_nominal_quota{{{gpu}}} + on (cluster_queue) kueue_cluster_queue_borrowing_limit{{{gpu}}})")
    assert over == [], f"ClusterQueues past nominal quota + borrowing limit: {over}"


def assert_evictions_are_requeues(prom: Prom) -> None:
    """A lost agent's jobs are requeued: Kueue's evictions for node failures, one for each."""
    wait_until(lambda: prom.query('(sum(kueue_evicted_workloads_total{reason="NodeFailures"}) or vector(0)) '
                                  "== sum(analysim_jobs_requeued_total)"), 30, "evictions = requeues", poll_s=0.5)
