"""The offline plan of a stack (``python -m offline --stack p5``, ``make demo``): one line per
resource with its key settings, the Kubernetes objects and Helm values as YAML, and what helm
and kubectl render from them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from components.settings import SettingsError
from offline import rendering
from offline.mocks import run_program
from offline.recording import MASK, Recording, Registration, masked
from offline.stacks import STACKS, offline_examples, stack_config, stack_file_config

def kubernetes_objects(recording: Recording) -> list[dict[str, Any]]:
    """The Kubernetes objects of a run, as a ``kubectl apply`` would see them (secrets masked).

    Helm releases and kustomize directories are rendered by their tools at deploy time; they
    appear here as their inputs (chart, version, values), not as manifests.
    """
    objects = []
    for r in recording.resources:
        if not r.type.startswith("kubernetes:") or r.type.startswith(("kubernetes:helm.sh", "kubernetes:kustomize")):
            continue
        group_version, kind = r.type[len("kubernetes:"):].split(":")
        group, version = group_version.split("/")
        body = masked(r.inputs)
        body.setdefault("apiVersion", version if group == "core" else f"{group}/{version}")
        body.setdefault("kind", kind)
        objects.append(body)
    return objects


def _summary(r: Registration) -> str:
    """Key settings of a resource: its scalar inputs, and the size of its lists."""
    parts = []
    meta = r.inputs.get("metadata")
    if isinstance(meta, dict) and "name" in meta:  # a Kubernetes object: where it lives
        parts.append(f"{meta.get('namespace', '')}/{meta['name']}".lstrip("/"))
    for key, value in sorted(masked(r.inputs).items()):
        if isinstance(value, (str, int, bool)) and len(str(value)) <= 80 and key not in ("__self__",):
            parts.append(f"{key}={value}")
        elif isinstance(value, list) and value and key in ("networkInterfaces", "subnetIds", "instanceTypes", "taints"):
            parts.append(f"{key}=[{len(value)}]" if key == "networkInterfaces" else f"{key}={value}")
    return ", ".join(parts)


def print_plan(recording: Recording, stack: str, examples: dict[str, Any] | None = None) -> None:
    """One line per resource, grouped by component, with its key settings; ``examples``: the
    example values the plan used in place of the user's (``offline_examples``), labelled."""
    print(f"Plan of stack {stack}: {len(recording.resources)} resources (offline, under mocks)")
    for dotted, value in (examples or {}).items():
        print(f"  EXAMPLE value, offline plan only: {dotted} = {value} "
              f"(for pulumi up set yours: pulumi config set --path {dotted} <value>)")
    for r in sorted(recording.resources, key=lambda r: r.name):  # names start with their component
        print(f"  + {r.type} {r.name}")
        summary = _summary(r)
        if summary:
            print(f"      {summary}")
    print("Outputs:")
    for key, value in recording.exports.items():
        shown = MASK if key in recording.secret_exports else value
        print(f"  {key}: {shown}")


def write_manifests(recording: Recording, out: Path) -> list[Path]:
    """Write every Kubernetes object and every Helm release's values as YAML under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for obj in kubernetes_objects(recording):
        name = obj.get("metadata", {}).get("name", "unnamed")
        path = out / f"{obj['kind'].lower()}-{name}.yaml"
        path.write_text(yaml.safe_dump(obj, sort_keys=False))
        written.append(path)
    for r in recording.of_type("kubernetes:helm.sh/v3:Release"):
        path = out / f"helm-{r.name}.yaml"
        release = masked({k: r.inputs.get(k) for k in ("chart", "version", "namespace", "values")})
        path.write_text(yaml.safe_dump(release, sort_keys=False))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Render a stack's plan offline (no AWS, no Pulumi CLI).")
    parser.add_argument("--stack", default="p5", choices=STACKS, help="stack file Pulumi.<stack>.yaml")
    parser.add_argument("--out", type=Path, default=Path("out/p5"), help="folder for the rendered YAML")
    args = parser.parse_args(argv)
    try:
        recording = run_program(stack_config(args.stack), args.stack)
    except SettingsError as error:  # the problems alone, as `pulumi preview` prints them
        raise SystemExit(str(error)) from None
    print_plan(recording, args.stack, offline_examples(stack_file_config(args.stack)))
    written = write_manifests(recording, args.out)
    print(f"Wrote {len(written)} Kubernetes objects and Helm values to {args.out}/")
    try:
        rendered = rendering.render_stack(recording)
    except rendering.ToolMissing as missing:
        print(f"Charts not rendered: {missing}")
        return
    files = rendering.write_rendered(rendered, args.out / "rendered")
    objects = sum(len(r.objects) for r in rendered)
    print(f"Rendered {len(files)} Helm releases and kustomizations ({objects} objects) to {args.out}/rendered/")

