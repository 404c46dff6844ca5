"""The stack test: deploy/compose.yaml's own services as local processes on 127.0.0.1 (each
service's command and environment, ports and paths moved; deploy/local_stack.py), both
traffic services running, and a real Prometheus (Debian's) scraping them every second with
this repository's rules (``for:`` shortened to 2 s). Through Prometheus' HTTP API:

- every query of every dashboard panel, and every template variable, returns data;
- the extraction alert fires for the pathfinding attacker and for the colluding group, and
  never (not even pending) for a benign user, whose intent alarm stays 0 (a benign user may
  hold the small model, and be warned about, without its queries looking like an attack);
- the agent-down alert fires after one agent is SIGKILLed, and clears once it is back.

Test-only changes to compose's environment: attackers at 100 requests/s and jobs at 5/s (so
that it all happens within seconds), the scheduler at 3000x. Skipped only without prometheus.
"""

from __future__ import annotations

import json
import math
import shutil
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.polling import wait_until
from tests.test_deploy_grafana import dashboards, deploy_module, expand, panels

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
OVERRIDES = {"traffic-gateway": {"ANALYSIM_ATTACK_RATE": "100", "ANALYSIM_QUERY_RATE": "10"},
             "traffic-jobs": {"ANALYSIM_JOB_RATE": "5"}, "scheduler": {"ANALYSIM_SPEED": "3000"}}
EXTRACTION = "AnalysimExtractionThresholdCrossed"
DEADLINE_S = 45.0

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None,
                                reason="prometheus not installed (Debian: apt-get install prometheus; .ci/run does)")


class Prom:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: str) -> Any:
        q = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{q}", timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.get("/api/v1/query", query=expr)["result"]

    def has_data(self, expr: str) -> bool:
        """At least one sample with a number (not NaN: a quantile of nothing is no data)."""
        return any(not math.isnan(float(r["value"][1])) for r in self.query(expr))

    def alerts(self, name: str, state: str = "firing") -> list[dict]:
        return [a["labels"] for a in self.get("/api/v1/alerts")["alerts"]
                if a["labels"]["alertname"] == name and a["state"] == state]  # fmt: skip


def test_stack(tmp_path: Path) -> None:
    ls = deploy_module(DEPLOY / "local_stack.py")
    stack = ls.LocalStack(tmp_path, profiles=["cluster", "gateway"], overrides=OVERRIDES)
    try:
        stack.start_all(deadline_s=60)
        for name, s in stack.services.items():  # the image's HEALTHCHECK, and readiness
            if s.serves:
                wait_until(lambda n=name: stack.health(n, "/readyz")[0], DEADLINE_S, f"{name} /readyz")
        prom = Prom(stack.start_prometheus(scrape_interval="1s", alert_for="2s"))

        def targets_up() -> bool:
            active = prom.get("/api/v1/targets")["activeTargets"]
            return len(active) == 7 and all(t["health"] == "up" for t in active)

        wait_until(targets_up, DEADLINE_S, "every target scraped (scheduler, 4 agents, gateway, prometheus)")
        # The Prometheus page `make stack` prints opens (Debian's build has only the classic UI).
        (ui,) = [line.split()[-1] for line in stack.endpoints() if line.startswith("prometheus ")]
        with urllib.request.urlopen(ui, timeout=10) as r:
            assert r.status == 200 and "<title>Prometheus" in r.read().decode(), ui

        # Extraction: the attacker and the group cross the threshold; no benign user ever does.
        def extraction_firing() -> set[str]:
            return {a["subject"] for a in prom.alerts(EXTRACTION)}

        wait_until(lambda: {"attacker-pathfinding", "group:ring"} <= extraction_firing(), DEADLINE_S,
                   "the extraction alert for the pathfinding attacker and the group")

        # Every panel's query, and every template variable, returns data.
        queries = [(f"{name}: {p['title']}", expand(t["expr"], d))
                   for name, d in dashboards().items() for p in panels(d) for t in p["targets"]]  # fmt: skip
        for name, d in dashboards().items():
            for v in d["templating"]["list"]:
                if v["type"] == "query":
                    metric, label = v["query"]["query"][len("label_values("):-1].rsplit(", ", 1)
                    queries.append((f"{name}: ${v['name']}", expand(f"count by ({label}) ({metric})", d)))
        missing = queries

        def all_have_data() -> bool:
            nonlocal missing
            missing = [(what, q) for what, q in missing if not prom.has_data(q)]
            return not missing

        try:
            wait_until(all_have_data, DEADLINE_S, "data for every panel", poll_s=0.5)
        except AssertionError:
            raise AssertionError(f"no data for: {missing}") from None

        # One agent SIGKILLed: the alert fires for it; back under the same index, it clears.
        agent = stack.services["agent-1"]
        instance = f"127.0.0.1:{agent.metrics_port}"
        stack.kill("agent-1")
        wait_until(lambda: [a["instance"] for a in prom.alerts("AnalysimAgentDown")] == [instance], DEADLINE_S,
                   "AnalysimAgentDown for agent-1")
        stack.start("agent-1")
        wait_until(lambda: not prom.alerts("AnalysimAgentDown", "firing") and not prom.alerts("AnalysimAgentDown", "pending"),
                   DEADLINE_S, "AnalysimAgentDown to clear")
        wait_until(lambda: stack.health("agent-1", "/readyz")[0], DEADLINE_S, "agent-1 connected again")

        benign = prom.query(f'count_over_time(ALERTS{{alertname="{EXTRACTION}", subject=~"benign-.*"}}[10m])')
        assert benign == [], f"the extraction alert was raised for benign users: {benign}"
        # A benign user may well hold the small model by now (its fidelity warning says so: that is
        # true), but its queries never look like an attack, which is what the alert pages for.
        intent = {r["metric"]["subject"]: float(r["value"][1])
                  for r in prom.query('analysim_extraction_intent_alarm{subject=~"benign-.*"}')}
        assert sorted(intent) == ["benign-0", "benign-1", "benign-2"] and set(intent.values()) == {0.0}, intent
        attackers = {r["metric"]["subject"] for r in prom.query("analysim_extraction_intent_alarm == 1")}
        assert {"attacker-pathfinding", "group:ring"} <= attackers, attackers
        for name, s in stack.services.items():
            assert s.proc is not None and s.proc.poll() in (None, 0), f"{name} died:\n{stack.tail(name)}"
    finally:
        stack.stop()
