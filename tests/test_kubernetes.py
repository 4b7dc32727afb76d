"""The shipped Kubernetes example: valid manifests for the cluster's API, and a fleet whose parts agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from duplex_gateway.config import load_settings

MANIFEST = Path(__file__).resolve().parents[1] / "configs" / "kubernetes" / "duplex-gateway.yaml"
#: The Kubernetes API the manifests are checked against (strict: no field the API does not have).
KUBERNETES = "1.33.0"


def documents() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(MANIFEST.read_text(encoding="utf-8")) if doc]


def find(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


@pytest.mark.parametrize("doc", documents(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_each_manifest_is_valid_for_the_kubernetes_api(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_the_gateways_configuration_is_one_the_gateway_loads(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(find("ConfigMap", "duplex-gateway-config")["data"]["gateway.yaml"], encoding="utf-8")
    settings = load_settings(config)
    assert settings.server.state_store is not None
    assert settings.server.host == "0.0.0.0"


def test_the_fleet_parts_agree() -> None:
    with_config = find("ConfigMap", "duplex-gateway-config")["data"]["gateway.yaml"]
    server = yaml.safe_load(with_config)["server"]
    pod = find("Deployment", "duplex-gateway")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # Kubernetes kills a pod after its grace: the gateway's own drain must be over by then.
    assert pod["terminationGracePeriodSeconds"] >= server["drain_grace_s"] + 5
    # The probes read the gateway's own endpoints, on the port it listens on.
    (port,) = container["ports"]
    assert port["containerPort"] == server["port"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # The state store is the Redis Service of the example.
    store = urlsplit(server["state_store"])
    redis = find("Service", "duplex-gateway-redis")
    assert store.hostname == redis["metadata"]["name"]
    assert store.port == redis["spec"]["ports"][0]["port"]
    # The configuration the gateway is started with is the ConfigMap's.
    mount = container["volumeMounts"][0]["mountPath"]
    assert container["args"] == ["--config", f"{mount}/gateway.yaml"]
    assert pod["volumes"][0]["configMap"]["name"] == "duplex-gateway-config"
