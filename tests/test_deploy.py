"""The container recipe and Kubernetes manifests under deploy/ (docs/deploy.md): every
manifest parses, and the fields that must agree do: the images, the arguments (real
``radixlm serve`` flags, checked against the CLI's own parser, and real router flags,
against sglang-router's), the ports of containers, probes and Services, the probe paths
(routes the app serves), the router's worker discovery (the workers' labels and port),
the Prometheus scrape targets and the OTLP endpoint."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
MANIFESTS = sorted((DEPLOY / "k8s").glob("*.yaml"))
IMAGE = "radixlm:cpu"
ROUTER_PROBES = {"/liveness", "/readiness", "/health"}  # sglang-router's own routes


def _docs() -> list[dict[str, Any]]:
    return [d for path in MANIFESTS for d in yaml.safe_load_all(path.read_text()) if d]


def _one(kind: str, component: str) -> dict[str, Any]:
    (found,) = [
        d
        for d in _docs()
        if d["kind"] == kind
        and d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
    ]
    return found


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return container


def _expanded(container: dict[str, Any]) -> list[str]:
    """The container's args with ``$(VAR)`` replaced as the kubelet does (from ``env``;
    a downward-API value stands in as ``default``)."""
    env = {e["name"]: e.get("value", "default") for e in container.get("env", ())}
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], a) for a in container["args"]]


def _flag_value(args: list[str], flag: str) -> str:
    for i, arg in enumerate(args):
        if arg == flag:
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{flag} is not among {args}")


def _flags(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


def _serve_parser() -> argparse.ArgumentParser:
    from radixlm.runtime.entrypoints.cli import _build_parser

    (sub,) = [a for a in _build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices["serve"]


def _app_paths() -> set[str]:
    from radixlm.runtime.entrypoints.http.native import routes as native_routes
    from radixlm.runtime.entrypoints.http.openai import routes as openai_routes
    from radixlm.runtime.entrypoints.http.responses import routes as responses_routes

    routers = (native_routes.router, openai_routes.router, responses_routes.router)
    return {route.path for r in routers for route in r.routes}


def _port(container: dict[str, Any], ref: int | str) -> int:
    """A probe's or Service's target port: a number, or a container port's name."""
    if isinstance(ref, int):
        return ref
    (port,) = [p["containerPort"] for p in container["ports"] if p.get("name") == ref]
    return port


def test_every_manifest_parses_and_names_itself():
    assert {p.name for p in MANIFESTS} >= {"worker.yaml", "router.yaml", "monitoring.yaml"}
    for doc in _docs():
        assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"], doc


def test_every_container_runs_the_image_the_dockerfile_builds():
    for doc in _docs():
        if doc["kind"] in ("Deployment", "StatefulSet"):
            assert _container(doc)["image"] == IMAGE


def test_the_dockerfile_is_a_cpu_image_with_the_extras_it_needs():
    tomllib = pytest.importorskip("tomllib")
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", dockerfile, re.M)
    assert "whl/cpu" in dockerfile  # torch's CPU wheel, not the CUDA build
    extras = re.search(r'pip install "\.\[([a-z,]+)\]"', dockerfile)[1].split(",")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert set(extras) == {"router", "tracing"}
    assert set(extras) <= set(declared["optional-dependencies"])
    assert "radixlm pull" in dockerfile  # or a model mounted (PULL_DEFAULT_MODEL=0)
    worker_port = _flag_value(_expanded(_container(_one("StatefulSet", "worker"))), "--port")
    assert f"EXPOSE {worker_port}" in dockerfile
    assert f'"--port", "{worker_port}"' in dockerfile


def test_worker_args_are_real_serve_flags_with_valid_values():
    from radixlm.runtime.entrypoints.http import ServerConfig

    container = _container(_one("StatefulSet", "worker"))
    args = _expanded(container)
    assert args[0] == "serve"
    parser = _serve_parser()
    unknown = set(_flags(args[1:])) - _options(parser)
    assert not unknown, f"not flags of radixlm serve: {unknown}"  # a renamed flag fails here
    parsed = parser.parse_args(args[1:])
    server = {k[len("server_") :]: v for k, v in vars(parsed).items() if k.startswith("server_")}
    config = ServerConfig(**server)  # the values are valid too
    assert config.host == "0.0.0.0"
    assert config.otlp_traces_endpoint.startswith("http")  # traces to the collector


def test_worker_ports_probes_and_service_agree():
    worker = _one("StatefulSet", "worker")
    service = _one("Service", "worker")
    container = _container(worker)
    port = int(_flag_value(_expanded(container), "--port"))
    assert [p["containerPort"] for p in container["ports"]] == [port]
    routes = _app_paths()
    probes = {k: container[k] for k in ("livenessProbe", "readinessProbe", "startupProbe")}
    assert probes["livenessProbe"]["httpGet"]["path"] == "/health"
    assert probes["readinessProbe"]["httpGet"]["path"] == "/health_generate"
    for name, probe in probes.items():
        assert probe["httpGet"]["path"] in routes, name
        assert _port(container, probe["httpGet"]["port"]) == port, name
    # /health_generate answers within --health-generate-timeout-s: the probe waits longer
    timeout = float(_flag_value(_expanded(container), "--health-generate-timeout-s"))
    assert probes["readinessProbe"]["timeoutSeconds"] > timeout
    assert service["spec"]["clusterIP"] == "None"  # headless: one name per pod
    assert worker["spec"]["serviceName"] == service["metadata"]["name"]
    labels = worker["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert worker["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for p in service["spec"]["ports"]:
        assert _port(container, p["targetPort"]) == port


def test_the_router_discovers_the_workers_at_their_port():
    sglang_router = pytest.importorskip("sglang_router.router_args")
    router = _one("Deployment", "router")
    container = _container(router)
    assert container["command"] == ["python", "-m", "sglang_router.launch_router"]
    args = _expanded(container)
    parser = argparse.ArgumentParser()
    sglang_router.RouterArgs.add_cli_args(parser)
    unknown = set(_flags(args)) - _options(parser)
    assert not unknown, f"not flags of sglang-router: {unknown}"
    parsed = sglang_router.RouterArgs.from_cli_args(parser.parse_args(args))
    worker = _one("StatefulSet", "worker")
    worker_labels = worker["spec"]["template"]["metadata"]["labels"]
    worker_port = int(_flag_value(_expanded(_container(worker)), "--port"))
    if parsed.service_discovery:
        assert parsed.selector and parsed.selector.items() <= worker_labels.items()
        assert parsed.service_discovery_port == worker_port
        _check_pod_reader(router)
    else:  # fixed URLs: the workers' headless Service, at their port
        service = _one("Service", "worker")["metadata"]["name"]
        for url in parsed.worker_urls:
            assert re.fullmatch(rf"http://[\w-]+\.{service}(\.[\w.-]+)?:{worker_port}", url)
    assert parsed.policy == "cache_aware"


def _check_pod_reader(router: dict[str, Any]) -> None:
    """The router's service account may list and watch pods (its discovery)."""
    account = router["spec"]["template"]["spec"]["serviceAccountName"]
    docs = _docs()
    bindings = [
        b
        for b in docs
        if b["kind"] == "RoleBinding"
        and any(s["kind"] == "ServiceAccount" and s["name"] == account for s in b["subjects"])
    ]
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Role"}
    assert any(
        "pods" in rule["resources"] and {"list", "watch"} <= set(rule["verbs"])
        for b in bindings
        for rule in roles[b["roleRef"]["name"]]["rules"]
    )
    assert any(d["kind"] == "ServiceAccount" and d["metadata"]["name"] == account for d in docs)


def test_router_ports_probes_and_service_agree():
    router = _one("Deployment", "router")
    service = _one("Service", "router")
    container = _container(router)
    args = _expanded(container)
    port = int(_flag_value(args, "--port"))
    metrics_port = int(_flag_value(args, "--prometheus-port"))
    assert {p["containerPort"] for p in container["ports"]} == {port, metrics_port}
    for name in ("livenessProbe", "readinessProbe"):
        probe = container[name]["httpGet"]
        assert probe["path"] in ROUTER_PROBES and _port(container, probe["port"]) == port
    labels = router["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    targets = {_port(container, p["targetPort"]) for p in service["spec"]["ports"]}
    assert targets == {port, metrics_port}


def test_prometheus_scrapes_the_metrics_ports():
    routes = _app_paths()
    for kind, component, port_flag in (
        ("StatefulSet", "worker", "--port"),
        ("Deployment", "router", "--prometheus-port"),
    ):
        workload = _one(kind, component)
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        port = _flag_value(_expanded(_container(workload)), port_flag)
        assert annotations["prometheus.io/port"] == port
        assert annotations["prometheus.io/path"] == "/metrics"
    assert "/metrics" in routes
    monitors = [d for d in _docs() if d["kind"] == "ServiceMonitor"]
    services = [d for d in _docs() if d["kind"] == "Service"]
    for monitor in monitors:
        selector = monitor["spec"]["selector"]["matchLabels"]
        (service,) = [s for s in services if selector.items() <= s["metadata"]["labels"].items()]
        names = {p["name"] for p in service["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in names and endpoint["path"] == "/metrics"
    assert {m["metadata"]["name"] for m in monitors} == {"radixlm-worker", "radixlm-router"}


def test_the_guide_explains_every_file():
    guide = (ROOT / "docs" / "deploy.md").read_text()
    for path in [DEPLOY / "Dockerfile", *MANIFESTS]:
        assert str(path.relative_to(ROOT)) in guide, path.name
