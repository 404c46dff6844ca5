"""deploy/prometheus: the config and rules pass promtool's checks, the rules' unit tests
(deploy/prometheus/tests/rules_test.yml) pass `promtool test rules`, and every alert carries
a summary, a description and a runbook."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

PROM = Path(__file__).resolve().parent.parent / "deploy" / "prometheus"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus)")


def promtool(*args: str) -> None:
    r = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)  # type: ignore[list-item]
    assert r.returncode == 0, f"promtool {' '.join(args)}:\n{r.stdout}\n{r.stderr}"


def alerts() -> list[dict]:
    doc = yaml.safe_load((PROM / "rules" / "alerts.yml").read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def test_every_alert_has_a_runbook() -> None:
    names = [a["alert"] for a in alerts()]
    assert len(names) == len(set(names))
    for a in alerts():
        assert {"summary", "description", "runbook"} <= set(a.get("annotations", {})), a["alert"]
        assert a["labels"]["severity"] in ("critical", "warning", "info"), a["alert"]


@needs_promtool
def test_config_and_rules_check() -> None:
    promtool("check", "config", str(PROM / "prometheus.yml"))
    promtool("check", "rules", *map(str, sorted((PROM / "rules").glob("*.yml"))))


@needs_promtool
def test_rules_unit_tests(tmp_path: Path) -> None:
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    for f in (PROM / "rules").glob("*.yml"):
        doc = yaml.safe_load(f.read_text())
        for g in doc["groups"]:
            for r in g["rules"]:
                if "annotations" in r:
                    r["annotations"] = {"summary": r["annotations"]["summary"]}
        (tmp_path / "rules" / f.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    shutil.copy(PROM / "tests" / "rules_test.yml", tmp_path / "tests")
    promtool("test", "rules", str(tmp_path / "tests" / "rules_test.yml"))
