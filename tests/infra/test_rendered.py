"""What ``pulumi up`` installs, rendered: every Helm release with exactly the values of the mock run
and the Training Operator overlay, with the real helm and kubectl (kustomize), offline, for every
stack file: the checks below run once per rendering class (stacks whose rendered inputs differ only
in their instance type, region and stack name), and every other stack of a class is rendered and
compared with the class's first (``test_a_stack_renders_as_the_first_of_its_class``).

Checked against: Kubernetes' own schemas (kubernetes-validate, strict, each supported version);
the CRDs rendered beside the custom resources (unknown fields are errors, as the API server would
prune them), including our own PodMonitor, PrometheusRule and PyTorchJob; the charts themselves
(every values key we set changes what they render); the nodes (the GPU taint, our GPU and system
labels, an existing cluster's GPU nodes that carry only the instance type); and the pins.

helm and kubectl come from ``.tools/`` (``make tools``) or the PATH. Without them these tests skip
with the tool's name, except under ``CI=true``, where a missing tool fails them.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from components import versions
from components.cluster import SYSTEM_NODE_LABEL
from components.gpu_nodes import GPU_LABELS
from components.planning.hardware import PROFILES
from offline import rendering
from offline.stacks import ROOT
from tests.conftest import recording_of
from tests.harness import (
    GPU_TAINT,
    HELM,
    STACKS,
    Recording,
    plain,
    stack_config,
    tolerates,
    tool_missing,
    variant,
    variant_config,
)

KUSTOMIZE = "kubernetes:kustomize/v2:Directory"
GPU_ONLY_SOURCES = ("device-plugins-nvidia", "device-plugins-efa", "observability-dcgm")
"""Releases whose DaemonSets belong on the GPU nodes and nowhere else."""
INERT_DAEMONSETS = {
    "mps-control-daemon": "the NVIDIA chart's MPS daemon runs only on nodes labelled nvidia.com/mps.capable=true "
                          "(GPU sharing with MPS, which this stack does not configure)",
}
"""DaemonSets a chart renders that are meant to fit none of our nodes, by name suffix, and why."""


# --------------------------------------------------------------------------- tools and renders


def known_differences(stack: str, config: dict | None = None) -> dict[str, str]:
    """Where two stacks' rendered objects may differ, each string with its placeholder: the
    GPU instance type (node affinities), the region (image registries) and the stack's name in
    the cluster's name (``fsdp-eks-<stack>``: the autoscaler's discovery) and the physical names
    of its resources. ``config``: the stack's (its file's by default)."""
    config = stack_config(stack) if config is None else config
    return {PROFILES[config["fsdp-eks:profile"]].instance_type: "<instance-type>",
            f"fsdp-eks-{stack}": "fsdp-eks-<stack>", config["aws:region"]: "<region>"}


def normalized(text: str, stack: str, config: dict | None = None) -> str:
    for known, placeholder in known_differences(stack, config).items():
        text = text.replace(known, placeholder)
    return text


def rendered_inputs(recording: Recording, stack: str, config: dict | None = None) -> str:
    """What the rendering reads from a mock run (the Kubernetes version, each release's chart,
    version, namespace and values, the kustomizations), the known differences replaced."""
    inputs = {"kubeVersion": rendering.kube_version_of(recording),
              "releases": {r.name: {**{k: r.inputs.get(k) for k in ("chart", "version", "namespace")},
                                    "values": rendering.release_values(r.inputs)} for r in recording.of_type(HELM)},
              "kustomizations": [r.inputs["directory"] for r in recording.of_type(KUSTOMIZE)]}
    return normalized(json.dumps(inputs, sort_keys=True), stack, config)


def rendering_classes() -> dict[str, list[str]]:
    """Stacks by rendering class: the first stack of each class -> every stack of it."""
    classes: dict[str, list[str]] = {}
    for stack in STACKS:
        classes.setdefault(rendered_inputs(recording_of(stack), stack), []).append(stack)
    return {members[0]: members for members in classes.values()}


CLASSES = rendering_classes()


@pytest.fixture(scope="session", params=sorted(CLASSES))
def stack(request) -> str:
    """The first stack of each rendering class: the stacks the checks of this module render."""
    return request.param


@pytest.fixture(scope="session")
def recording(stack: str) -> Recording:
    """The program's recording for this module's `stack`. A fixture of its own: the shared
    session-scoped `recording` of tests/conftest.py, once taken through the `stack` above, would
    stay cached for that stack and be handed to other modules' stacks."""
    return recording_of(stack)



def require(tool: str) -> Path:
    """The tool, or a skip naming it (a failure under CI, which must never skip)."""
    try:
        return rendering.find_tool(tool)
    except rendering.ToolMissing as missing:
        tool_missing(str(missing))


@functools.cache
def rendered_stack(stack: str) -> dict[str, rendering.Rendered]:
    """Every release and kustomization of ``stack``, rendered once per session."""
    return {r.source: r for r in rendering.render_stack(recording_of(stack))}


@pytest.fixture(scope="session")
def rendered(stack: str) -> dict[str, rendering.Rendered]:
    require("helm")
    require("kubectl")
    return rendered_stack(stack)


def own_objects(recording: Recording) -> list[dict]:
    """The objects the program applies itself (no Helm, no kustomize), as the API server gets them."""
    objects = []
    for r in recording.resources:
        if r.type.startswith("kubernetes:") and r.type not in (HELM, KUSTOMIZE) and r.type.count(":") == 2:
            group_version, kind = r.type[len("kubernetes:"):].split(":")
            group, version = group_version.split("/")
            objects.append({"apiVersion": version if group == "core" else f"{group}/{version}", "kind": kind,
                            **plain(r.inputs)})
    return objects


def name_of(obj: dict) -> str:
    return f"{obj['kind']}/{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"


def pod_spec(obj: dict) -> dict | None:
    """The pod spec a workload runs (for the operator's Prometheus and Alertmanager: the fields
    of their pod that the values set)."""
    kind, spec = obj["kind"], obj.get("spec") or {}
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return spec["template"]["spec"]
    if kind == "CronJob":
        return spec["jobTemplate"]["spec"]["template"]["spec"]
    if kind == "Pod":
        return spec
    if kind in ("Prometheus", "Alertmanager"):
        return {k: spec.get(k) for k in ("nodeSelector", "affinity", "tolerations")} | {
            "containers": [{"image": spec["image"]}] if spec.get("image") else []}
    return None


# --------------------------------------------------------------------------- the nodes


def nodes(stack: str) -> dict[str, dict]:
    """A GPU node of this stack, a system node, and a GPU node of an existing cluster (its
    instance type and the GPU taint, none of our labels)."""
    profile = PROFILES[stack_config(stack)["fsdp-eks:profile"]]
    common = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
    gpu_type = {"node.kubernetes.io/instance-type": profile.instance_type}
    return {
        "gpu": {"labels": {**common, **GPU_LABELS, **gpu_type}, "taints": [GPU_TAINT]},
        "existing-gpu": {"labels": {**common, **gpu_type}, "taints": [GPU_TAINT]},
        "system": {"labels": {**common, **SYSTEM_NODE_LABEL, "node.kubernetes.io/instance-type": "m6i.2xlarge"},
                   "taints": []},
    }


def _matches(expression: dict, labels: dict) -> bool:
    value, op, values = labels.get(expression["key"]), expression["operator"], expression.get("values", [])
    return {"In": value in values, "NotIn": value not in values, "Exists": value is not None,
            "DoesNotExist": value is None}[op]


def fits(pod: dict, node: dict) -> str:
    """Why the scheduler would not put ``pod`` on ``node`` ('' when it would)."""
    labels = node["labels"]
    for key, value in (pod.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"nodeSelector {key}={value}"
    required = (((pod.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
    if required and not any(all(_matches(e, labels) for e in term.get("matchExpressions", [])) for term in required):
        return "required node affinity"
    for taint in node["taints"]:
        if not tolerates(pod.get("tolerations") or [], taint):
            return f"taint {taint['key']}"
    return ""


# --------------------------------------------------------------------------- pins and sources


def test_every_release_installs_a_chart_the_tests_render(recording: Recording):
    """Each release's chart is a vendored folder at the pinned version, never a repository, and
    each kustomization is vendored."""
    releases = recording.of_type(HELM)
    assert len(releases) >= 4
    for r in releases:
        chart, version = r.inputs["chart"], r.inputs["version"]
        [pin] = [p for p in vars(versions).values() if isinstance(p, versions.HelmChart)
                 and chart == f"./{p.folder}"]
        meta = yaml.safe_load((ROOT / pin.folder / "Chart.yaml").read_text())
        assert (meta["name"], meta["version"], version) == (pin.chart, pin.version, pin.version), r.name
        assert "repositoryOpts" not in r.inputs, f"{r.name}: installs from a repository"
    for k in recording.of_type(KUSTOMIZE):
        assert (ROOT / k.inputs["directory"] / "kustomization.yaml").is_file(), k.inputs["directory"]


def as_stack(recording: Recording, first: str, member: str) -> Recording:
    """What ``recording`` (a run of stack ``first``) gives the rendering, with ``member``'s
    instance type, region and stack name in place of ``first``'s."""
    swap = {placeholder: known for known, placeholder in known_differences(member).items()}
    resources = []
    for r in recording.resources:
        if r.type in (HELM, KUSTOMIZE, "eks:index:Cluster"):
            text = normalized(json.dumps(r.inputs), first)
            for placeholder, known in swap.items():
                text = text.replace(placeholder, known)
            resources.append(dataclasses.replace(r, inputs=json.loads(text)))
    return Recording(resources)


@pytest.mark.parametrize(("first", "member"), [(first, m) for first, members in CLASSES.items() for m in members[1:]])
def test_a_stack_renders_as_the_first_of_its_class(first: str, member: str):
    """The checks of this module run on the first stack of each class only: every other stack
    of the class, rendered with the real tools, gives exactly what the first's inputs render
    with its instance type, region and stack name put in (a value that differs otherwise would
    have put it in a class of its own)."""
    require("helm")
    require("kubectl")
    ours = {r.source: r.text for r in rendering.render_stack(recording_of(member))}
    assert ours == {r.source: r.text for r in rendering.render_stack(as_stack(recording_of(first), first, member))}


@pytest.mark.parametrize(("changes", "same_class"), [
    ({"job": {"epochs": 2}}, True),  # the job is no release's value
    ({"observability": {"prometheusRetention": "7d"}}, False),  # a value of kube-prometheus-stack
])
def test_a_value_of_its_own_puts_a_stack_in_a_class_of_its_own(changes: dict, same_class: bool):
    """The class key sees every release value and nothing else: a variant of p5 (another stack
    name) that changes a value of a release falls in a class of its own, one that changes only
    the job stays in p5's."""
    key = rendered_inputs(variant("p5", **changes), "p5-variant", variant_config("p5", **changes))
    assert (key == rendered_inputs(recording_of("p5"), "p5")) is same_class


def test_rendering_is_deterministic(recording: Recording, rendered: dict[str, rendering.Rendered]):
    again = {r.source: r.text for r in rendering.render_stack(recording)}
    assert again == {source: r.text for source, r in rendered.items()}


def test_every_release_and_the_operator_render_objects(rendered: dict[str, rendering.Rendered]):
    for source, r in rendered.items():
        assert r.objects, f"{source} ({r.chart}) renders nothing"
    assert {"training-operator", *GPU_ONLY_SOURCES} <= set(rendered)


# --------------------------------------------------------------------------- validity


def strict_crd_schema(schema: dict) -> dict:
    """A CRD's structural schema as a JSON schema that rejects what the API server would prune."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if not isinstance(node, dict):
            return
        if node.pop("x-kubernetes-int-or-string", False):
            node.pop("type", None)
            node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        if node.get("nullable") and "type" in node:
            node["type"] = [node["type"], "null"]
        if (node.get("type") == "object" and "properties" in node and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            node["additionalProperties"] = False
        for child in [*(node.get("properties") or {}).values(), node.get("items"), node.get("additionalProperties"),
                      *(node.get("allOf") or []), *(node.get("anyOf") or []), *(node.get("oneOf") or [])]:
            walk(child)

    walk(schema)
    schema.setdefault("properties", {}).update(apiVersion={"type": "string"}, kind={"type": "string"},
                                               metadata={"type": "object"})
    return schema


@functools.cache
def crd_validators(stack: str) -> dict[tuple[str, str], jsonschema.Draft7Validator]:
    """(apiVersion, kind) -> a validator, for every CRD the stack renders."""
    found = {}
    for r in rendered_stack(stack).values():
        for crd in (o for o in r.objects if o["kind"] == "CustomResourceDefinition"):
            for v in crd["spec"]["versions"]:
                found[(f"{crd['spec']['group']}/{v['name']}", crd["spec"]["names"]["kind"])] = (
                    jsonschema.Draft7Validator(strict_crd_schema(v["schema"]["openAPIV3Schema"])))
    return found


@pytest.mark.parametrize("kube_version", versions.SUPPORTED_KUBERNETES_VERSIONS)
def test_every_object_is_valid(stack: str, recording: Recording, rendered: dict[str, rendering.Rendered],
                               kube_version: str):
    """Built-in kinds strictly against Kubernetes' schema; custom resources (the charts' and ours)
    against the CRD rendered beside them."""
    objects = [o for r in rendered.values() for o in r.objects] + own_objects(recording)
    crds = crd_validators(stack)
    errors, against_crd = [], 0
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            validator = crds.get((obj["apiVersion"], obj["kind"]))
            if validator is None:
                errors.append(f"{name_of(obj)}: no schema for {obj['apiVersion']} and no CRD rendered")
                continue
            against_crd += 1
            errors += [f"{name_of(obj)}: {'.'.join(map(str, e.absolute_path))}: {e.message[:160]}"
                       for e in validator.iter_errors(obj)]
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{name_of(obj)}: {'.'.join(map(str, e.path))}: {e.message[:160]}")
    assert not errors, "\n".join(errors)
    ours = {o["kind"] for o in own_objects(recording)}
    assert {"PodMonitor", "PrometheusRule", "PyTorchJob"} <= ours and against_crd >= 5


def test_the_crd_check_rejects_an_unknown_field(stack: str, recording: Recording,
                                                rendered: dict[str, rendering.Rendered]):
    """The check above can fail: a PyTorchJob with a misspelt field is an error."""
    [job] = [o for o in own_objects(recording) if o["kind"] == "PyTorchJob"]
    job = copy.deepcopy(job)
    job["spec"]["runPolicy"]["cleanPodPolicyy"] = "None"
    assert list(crd_validators(stack)[("kubeflow.org/v1", "PyTorchJob")].iter_errors(job))


# --------------------------------------------------------------------------- placement and images


def workloads(rendered: dict[str, rendering.Rendered], recording: Recording) -> list[tuple[str, dict, dict]]:
    """(source, object, pod spec) of every workload, rendered or our own."""
    found = [(source, o, pod_spec(o)) for source, r in rendered.items() for o in r.objects]
    found += [("fsdp-eks", o, pod_spec(o)) for o in own_objects(recording)]
    return [(s, o, p) for s, o, p in found if p is not None]


def test_gpu_daemonsets_fit_our_gpu_nodes_and_an_existing_clusters(stack: str, recording: Recording,
                                                                   rendered: dict[str, rendering.Rendered]):
    node = nodes(stack)
    daemonsets = [(s, o, p) for s, o, p in workloads(rendered, recording) if o["kind"] == "DaemonSet"]
    assert {s for s, _, _ in daemonsets} >= set(GPU_ONLY_SOURCES)
    for source, obj, pod in daemonsets:
        if any(obj["metadata"]["name"].endswith(suffix) for suffix in INERT_DAEMONSETS):
            assert all(fits(pod, n) for n in node.values()), f"{name_of(obj)}: not inert any more"
            continue
        for where in ("gpu", "existing-gpu"):
            assert not (why := fits(pod, node[where])), f"{name_of(obj)} ({source}) not on a {where} node: {why}"
        if source in GPU_ONLY_SOURCES:
            assert fits(pod, node["system"]), f"{name_of(obj)} ({source}) would run on the system nodes"
        else:  # node-exporter: every node
            assert not (why := fits(pod, node["system"])), f"{name_of(obj)} ({source}) not on a system node: {why}"


def test_dcgm_exporter_renders_as_a_client_of_the_nodes_host_engine(rendered: dict[str, rendering.Rendered]):
    """The chart turns our values into a DaemonSet on the host network whose exporter connects
    to ``localhost:5555``, the node monitoring agent's nv-hostengine (one per node)."""
    [daemon_set] = [o for o in rendered["observability-dcgm"].objects if o["kind"] == "DaemonSet"]
    spec = daemon_set["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    [exporter] = spec["containers"]
    args = exporter["args"]
    assert args[args.index("-r") + 1] == "localhost:5555", args


def test_system_workloads_carry_the_system_node_selector(stack: str, recording: Recording,
                                                         rendered: dict[str, rendering.Rendered]):
    node = nodes(stack)
    others = [(s, o, p) for s, o, p in workloads(rendered, recording) if o["kind"] != "DaemonSet"]
    assert len(others) >= 5
    for source, obj, pod in others:
        assert SYSTEM_NODE_LABEL.items() <= (pod.get("nodeSelector") or {}).items(), (
            f"{name_of(obj)} ({source}): no system node selector")
        assert not (why := fits(pod, node["system"])), f"{name_of(obj)} ({source}): {why}"


def test_images_are_pinned(stack: str, recording: Recording, rendered: dict[str, rendering.Rendered]):
    """Every image has a tag or digest, never ``latest``; those we pin are ours."""
    images: dict[str, set[str]] = {}
    for source, obj, pod in workloads(rendered, recording):
        for c in (pod.get("initContainers") or []) + (pod.get("containers") or []):
            images.setdefault(source, set()).add(c["image"])
    for source, found in images.items():
        for image in found:
            last = image.split("@")[0].rsplit("/", 1)[-1]
            tag = last.partition(":")[2]
            assert "@sha256:" in image or tag not in ("", "latest"), f"{source}: {image} is not pinned"
    region = stack_config(stack)["aws:region"]
    assert images["device-plugins-efa"] == {
        f"{versions.eks_image_registry(region)}/eks/aws-efa-k8s-device-plugin:{versions.EFA_DEVICE_PLUGIN_IMAGE_TAG}"}
    assert images["training-operator"] == {versions.TRAINING_OPERATOR_IMAGE}


def test_operator_on_the_system_nodes_of_a_created_cluster_only(stack: str, rendered: dict[str, rendering.Rendered]):
    """Our overlay's label is the system nodes' (cluster.py); an existing cluster gets the
    upstream overlay, whose operator fits any node."""
    [deployment] = [o for o in rendered["training-operator"].objects if o["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == SYSTEM_NODE_LABEL
    standalone = rendering.load_manifests(rendering.kustomize_build(
        str(versions.TRAINING_OPERATOR_OVERLAYS["standalone"])))
    [upstream] = [o for o in standalone if o["kind"] == "Deployment"]
    assert "nodeSelector" not in upstream["spec"]["template"]["spec"]


# --------------------------------------------------------------------------- values the charts use


def _leaves(values: Any, path: tuple = ()):
    if isinstance(values, dict) and values:
        for key, value in values.items():
            yield from _leaves(value, path + (key,))
    else:
        yield path, values


def _changed(value: Any, token: str) -> Any:
    """``value`` changed so that the change can be seen: strings and lists carry ``token``."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 7
    if isinstance(value, str):
        return f"{value}\n# {token}\n" if "\n" in value else f"{value}{token}"
    if isinstance(value, list):
        if value and isinstance(value[0], dict):
            return value + [{"key": f"example.invalid/{token}", "operator": "Exists", "effect": "NoSchedule"}]
        # Replaced, not extended: an exclusion list (kube-state-metrics' collectorsExclude)
        # ignores an entry it does not know.
        return [token]
    return {token: token}


def _with(values: dict, path: tuple, value: Any) -> dict:
    out = copy.deepcopy(values)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


@pytest.mark.parametrize("source", ["device-plugins-nvidia", "device-plugins-efa", "storage-fsx-csi",
                                    "observability-kps", "observability-dcgm"])
def test_every_value_we_set_changes_the_rendered_output(stack: str, recording: Recording,
                                                        rendered: dict[str, rendering.Rendered], source: str):
    """A key the chart ignores (misspelt, moved by a chart bump) is a silent bug: each leaf we set,
    changed alone, must change what the chart renders (a list counts as one leaf)."""
    [release] = [r for r in recording.of_type(HELM) if r.name == source]
    values = rendering.release_values(release.inputs)
    folder = rendering.chart_dir(release.inputs["chart"], release.inputs["version"])
    kube = rendering.kube_version_of(recording)

    def render(v: dict) -> str:
        try:
            return rendering.helm_template(folder, source, release.inputs["namespace"], v, kube)
        except RuntimeError as failed:
            return f"render failed: {failed}"  # a value the chart validates: used

    base = rendered[source].text
    leaves = list(_leaves(values))
    # First all strings at once, each with its own token: a token in the output shows its key used.
    tokens = {path: f"probe{i}x" for i, (path, value) in enumerate(leaves) if isinstance(value, str)}
    batch = values
    for path, value in leaves:
        if path in tokens:
            batch = _with(batch, path, _changed(value, tokens[path]))
    seen = render(batch)
    rest = [(path, value) for path, value in leaves if path not in tokens or tokens[path] not in seen]
    with ThreadPoolExecutor(max_workers=2) as pool:
        outputs = list(pool.map(lambda leaf: render(_with(values, leaf[0], _changed(leaf[1], "probex"))), rest))
    ignored = [".".join(path) for (path, _), out in zip(rest, outputs) if out == base]
    assert ignored == [], f"{source}: keys the chart ignores"


def test_the_value_check_sees_an_ignored_key(stack: str, recording: Recording, rendered: dict[str, rendering.Rendered]):
    """The check above can fail: a misspelt key changes nothing."""
    [release] = [r for r in recording.of_type(HELM) if r.name == "device-plugins-efa"]
    values = {**rendering.release_values(release.inputs), "nodeSelectr": {"a": "b"}}
    folder = rendering.chart_dir(release.inputs["chart"], release.inputs["version"])
    out = rendering.helm_template(folder, release.name, "kube-system", values, rendering.kube_version_of(recording))
    assert out == rendered["device-plugins-efa"].text


# --------------------------------------------------------------------------- checkov

CHECKOV_SKIPS_FILE = Path(__file__).with_name("checkov_skips.yaml")
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Namespace", "PersistentVolume",
                  "StorageClass", "CSIDriver", "PriorityClass", "MutatingWebhookConfiguration",
                  "ValidatingWebhookConfiguration"}
CHECKOV_GROUPS = ("gpu-autoscaling-cluster-autoscaler", "device-plugins-nvidia", "device-plugins-efa",
                  "storage-fsx-csi", "observability-kps", "observability-dcgm", "training-operator", "fsdp-eks",
                  "fsdp-eks-etcd")
"""What checkov's findings are judged by: each release, the operator, our own objects, our etcd."""


def checkov_skips() -> dict:
    return yaml.safe_load(CHECKOV_SKIPS_FILE.read_text())


def checkov_groups(stack: str) -> dict[str, list[dict]]:
    """The objects of each group, as installed: the release namespace on every namespaced object."""
    releases = {r.name: r.inputs["namespace"] for r in recording_of(stack).of_type(HELM)}
    groups: dict[str, list[dict]] = {}
    for source, r in rendered_stack(stack).items():
        for obj in r.objects:
            if obj["kind"] == "CustomResourceDefinition":
                continue
            obj = copy.deepcopy(obj)
            if obj["kind"] not in CLUSTER_SCOPED and source in releases:
                obj["metadata"].setdefault("namespace", releases[source])
            groups.setdefault(source, []).append(obj)
    for obj in own_objects(recording_of(stack)):
        groups.setdefault("fsdp-eks-etcd" if "etcd" in obj["metadata"]["name"] else "fsdp-eks", []).append(obj)
    return groups


def test_every_release_is_a_checkov_group(rendered: dict[str, rendering.Rendered]):
    """A release added to the program is scanned too: each rendered source has its group (a
    release missing here went unscanned once)."""
    assert sorted(set(rendered) - set(CHECKOV_GROUPS)) == []


@functools.cache
def checkov_failures(stack: str) -> dict[str, set[str]]:
    """Group -> ``CHECK resource`` of each failed check, with the global skips applied (one run)."""
    import subprocess
    import tempfile

    checkov = rendering.find_tool("checkov")
    with tempfile.TemporaryDirectory() as folder:
        for group, objects in checkov_groups(stack).items():
            (Path(folder) / f"{group}.yaml").write_text(yaml.safe_dump_all(objects))
        done = subprocess.run(
            [str(checkov), "-d", folder, "--framework", "kubernetes", "--skip-download", "--quiet", "--compact",
             "-o", "json", "--skip-check", ",".join(checkov_skips()["skip"])],
            capture_output=True, text=True, check=False, env={**os.environ, "BC_SKIP_MAPPING": "TRUE"})
    assert done.returncode in (0, 1) and done.stdout.strip(), f"checkov failed: {done.stderr[-2000:]}"
    reports = json.loads(done.stdout)
    found: dict[str, set[str]] = {group: set() for group in CHECKOV_GROUPS}
    for report in reports if isinstance(reports, list) else [reports]:
        for failed in report["results"]["failed_checks"]:
            group = Path(failed["file_path"]).stem
            found.setdefault(group, set()).add(f"{failed['check_id']} {failed['resource'].split('.')[0]}")
    return found


@pytest.mark.parametrize("group", CHECKOV_GROUPS)
def test_checkov_finds_only_the_accepted(stack: str, rendered: dict[str, rendering.Rendered], group: str):
    """checkov (kubernetes framework, offline) over every object: a finding is either skipped for
    all (``skip``: our policy) or accepted for its group (``accepted``: what that chart needs, each
    with its reason); a new finding fails, and so does an accepted one that no longer occurs."""
    require("checkov")
    accepted = set((checkov_skips()["accepted"].get(group) or {}).get("checks", []))
    found = checkov_failures(stack)[group]
    assert sorted(found - accepted) == [], f"{group}: new checkov findings"
    assert sorted(accepted - found) == [], f"{group}: accepted findings that no longer occur: drop them"
