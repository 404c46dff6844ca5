"""deploy/prometheus: the config and rules pass promtool's checks, the rules' unit tests
(deploy/prometheus/tests/rules_test.yml) pass `promtool test rules` run on the committed files as
they are, and every alert carries a summary, a description and a runbook_url that names its own
section of docs/runbooks.md (and every section there is an alert's)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PROM = ROOT / "deploy" / "prometheus"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus)")


def promtool(*args: str) -> None:
    r = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)  # type: ignore[list-item]
    assert r.returncode == 0, f"promtool {' '.join(args)}:\n{r.stdout}\n{r.stderr}"


def alerts() -> list[dict]:
    doc = yaml.safe_load((PROM / "rules" / "alerts.yml").read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def anchor(heading: str) -> str:
    """The anchor a Markdown renderer (GitHub's, Python-Markdown's toc) gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_has_a_runbook() -> None:
    names = [a["alert"] for a in alerts()]
    assert len(names) == len(set(names))
    sections = {anchor(h): h for h in re.findall(r"^## (.+)$", (ROOT / "docs" / "runbooks.md").read_text(), re.M)}
    for a in alerts():
        assert set(a.get("annotations", {})) == {"summary", "description", "runbook_url"}, a["alert"]
        assert a["labels"]["severity"] in ("critical", "warning", "info"), a["alert"]
        path, _, frag = a["annotations"]["runbook_url"].partition("#")
        assert (ROOT / path).is_file() and sections.get(frag) == a["alert"], a["annotations"]["runbook_url"]
    assert sorted(sections.values()) == sorted(names), "a runbook section without its alert"


@needs_promtool
def test_config_and_rules_check(tmp_path: Path) -> None:
    # promtool stats every credentials file; the admin key exists only in the container (a
    # secret), so the copy checked here reads a stand-in.
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    (tmp_path / "admin_key").write_text("stand-in")
    for job in config["scrape_configs"]:
        if "authorization" in job:
            assert job["authorization"]["credentials_file"] == "/run/secrets/admin_key", job["job_name"]
            job["authorization"]["credentials_file"] = str(tmp_path / "admin_key")
    config["rule_files"] = [str(PROM / f) for f in config["rule_files"]]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    promtool("check", "config", str(tmp_path / "prometheus.yml"))
    promtool("check", "rules", *map(str, sorted((PROM / "rules").glob("*.yml"))))


@needs_promtool
def test_rules_unit_tests() -> None:
    # As a user runs it: the committed rules and tests, every annotation expected.
    promtool("test", "rules", str(PROM / "tests" / "rules_test.yml"))
