"""deploy/kubernetes: every object the overlays render validates, and says what the daemon needs.

No kubectl or kustomize binary is available offline, so `render` below builds a
kustomization itself: the subset of kustomize the manifests use (resources,
components, a configMapGenerator of files, JSON 6902 patches with a target,
the namespace), and it refuses any other key, so that a manifest can never use
a feature this test silently skips. Objects are validated with
kubernetes-validate's strict schemas (unknown fields are errors) against the
oldest Kubernetes the manifests support (1.30: `appArmorProfile`, the
`hostPath` and probe fields) and the newest the library knows.
"""

from __future__ import annotations

import copy
import re
import shlex
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
import yaml

from tooljaild.settings.config import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("daemonset", "deployment")
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
"""The oldest Kubernetes the manifests are for, and the newest kubernetes-validate knows."""
WORKLOADS = ("DaemonSet", "Deployment")
CLUSTER_SCOPED = frozenset({"Namespace"})
KUSTOMIZATION_KEYS = frozenset(
    {
        "apiVersion",
        "kind",
        "namespace",
        "resources",
        "components",
        "configMapGenerator",
        "generatorOptions",
        "patches",
    }
)
CRDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
"""Custom resources: no schema in kubernetes-validate; checked by hand below."""

Obj = dict[str, Any]


# ---- a small kustomize -------------------------------------------------------


def _documents(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _matches(obj: Obj, target: dict[str, str]) -> bool:
    group, _, version = obj["apiVersion"].rpartition("/")
    wanted = {"group": group, "version": version, "kind": obj["kind"]}
    wanted["name"] = obj["metadata"]["name"]
    return all(
        re.fullmatch(value, wanted[key]) if key == "name" else wanted[key] == value
        for key, value in target.items()
    )


def _patch(objects: list[Obj], entry: Obj, directory: Path) -> list[Obj]:
    text = entry["patch"] if "patch" in entry else (directory / entry["path"]).read_text()
    operations = yaml.safe_load(text)
    assert isinstance(operations, list), "only JSON 6902 patches are rendered here"
    options = entry.get("options", {})
    assert set(options) <= {"allowKindChange"}, options
    matched = [o for o in objects if _matches(o, entry["target"])]
    assert matched, f"patch target {entry['target']} matches nothing"
    patched = []
    for obj in objects:
        if obj in matched:
            new = jsonpatch.apply_patch(obj, operations)
            if new["kind"] != obj["kind"]:
                assert options.get("allowKindChange"), "kustomize refuses a kind change"
            obj = new
        patched.append(obj)
    return patched


def render(directory: Path) -> list[Obj]:
    """The objects `kustomize build directory` makes (for the features listed above)."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - KUSTOMIZATION_KEYS
    assert not unknown, f"{directory}: kustomize features this test does not render: {unknown}"
    objects: list[Obj] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        objects += render(path) if path.is_dir() else _documents(path)
    for component in kustomization.get("components", []):
        objects = _apply_component(objects, directory / component)
    objects += _generated(kustomization, directory)
    for entry in kustomization.get("patches", []):
        objects = _patch(objects, entry, directory)
    if "namespace" in kustomization:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = kustomization["namespace"]
    return objects


def _apply_component(objects: list[Obj], directory: Path) -> list[Obj]:
    component = yaml.safe_load((directory / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    assert set(component) <= {"apiVersion", "kind", "resources", "patches"}, component
    for resource in component.get("resources", []):
        objects = [*objects, *_documents(directory / resource)]
    for entry in component.get("patches", []):
        objects = _patch(objects, entry, directory)
    return objects


def _generated(kustomization: Obj, directory: Path) -> list[Obj]:
    # A name suffix hash would have to be rewritten into every reference: the
    # manifests turn it off, and this renders only that case.
    if kustomization.get("configMapGenerator"):
        assert kustomization["generatorOptions"] == {"disableNameSuffixHash": True}
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": generator["name"]},
            "data": {Path(f).name: (directory / f).read_text() for f in generator["files"]},
        }
        for generator in kustomization.get("configMapGenerator", [])
    ]


# ---- helpers -----------------------------------------------------------------


def _one(objects: list[Obj], *kinds: str) -> Obj:
    found = [o for o in objects if o["kind"] in kinds]
    assert len(found) == 1, [o["kind"] for o in objects]
    return found[0]


def _container(objects: list[Obj]) -> Obj:
    (container,) = _one(objects, *WORKLOADS)["spec"]["template"]["spec"]["containers"]
    return container


def _port(container: Obj, name: str) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return int(port)


def _settings(objects: list[Obj]) -> Settings:
    """The daemon's settings from the rendered ConfigMap, through the real settings model."""
    config = _one(objects, "ConfigMap")
    assert config["metadata"]["name"] == "tooljail-config"
    return _load(config["data"]["tooljail.toml"])


def _load(text: str) -> Settings:
    """`text` as the daemon's config file (read whole, so the file may go at once)."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "tooljail.toml"
        path.write_text(text)
        return load_settings(path)


def _mount(objects: list[Obj], path: Path) -> tuple[Obj, Obj]:
    """The volumeMount whose mountPath holds `path`, and its volume."""
    container = _container(objects)
    mounts = [m for m in container["volumeMounts"] if path.is_relative_to(m["mountPath"])]
    assert mounts, f"{path} is on no volume"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    spec = _one(objects, *WORKLOADS)["spec"]["template"]["spec"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    return mount, volume


def _probes(container: Obj) -> Iterator[tuple[str, Obj]]:
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert kind in container, f"no {kind}"
        yield kind, container[kind]


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> list[Obj]:
    return render(KUBE / "overlays" / request.param)


# ---- the tests -----------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_validates(overlay: str, version: str) -> None:
    objects = render(KUBE / "overlays" / overlay)
    kinds = sorted(o["kind"] for o in objects)
    workload = "DaemonSet" if overlay == "daemonset" else "Deployment"
    expected = ["Namespace", "ServiceAccount", "ConfigMap", workload, "Service"]
    assert kinds == sorted([*expected, "PodDisruptionBudget", "NetworkPolicy"])
    for obj in objects:
        kubernetes_validate.validate(copy.deepcopy(obj), version, strict=True)
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == "tooljail", obj["kind"]


def test_the_servicemonitor_component_renders_and_selects_the_metrics_port(tmp_path: Path) -> None:
    overlay = tmp_path / "with-monitor"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [str(KUBE / "overlays" / "daemonset")],
                "components": [str(KUBE / "components" / "servicemonitor")],
            }
        )
    )
    objects = render(overlay)
    monitor = _one(objects, "ServiceMonitor")
    assert (monitor["apiVersion"], monitor["kind"]) in CRDS
    assert monitor["metadata"]["namespace"] == "tooljail"
    service = _one(objects, "Service")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["port"] == "metrics"
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) not in CRDS:
            kubernetes_validate.validate(copy.deepcopy(obj), KUBERNETES_VERSIONS[0], strict=True)


def test_the_configmap_loads_with_the_daemons_settings_model(rendered: list[Obj]) -> None:
    settings = _settings(rendered)
    # Beyond loopback the daemon refuses plaintext: TLS and tokens, from the Secrets.
    assert settings.listen.startswith("0.0.0.0:")
    assert settings.tls.enabled and settings.auth.tokens_file is not None
    assert settings.isolation == "strict"
    for path, secret in (
        (settings.tls.cert_file, "tooljail-tls"),
        (settings.tls.key_file, "tooljail-tls"),
        (settings.auth.tokens_file, "tooljail-tokens"),
    ):
        assert path is not None
        mount, volume = _mount(rendered, path)
        assert volume["secret"]["secretName"] == secret
        assert volume["secret"]["defaultMode"] == 0o400
        assert mount["readOnly"] is True
        assert path.name in {"tls.crt", "tls.key", "tokens.toml"}
    # The state directory is the node's, kept across pod restarts.
    mount, volume = _mount(rendered, settings.state_dir)
    assert mount["mountPath"] == str(settings.state_dir)
    assert volume["hostPath"] == {"path": "/var/lib/tooljail", "type": "DirectoryOrCreate"}


def test_a_misspelt_key_in_the_configmap_fails_to_load(rendered: list[Obj]) -> None:
    from tooljaild.settings.config import ConfigError

    text = _one(rendered, "ConfigMap")["data"]["tooljail.toml"]
    broken = text.replace("shutdown_grace_s =", "shutdown_grace =", 1)
    assert broken != text
    with pytest.raises(ConfigError, match="shutdown_grace"):
        _load(broken)


def test_the_ports_are_the_daemons_and_the_service_is_headless(rendered: list[Obj]) -> None:
    settings = _settings(rendered)
    container = _container(rendered)
    assert _port(container, "grpc") == int(settings.listen.rsplit(":", 1)[1]) == 7070
    assert settings.metrics_listen is not None
    assert _port(container, "metrics") == int(settings.metrics_listen.rsplit(":", 1)[1])
    service = _one(rendered, "Service")
    assert service["spec"]["clusterIP"] == "None"
    grpc_port = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert grpc_port["port"] == 7070 and grpc_port["targetPort"] == "grpc"
    template = _one(rendered, *WORKLOADS)["spec"]["template"]
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == _port(container, "metrics")


def test_the_probes_are_the_kubelets_grpc_probes_on_the_daemons_health_port(
    rendered: list[Obj],
) -> None:
    settings = _settings(rendered)
    container = _container(rendered)
    # The daemon serves health alone, in plaintext, where the kubelet probes it.
    assert settings.health_listen is not None
    health_port = int(settings.health_listen.rsplit(":", 1)[1])
    assert _port(container, "health") == health_port != _port(container, "grpc")
    for kind, probe in _probes(container):
        assert probe["grpc"] == {"port": health_port}, kind
        assert "exec" not in probe and "httpGet" not in probe, kind
    # A stuck daemon is restarted only after the startup probe's budget: a cold
    # node's pools warm within it.
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120


def test_the_grace_period_covers_the_prestop_pause_and_the_drain(rendered: list[Obj]) -> None:
    settings = _settings(rendered)
    spec = _one(rendered, *WORKLOADS)["spec"]["template"]["spec"]
    argv = _container(rendered)["lifecycle"]["preStop"]["exec"]["command"]
    assert argv[0] == "/bin/sleep"
    pause = float(argv[1])
    # The daemon: shutdown_grace_s for running calls, then 2 s for the streams
    # to deliver their results (Daemon.stop), and a margin to close the rest.
    assert spec["terminationGracePeriodSeconds"] >= pause + settings.shutdown_grace_s + 2 + 5


def test_every_added_capability_says_why() -> None:
    lines = (KUBE / "base" / "workload.yaml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "add:")
    reasons = {}
    for line in lines[start + 1 :]:
        stripped = line.strip()
        if not stripped.startswith(("#", "- ")):
            break
        if stripped.startswith("- "):
            capability, _, reason = stripped[2:].partition("#")
            # Its reason on its own line, in words: "- CAP # why".
            assert len(reason.split()) >= 4, f"capability without its reason: {stripped}"
            reasons[capability.strip()] = reason.strip()
    container = _container(render(KUBE / "overlays" / "daemonset"))
    assert list(reasons) == container["securityContext"]["capabilities"]["add"]
    assert reasons


def test_the_security_context_is_what_the_sandboxes_need_and_no_more(rendered: list[Obj]) -> None:
    context = _container(rendered)["securityContext"]
    assert context["privileged"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    added = set(context["capabilities"]["add"])
    # The systemd unit's bounding set (measured there), less what a pod does not need.
    unit = (ROOT / "deploy" / "systemd" / "tooljail.service").read_text()
    bounding = {
        cap.removeprefix("CAP_")
        for line in unit.splitlines()
        if line.startswith("CapabilityBoundingSet=")
        for cap in line.split("=", 1)[1].split()
    }
    assert added == bounding - {"NET_BIND_SERVICE"}
    # The API refuses allowPrivilegeEscalation: false together with SYS_ADMIN.
    assert "allowPrivilegeEscalation" not in context
    assert context["seccompProfile"] == {"type": "Unconfined"}
    assert context["appArmorProfile"] == {"type": "Unconfined"}
    spec = _one(rendered, *WORKLOADS)["spec"]["template"]["spec"]
    for shared in ("hostPID", "hostNetwork", "hostIPC"):
        assert not spec.get(shared), shared
    assert spec["automountServiceAccountToken"] is False


def test_never_two_daemons_on_a_node(rendered: list[Obj]) -> None:
    workload = _one(rendered, *WORKLOADS)
    if workload["kind"] == "DaemonSet":
        rolling = workload["spec"]["updateStrategy"]["rollingUpdate"]
    else:
        rolling = workload["spec"]["strategy"]["rollingUpdate"]
        spec = workload["spec"]["template"]["spec"]
        anti = spec["affinity"]["podAntiAffinity"]
        (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert spec["nodeSelector"]["tooljail.dev/sandbox-pool"] == "true"
        assert {"key": "tooljail.dev/sandbox-pool", "operator": "Equal", "value": "true",
                "effect": "NoSchedule"} in spec["tolerations"]  # fmt: skip
    assert rolling == {"maxUnavailable": 1, "maxSurge": 0}
    budget = _one(rendered, "PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 1


def test_the_network_policy_admits_agents_to_grpc_and_monitoring_to_metrics(
    rendered: list[Obj],
) -> None:
    policy = _one(rendered, "NetworkPolicy")["spec"]
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    ports = {rule["ports"][0]["port"]: rule["from"][0] for rule in policy["ingress"]}
    assert ports["grpc"]["podSelector"]["matchLabels"] == {"tooljail.dev/client": "true"}
    assert ports["metrics"]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"
    }
    assert len(policy["ingress"]) == 2
    (dns,) = policy["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}


def test_no_secret_or_key_is_in_the_tree(rendered: list[Obj]) -> None:
    assert not [o for o in rendered if o["kind"] == "Secret"]
    for path in KUBE.rglob("*"):
        if path.is_file():
            assert "PRIVATE KEY" not in path.read_text(errors="replace"), path


def test_the_image_holds_what_the_pod_runs() -> None:
    dockerfile = (KUBE / "image" / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE=debian:bookworm-slim$", dockerfile, re.M)
    assert "FROM ${BASE}" in dockerfile
    assert "bubblewrap" in dockerfile and "[daemon]" in dockerfile
    container = _container(render(KUBE / "overlays" / "daemonset"))
    installed = set(re.findall(r"install -m 0755 /src/(\S+) (\S+);", dockerfile))
    assert Path(container["command"][0]) in {Path(dst) for _, dst in installed}
    for src, _ in installed:
        assert (ROOT / src).is_file(), src
    entrypoint = (KUBE / "image" / "entrypoint.sh").read_text()
    assert entrypoint.rstrip().endswith('exec tooljail "$@"')
    assert shlex.split(f"tooljail {' '.join(container['args'])}")[1] == "serve"


NOT_SETTINGS = {
    "container_t": "an SELinux type",
    "enter_graceful_shutdown": "grpc's health servicer method",
    "get_call": "an SDK method",
    "no_new_privs": "a process flag",
    "upload_file": "a built-in tool",
}
"""Names docs/kubernetes.md uses that are not the daemon's settings."""


def test_every_setting_the_kubernetes_guide_names_exists() -> None:
    def names(model: type[Any]) -> set[str]:
        found = set(model.model_fields)
        for field in model.model_fields.values():
            if isinstance(field.annotation, type) and hasattr(field.annotation, "model_fields"):
                found |= names(field.annotation)
        return found

    text = (ROOT / "docs" / "kubernetes.md").read_text()
    named = set(re.findall(r"`(?:\[[a-z.]+\] )?([a-z][a-z0-9]*(?:_[a-z0-9]+)+)`", text))
    unknown = sorted(named - names(Settings) - set(NOT_SETTINGS))
    assert not unknown, f"docs/kubernetes.md names settings that do not exist: {unknown}"
    assert {"shutdown_grace_s", "state_dir", "metrics_listen"} <= named


def test_the_memory_limit_holds_every_running_sandbox(rendered: list[Obj]) -> None:
    settings = _settings(rendered)
    limit = _container(rendered)["resources"]["limits"]["memory"]
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", limit).groups()  # type: ignore[union-attr]
    limit_bytes = int(number) * {"Mi": 1024**2, "Gi": 1024**3}[unit]
    sandboxes = settings.max_concurrent * settings.limits.sandbox_memory_bytes
    assert limit_bytes >= sandboxes + 512 * 1024**2
