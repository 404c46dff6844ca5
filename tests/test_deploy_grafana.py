"""deploy/grafana: the committed dashboards are what deploy/grafana/dashboards.py generates,
each is well-formed for Grafana's schema version 39 (unique panel ids, panels inside the
24-column grid without overlapping, every target a PromQL expression on the datasource
variable, every $variable defined), every expression parses (promtool, as recording rules),
and the provisioning files point Grafana at them."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

GRAFANA = Path(__file__).resolve().parent.parent / "deploy" / "grafana"
BUILTIN = {"__rate_interval", "__interval", "__range", "datasource"}


def deploy_module(path: Path) -> Any:
    """A script of deploy/ (not a package) as a module."""
    spec = importlib.util.spec_from_file_location(f"analysim_deploy_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def generator() -> Any:
    return deploy_module(GRAFANA / "dashboards.py")


def dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted((GRAFANA / "dashboards").glob("*.json"))}


def panels(d: dict) -> list[dict]:
    return [p for p in d["panels"] if p["type"] != "row"]


def expand(expr: str, d: dict) -> str:
    """A panel's query as Grafana sends it with every variable at 'All'."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__range", "30m")
    return re.sub(r"\$(\w+)", lambda m: ".*" if m.group(1) in variables(d) else m.group(0), expr)


def variables(d: dict) -> set[str]:
    return {v["name"] for v in d["templating"]["list"]}


def test_dashboards_are_generated() -> None:
    want = generator().render()
    have = {name: (GRAFANA / "dashboards" / name).read_text() for name in want}
    assert have == want, "stale: run python deploy/grafana/dashboards.py"
    assert set(dashboards()) == set(want)
    assert {"cluster.json", "nodes.json", "gateway.json", "extraction.json", "kueue.json"} <= set(want)


def test_dashboards_are_well_formed() -> None:
    uids = set()
    for name, d in dashboards().items():
        assert d["schemaVersion"] == 39 and d["uid"] not in uids and d["title"], name
        uids.add(d["uid"])
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids)), name
        cells: set[tuple[int, int]] = set()
        for p in d["panels"]:
            g = p["gridPos"]
            assert g["x"] >= 0 and g["w"] >= 1 and g["x"] + g["w"] <= 24 and g["h"] >= 1, (name, p["title"])
            mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
            assert not cells & mine, f"{name}: {p['title']} overlaps another panel"
            cells |= mine
        assert variables(d) >= {"datasource"} and len(variables(d)) >= 3, f"{name}: template variables"
        for p in panels(d):
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, (name, p["title"])
            assert p["targets"], (name, p["title"])
            for t in p["targets"]:
                assert t["expr"] and t["refId"], (name, p["title"])
                used = set(re.findall(r"\$(\w+)", t["expr"])) - BUILTIN
                assert used <= variables(d), f"{name}: {p['title']} uses undefined {used - variables(d)}"
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                assert re.fullmatch(r"label_values\((.+), (\w+)\)", v["query"]["query"]), v["name"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian: apt-get install prometheus)")
def test_every_query_parses(tmp_path: Path) -> None:
    rules = []
    for d in dashboards().values():
        for p in panels(d):
            for t in p["targets"]:
                rules.append({"record": f"panel:{len(rules)}", "expr": expand(t["expr"], d)})
    (tmp_path / "panels.yml").write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    r = subprocess.run(["promtool", "check", "rules", str(tmp_path / "panels.yml")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_provisioning() -> None:
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert [d["type"] for d in ds["datasources"]] == ["prometheus"] and ds["datasources"][0]["url"] == "http://prometheus:9090"
    prov = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "analysim.yml").read_text())
    compose = yaml.safe_load((GRAFANA.parent / "compose.yaml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./grafana/dashboards:{prov['providers'][0]['options']['path']}:ro" in mounts
