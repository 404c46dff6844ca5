"""The stack test: deploy/compose.yaml's own services as local processes on 127.0.0.1 (each
service's command and environment, ports and paths moved; deploy/local_stack.py), both
traffic services running, and a real Prometheus (Debian's) scraping them every second with
this repository's rules (``for:`` shortened to 2 s); the scheduler under deploy/compose.kueue.yaml
(the demo cluster's Kueue partition). Through Prometheus' HTTP API:

- every query of every dashboard panel, and every template variable, returns data;
- Kueue's metrics: the partition file's quotas, and workload counts and GPU usage that agree with
  the scheduler's own metrics of the same scrape;
- the extraction alert fires for the pathfinding attacker and for the colluding group, and
  never (not even pending) for a benign user, whose intent alarm stays 0 (a benign user may
  hold the small model, and be warned about, without its queries looking like an attack);
- the attackers make the model's pool (auto:pool) warn: its status, the exposure and the
  attribution are series of shares, and the dashboard's pool panels draw them;
- the agent-down alert fires after one agent is SIGKILLed, and clears once it is back.

Test-only changes to compose's environment: attackers at 100 requests/s and jobs at 5/s (so
that it all happens within seconds), the scheduler at 3000x. Skipped only without prometheus.
"""

from __future__ import annotations

import shutil
import urllib.request
from pathlib import Path

import pytest

from tests.polling import wait_until
from tests.stackchecks import (
    KUEUE_OVERLAY,
    TEST_RATES,
    Prom,
    agent_down_alert_fires_and_clears,
    assert_benign_users_never_alerted,
    assert_evictions_are_requeues,
    wait_every_panel_has_data,
    wait_extraction_alerts,
    wait_kueue_metrics,
    wait_pool_warned,
    wait_targets_up,
)
from tests.test_deploy_grafana import deploy_module


class _Unfollowed(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        return None  # the 3xx itself is the answer


_no_redirects = urllib.request.build_opener(_Unfollowed)

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
DEADLINE_S = 45.0

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None,
                                reason="prometheus not installed (Debian: apt-get install prometheus; .ci/run does)")


def test_stack(tmp_path: Path) -> None:
    ls = deploy_module(DEPLOY / "local_stack.py")
    stack = ls.LocalStack(tmp_path, profiles=["cluster", "gateway"], overrides=TEST_RATES, overlays=[KUEUE_OVERLAY])
    try:
        stack.start_all(deadline_s=60)
        for name, s in stack.services.items():  # the image's HEALTHCHECK, and readiness
            if s.serves:
                wait_until(lambda n=name: stack.health(n, "/readyz")[0], DEADLINE_S, f"{name} /readyz")
        prom = Prom(stack.start_prometheus(scrape_interval="1s", alert_for="2s"))
        wait_targets_up(prom, 7, DEADLINE_S, "scheduler, 4 agents, gateway, prometheus")
        # The Prometheus page `make stack` prints is the page itself (Debian's build has only the
        # classic UI, under /classic/): not followed through a redirect, which not every build
        # answers its root with (the landed on a 404; Debian's 2.42 here redirects).
        (ui,) = [line.split()[-1] for line in stack.endpoints() if line.startswith("prometheus ")]
        with _no_redirects.open(ui, timeout=10) as r:
            assert r.status == 200 and "<title>Prometheus" in r.read().decode(), (ui, r.status)
        wait_extraction_alerts(prom, DEADLINE_S)
        wait_pool_warned(prom, DEADLINE_S)
        wait_every_panel_has_data(prom, DEADLINE_S)
        wait_kueue_metrics(prom, DEADLINE_S)
        # One agent SIGKILLed: the alert fires for it; back under the same index, it clears.
        agent = stack.services["agent-1"]
        agent_down_alert_fires_and_clears(prom, f"127.0.0.1:{agent.metrics_port}", lambda: stack.kill("agent-1"),
                                          lambda: stack.start("agent-1"), DEADLINE_S)
        wait_until(lambda: stack.health("agent-1", "/readyz")[0], DEADLINE_S, "agent-1 connected again")
        assert_evictions_are_requeues(prom)
        assert_benign_users_never_alerted(prom)
        for name, s in stack.services.items():
            assert s.proc is not None and s.proc.poll() in (None, 0), f"{name} died:\n{stack.tail(name)}"
    finally:
        stack.stop()
