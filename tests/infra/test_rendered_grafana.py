"""kube-prometheus-stack's subcharts as rendered (Grafana, kube-state-metrics, node-exporter):
present, at the versions the vendored subcharts ship; Grafana without default credentials, with
our dashboard and a data source it can use; and the README's counts of what is rendered.

The rest of what every rendered object goes through (schemas, placement, pins, checkov) is in
``test_rendered.py``; the renders and fixtures are shared with it.
"""

from __future__ import annotations

import base64
import hashlib
import copy
import json
import re
from pathlib import Path

import yaml

from components import versions
from components.dashboards import gpu_training
from components.observability.common import KPS_FULLNAME, MONITORING_NAMESPACE
from components.observability.metrics_stack import GRAFANA_ADMIN_SECRET, GRAFANA_SERVICE
from offline import rendering
from offline.stacks import ROOT
from tests.harness import HELM, Recording
from tests.infra.test_rendered import (  # noqa: F401 (the fixtures: one stack per rendering class)
    CHECKOV_SKIPS_FILE,
    name_of,
    own_objects,
    pod_spec,
    recording,
    rendered,
    stack,
)

KPS = "observability-kps"
SUBCHARTS = ROOT / versions.KUBE_PROMETHEUS_STACK.folder / "charts"
DEFAULT_PASSWORDS = ("prom-operator", "strongpassword")
"""Grafana admin passwords that ship with the charts: kube-prometheus-stack's long-time default
``grafana.adminPassword`` and the example that its and Grafana's values.yaml suggest."""


def objects_of(rendered: dict[str, rendering.Rendered], source: str, kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in rendered[source].objects if o["kind"] == kind}


def app_version(subchart: str) -> str:
    return yaml.safe_load((SUBCHARTS / subchart / "Chart.yaml").read_text())["appVersion"]


def test_the_subcharts_render_their_workloads_at_their_versions(rendered: dict[str, rendering.Rendered]):
    """Grafana, kube-state-metrics and node-exporter are rendered, each running the image of its
    vendored subchart's appVersion; the Windows exporter (no Windows nodes) is not."""
    workloads = {**objects_of(rendered, KPS, "Deployment"), **objects_of(rendered, KPS, "DaemonSet")}
    expected = {GRAFANA_SERVICE: ("grafana", "grafana"),
                f"{KPS_FULLNAME}-kube-state-metrics": ("kube-state-metrics", "kube-state-metrics"),
                f"{KPS_FULLNAME}-node-exporter": ("prometheus-node-exporter", "node-exporter")}
    for name, (subchart, container) in expected.items():
        assert name in workloads, f"{subchart}: no workload {name} rendered (found {sorted(workloads)})"
        [image] = [c["image"] for c in pod_spec(workloads[name])["containers"] if c["name"] == container]
        tag = image.rsplit(":", 1)[1]
        assert re.fullmatch(rf"v?{re.escape(app_version(subchart))}(-distroless)?", tag), f"{name}: {image}"
    assert not any("windows" in name for name in workloads)


# --------------------------------------------------------------------------- credentials


def credential_problems(objects: list[dict]) -> list[str]:
    """Where rendered objects carry a Grafana admin password other than ours: a known default
    (in any object, Secret data decoded), a generated admin password (the chart's own Secret), a
    password in plain text in an environment variable, or an admin password in grafana.ini."""
    problems = []
    for obj in objects:
        text = yaml.safe_dump(obj)
        if obj["kind"] == "Secret":
            text += "".join(base64.b64decode(v).decode(errors="replace") for v in (obj.get("data") or {}).values())
            if "admin-password" in (obj.get("data") or {}) | (obj.get("stringData") or {}):
                problems.append(f"{name_of(obj)}: a Secret with an admin password of the chart's")
        problems += [f"{name_of(obj)}: default password {p!r}" for p in DEFAULT_PASSWORDS if p in text]
        if re.search(r"^\s*admin_password\s*=", "\n".join(map(str, (obj.get("data") or {}).values())), re.M):
            problems.append(f"{name_of(obj)}: admin_password in a configuration file")
        for container in (pod_spec(obj) or {}).get("containers") or []:
            for env in container.get("env") or []:
                if "PASSWORD" in env["name"] and "value" in env:
                    problems.append(f"{name_of(obj)}: {container['name']} gets {env['name']} in plain text")
    return problems


def test_no_default_credentials_anywhere(rendered: dict[str, rendering.Rendered], recording: Recording):
    """Grafana's admin password is only the one of our Secret (``admin.existingSecret``): no default
    or generated password in any rendered object, and Grafana reads ours from that Secret."""
    objects = [o for r in rendered.values() for o in r.objects]
    assert credential_problems(objects) == []
    grafana = objects_of(rendered, KPS, "Deployment")[GRAFANA_SERVICE]
    [container] = [c for c in pod_spec(grafana)["containers"] if c["name"] == "grafana"]
    env = {e["name"]: e for e in container["env"]}
    for variable, key in (("GF_SECURITY_ADMIN_USER", "admin-user"), ("GF_SECURITY_ADMIN_PASSWORD", "admin-password")):
        assert env[variable]["valueFrom"]["secretKeyRef"] == {"name": GRAFANA_ADMIN_SECRET, "key": key}, variable
    [secret] = [o for o in own_objects(recording)
                if o["kind"] == "Secret" and o["metadata"]["name"] == GRAFANA_ADMIN_SECRET]
    assert {"admin-user", "admin-password"} <= set(secret["stringData"])


def test_the_credential_check_finds_the_charts_own_passwords(recording: Recording):
    """The check above can fail: without our Secret the chart generates a password; with the old
    default value it ships ``prom-operator`` (base64 in its Secret)."""
    [release] = [r for r in recording.of_type(HELM) if r.name == KPS]
    values = rendering.release_values(release.inputs)
    folder = rendering.chart_dir(release.inputs["chart"], release.inputs["version"])
    kube = rendering.kube_version_of(recording)
    for change, expected in (({}, "a Secret with an admin password"),
                             ({"adminPassword": DEFAULT_PASSWORDS[0]}, f"default password {DEFAULT_PASSWORDS[0]!r}")):
        changed = copy.deepcopy(values)
        del changed["grafana"]["admin"]
        changed["grafana"].update(change)
        out = rendering.load_manifests(rendering.helm_template(folder, KPS, MONITORING_NAMESPACE, changed, kube))
        problems = credential_problems(out)
        assert any(expected in p for p in problems), problems


# --------------------------------------------------------------------------- dashboards and data source


def sidecar_env(grafana: dict, container: str) -> dict[str, str]:
    [sidecar] = [c for c in pod_spec(grafana)["containers"] if c["name"] == container]
    return {e["name"]: e.get("value") for e in sidecar["env"]}


def loaded_by(sidecar: dict[str, str], configmaps: list[dict]) -> list[dict]:
    """The ConfigMaps a Grafana sidecar (k8s-sidecar: LABEL, LABEL_VALUE, NAMESPACE) loads."""
    namespaces = sidecar.get("NAMESPACE", MONITORING_NAMESPACE)
    return [c for c in configmaps
            if (c["metadata"].get("labels") or {}).get(sidecar["LABEL"]) == sidecar["LABEL_VALUE"]
            and (namespaces == "ALL" or c["metadata"].get("namespace", MONITORING_NAMESPACE) in namespaces.split(","))]


def test_grafana_loads_our_dashboard_and_a_prometheus_data_source(rendered: dict[str, rendering.Rendered],
                                                                  recording: Recording):
    """Of every ConfigMap rendered or ours, Grafana's dashboard sidecar loads our dashboard and its
    data-source sidecar a data source of the type and uid our dashboard's variable selects, pointing
    at the rendered Prometheus Service."""
    grafana = objects_of(rendered, KPS, "Deployment")[GRAFANA_SERVICE]
    configmaps = [o for r in rendered.values() for o in r.objects if o["kind"] == "ConfigMap"]
    configmaps += [o for o in own_objects(recording) if o["kind"] == "ConfigMap"]

    dashboards = [json.loads(v) for c in loaded_by(sidecar_env(grafana, "grafana-sc-dashboard"), configmaps)
                  for k, v in c["data"].items() if k.endswith(".json")]
    assert gpu_training.UID in {d["uid"] for d in dashboards}

    [variable] = [v for v in gpu_training.dashboard()["templating"]["list"] if v["type"] == "datasource"]
    sources = [s for c in loaded_by(sidecar_env(grafana, "grafana-sc-datasources"), configmaps)
               for text in c["data"].values() for s in yaml.safe_load(text)["datasources"]]
    [prometheus] = [s for s in sources if s["type"] == variable["query"]]
    assert prometheus["uid"] == variable["current"]["value"] and prometheus.get("isDefault")
    host, port = re.fullmatch(r"http://([^:/]+):(\d+)/?", prometheus["url"]).groups()
    service_name, namespace = host.split(".")
    service = objects_of(rendered, KPS, "Service")[service_name]
    assert namespace == MONITORING_NAMESPACE and int(port) in {p["port"] for p in service["spec"]["ports"]}
    [server] = [o for o in rendered[KPS].objects if o["kind"] == "Prometheus"]
    assert service["spec"].get("selector"), f"{service_name} selects no pod"
    assert service["spec"]["selector"].items() <= {"app.kubernetes.io/name": "prometheus",
                                                   "operator.prometheus.io/name": server["metadata"]["name"]}.items()


# --------------------------------------------------------------------------- what the README says


def readme_counts(stack: str) -> dict[str, int]:
    """The README's table of rendered objects: source -> count for ``stack``."""
    lines = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| ")]
    [header] = [line for line in lines if line.startswith("| Stack |")]
    [row] = [line for line in lines if line.startswith(f"| `{stack}` |")]
    names = [c.strip().strip("`") for c in header.strip("|").split("|")][1:]
    return dict(zip(names, (int(c) for c in row.strip("|").split("|")[1:])))


def test_the_readme_counts_the_rendered_objects(stack: str, rendered: dict[str, rendering.Rendered]):
    counts = {source: len(r.objects) for source, r in rendered.items()}
    assert readme_counts(stack) == {**counts, "total": sum(counts.values())}


def test_the_readme_counts_the_checkov_skips_and_accepted_findings():
    skips = yaml.safe_load(Path(CHECKOV_SKIPS_FILE).read_text())
    text = (ROOT / "README.md").read_text()
    assert f"**{len(skips['skip'])} checks skipped**" in text
    accepted = sum(len(group["checks"]) for group in skips["accepted"].values())
    assert f"**{accepted} accepted findings**" in text


# --------------------------------------------------------------------------- where the subcharts come from


def git_tree_id(folder: Path) -> str:
    """The id git gives ``folder`` as a tree (file modes 100644/100755, entries in git's order)."""
    entries = []
    for child in folder.iterdir():
        if child.is_dir():
            entries.append((child.name + "/", b"40000 " + child.name.encode(), git_tree_id(child)))
        else:
            data = child.read_bytes()
            mode = b"100755" if child.stat().st_mode & 0o100 else b"100644"
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            entries.append((child.name, mode + b" " + child.name.encode(), blob))
    body = b"".join(head + b"\0" + bytes.fromhex(sha) for _, head, sha in sorted(entries, key=lambda e: e[0]))
    return hashlib.sha1(b"tree %d\0" % len(body) + body).hexdigest()


def test_each_subchart_is_the_git_tree_of_its_tag():
    """PROVENANCE.md's tree id of each subchart (the tree of its upstream release tag) is what
    is vendored, byte for byte."""
    provenance = (ROOT / versions.VENDOR_DIR / "PROVENANCE.md").read_text()
    claimed = {name: tree for tree, name in
               re.findall(r"git tree id `([0-9a-f]{40})` = the tag's `charts/([\w-]+)`", provenance)}
    assert set(claimed) == {"grafana", "kube-state-metrics", "prometheus-node-exporter", "prometheus-windows-exporter"}
    for name, tree in claimed.items():
        assert git_tree_id(SUBCHARTS / name) == tree, name
