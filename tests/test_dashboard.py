"""deploy/grafana/switchyard.json against Grafana's dashboard structure, and the Prometheus
scrape configs against the services' default metrics ports. (That every query names a metric
the services export is checked against a running stack in test_operability.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import grafana_dashboard as grafana
import jsonschema
import pytest
import yaml
from deploy_wiring import parse_command

from switchyard.cli import build_parser
from switchyard.common.metrics import DEFAULT_PORTS

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
PANELS_AN_OPERATOR_LOOKS_AT_FIRST = {
    "time_to_first_token_seconds": "TTFT",
    "inter_token_latency_seconds": "ITL",
    "output_tokens": "throughput",
    "cached_tokens": "hit rate",
    "errors": "errors",
    "dispatcher_in_flight": "per-worker load",
}


@pytest.fixture(scope="module")
def dashboard():
    return grafana.load()


class TestDashboardStructure:
    def test_validates_against_the_dashboard_schema(self, dashboard):
        jsonschema.Draft202012Validator.check_schema(grafana.SCHEMA)
        errors = sorted(
            jsonschema.Draft202012Validator(grafana.SCHEMA).iter_errors(dashboard), key=str
        )
        assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)

    def test_the_schema_catches_broken_dashboards(self, dashboard):
        """The schema is not vacuous: typical mistakes fail it."""
        validator = jsonschema.Draft202012Validator(grafana.SCHEMA)
        broken = [
            {**dashboard, "schemaVersion": "39"},
            {**dashboard, "graphTooltip": 3},
            {
                **dashboard,
                "panels": [
                    {**dashboard["panels"][1], "gridPos": {"h": 8, "w": 25, "x": 0, "y": 0}}
                ],
            },  # fmt: skip
            {**dashboard, "panels": [{**dashboard["panels"][1], "targets": [{"refId": "A"}]}]},
            {**dashboard, "panels": [{**dashboard["panels"][1], "type": ""}]},
        ]
        for one in broken:
            assert not validator.is_valid(one)

    def test_panels_tile_the_24_columns_without_overlap(self, dashboard):
        taken: set[tuple[int, int]] = set()
        ids = [p["id"] for p in dashboard["panels"]]
        assert len(ids) == len(set(ids)), "panel ids must be unique"
        for panel in dashboard["panels"]:
            pos = panel["gridPos"]
            assert pos["x"] + pos["w"] <= 24, panel["title"]
            cells = {
                (x, y)
                for x in range(pos["x"], pos["x"] + pos["w"])
                for y in range(pos["y"], pos["y"] + pos["h"])
            }
            assert not cells & taken, f"{panel['title']} overlaps another panel"
            taken |= cells

    def test_every_query_is_wellformed_and_uses_defined_variables(self, dashboard):
        defined = {v["name"] for v in dashboard["templating"]["list"]}
        builtin = {"__rate_interval", "__interval", "__range", "__all"}
        for expr in grafana.queries(dashboard):
            for opening, closing in ("()", "{}", "[]"):
                assert expr.count(opening) == expr.count(closing), expr
            assert expr.count('"') % 2 == 0, expr
            for name in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", expr):
                assert name in defined | builtin, f"{expr}: ${name} is not defined"
            assert grafana.metric_names(expr), f"{expr} reads no switchyard metric"
        for panel in grafana.panels(dashboard):
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]

    def test_the_panels_an_operator_looks_at_first(self, dashboard):
        used = grafana.families(dashboard)
        for fragment, what in PANELS_AN_OPERATOR_LOOKS_AT_FIRST.items():
            assert any(fragment in name for name in used), f"no {what} panel"
        quantiles = " ".join(grafana.queries(dashboard))
        assert "histogram_quantile(0.5," in quantiles and "histogram_quantile(0.99," in quantiles


class TestScrapeConfigs:
    def test_targets_are_the_default_ports_of_the_compose_services(self):
        """Every job asks DNS for all of a compose service's replicas, on its metrics port."""
        config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
        jobs = {job["job_name"]: job for job in config["scrape_configs"]}
        assert len(jobs) == len(config["scrape_configs"])
        targets = set()
        for job in jobs.values():
            for sd in job["dns_sd_configs"]:
                assert sd["type"] == "A"
                targets |= {f"{name}:{sd['port']}" for name in sd["names"]}
        compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
        parser = build_parser()
        expected = set()
        for name, service in compose.items():
            if service.get("image") != "switchyard:local":
                continue  # the ingress proxy, Prometheus
            args = parse_command(parser, f"compose/{name}", service["command"])
            if args.command == "preprocessor":
                expected.add(f"{name}:{args.port}")
            elif DEFAULT_PORTS.get(args.command) is not None:  # a service that serves metrics
                assert args.metrics_port == DEFAULT_PORTS[args.command], name
                assert args.metrics_host == "0.0.0.0", f"{name}: metrics unreachable"
                expected.add(f"{name}:{args.metrics_port}")
        assert targets == expected

    def test_kubernetes_config_keeps_the_annotated_switchyard_pods(self):
        config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus-kubernetes.yml").read_text())
        (job,) = config["scrape_configs"]
        assert job["kubernetes_sd_configs"][0]["role"] == "pod"
        keeps = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
        assert {r["regex"] for r in keeps} == {"switchyard", "true"}
