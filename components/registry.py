"""The training image: an ECR repository and the image built from ``training/`` and pushed to it.

The tag is a content hash of what the build reads (the ``training/`` files Docker sends as the
build context, the Dockerfile, the build arguments and the platform), so a change to the
training code gives a new tag and a new job, and an unchanged tree changes nothing. The job
uses the pushed reference pinned by digest (``repo:tag@sha256:...``), never a floating tag.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pulumi
import pulumi_aws as aws
import pulumi_docker_build as docker_build

from components import versions

ROOT = Path(__file__).resolve().parent.parent
TRAINING_DIR = ROOT / "training"
DOCKERFILE = "Dockerfile"
KEEP_IMAGES = 20
"""ECR keeps this many most recent images (and the build cache manifest); older ones expire."""
CACHE_TAG = "buildcache"
TAG_LENGTH = 16
"""Hex digits of the content hash used as the tag (64 bits: collisions are not a concern)."""

ALWAYS_IGNORED_DIRS = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"})
ALWAYS_IGNORED_SUFFIXES = (".pyc", ".pyo")


# --------------------------------------------------------------------------- the content hash


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A ``.dockerignore`` pattern as a regex: Go's ``filepath.Match`` plus ``**`` (any depth)."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):  # "**/" also matches no directory at all
                out.append("(?:.*/)?")
                i += 1
            else:
                out.append(".*")
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end == -1:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : end]
                if body.startswith(("!", "^")):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z")


def dockerignore_rules(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """Parse ``.dockerignore``: ``(is_exception, regex)`` per pattern, in file order.

    Docker's semantics: patterns are cleaned paths relative to the context root (a leading ``/``
    is dropped), ``#`` starts a comment line, ``!`` re-includes, and the last matching rule wins.
    """
    rules = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = line[1:].strip() if exception else line
        pattern = os.path.normpath(pattern).replace(os.sep, "/").lstrip("/")
        if pattern in ("", "."):
            continue
        rules.append((exception, _glob_regex(pattern)))
    return rules


def is_ignored(relpath: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """True when Docker leaves ``relpath`` out of the build context.

    A pattern that matches a directory excludes everything below it, so each rule is tried
    on the path and on each of its parent directories (moby's ``MatchesOrParentMatches``).
    """
    parts = PurePosixPath(relpath).parts
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for exception, regex in rules:
        if any(regex.match(c) for c in candidates):
            ignored = not exception
    return ignored


def context_files(context: Path) -> Iterator[str]:
    """Relative POSIX paths of the files Docker sends from ``context``, sorted.

    Byte-code caches are always left out (they differ between machines and never belong in the
    image), and so is whatever the context's ``.dockerignore`` excludes.
    """
    ignore_file = context / ".dockerignore"
    rules = dockerignore_rules(ignore_file.read_text()) if ignore_file.exists() else []
    found = []
    for root, dirs, files in os.walk(context):
        dirs[:] = [d for d in dirs if d not in ALWAYS_IGNORED_DIRS]
        for name in files:
            if name.endswith(ALWAYS_IGNORED_SUFFIXES):
                continue
            rel = Path(root, name).relative_to(context).as_posix()
            if not is_ignored(rel, rules):
                found.append(rel)
    yield from sorted(found)


def content_hash(
    context: Path, *, dockerfile: Path, build_args: Mapping[str, str], platform: str
) -> str:
    """SHA-256 over every input of the build: context files (sorted relative paths and bytes),
    the Dockerfile, the build arguments and the platform. Modification times do not count."""
    digest = hashlib.sha256()

    def feed(label: str, data: bytes) -> None:
        # Length-prefixed, so no two different inputs can concatenate to the same stream.
        for chunk in (label.encode(), data):
            digest.update(len(chunk).to_bytes(8, "big"))
            digest.update(chunk)

    for rel in context_files(context):
        feed(f"file:{rel}", (context / rel).read_bytes())
    feed("dockerfile", dockerfile.read_bytes())
    feed("build-args", json.dumps(dict(build_args), sort_keys=True).encode())
    feed("platform", platform.encode())
    return digest.hexdigest()


def image_tag(context: Path = TRAINING_DIR) -> str:
    """The tag of the training image: the first ``TAG_LENGTH`` hex digits of its content hash."""
    return content_hash(
        context,
        dockerfile=context / DOCKERFILE,
        build_args=versions.TRAINING_IMAGE_BUILD_ARGS,
        platform=versions.TRAINING_IMAGE_PLATFORM,
    )[:TAG_LENGTH]


def lifecycle_policy(keep: int = KEEP_IMAGES) -> str:
    """ECR lifecycle policy: expire every image beyond the ``keep`` most recently pushed."""
    return json.dumps(
        {
            "rules": [
                {
                    "rulePriority": 1,
                    "description": f"keep the last {keep} images",
                    "selection": {"tagStatus": "any", "countType": "imageCountMoreThan", "countNumber": keep},
                    "action": {"type": "expire"},
                }
            ]
        },
        sort_keys=True,
    )


# --------------------------------------------------------------------------- the component


@dataclass(frozen=True, kw_only=True)
class TrainingImageArgs:
    """Inputs of ``TrainingImage``."""

    name: str
    """Prefix of the repository name (``<project>-<stack>``)."""
    context: Path = TRAINING_DIR
    """Build context: the training package directory, with its Dockerfile."""


class TrainingImage(pulumi.ComponentResource):
    """ECR repository (scan on push, keeps the last images, destroyable with images inside) and
    the training image pushed to it under its content-hash tag."""

    def __init__(self, name: str, args: TrainingImageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("fsdp-eks:registry:TrainingImage", name, None, opts)
        self.tag = image_tag(args.context)
        self.repository = self._repository(name, args)
        self.lifecycle = aws.ecr.LifecyclePolicy(
            f"{name}-lifecycle",
            repository=self.repository.name,
            policy=lifecycle_policy(),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.image = self._image(name, args)
        self.repository_url = self.repository.repository_url
        self.ref = self.image.ref
        """``<repository>:<tag>@sha256:<digest>``: what the job runs."""
        self.register_outputs(
            {"repository_url": self.repository_url, "tag": self.tag, "ref": self.ref, "digest": self.image.digest}
        )

    def _repository(self, name: str, args: TrainingImageArgs) -> aws.ecr.Repository:
        return aws.ecr.Repository(
            f"{name}-repo",
            name=f"{args.name}/training",
            image_scanning_configuration=aws.ecr.RepositoryImageScanningConfigurationArgs(scan_on_push=True),
            # Mutable: the build cache manifest is re-pushed under one tag. Image tags are content
            # hashes and the job pins the digest, so a tag never silently changes what runs.
            image_tag_mutability="MUTABLE",
            # `pulumi destroy` deletes the repository even with images in it.
            force_delete=True,
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _image(self, name: str, args: TrainingImageArgs) -> docker_build.Image:
        url = self.repository.repository_url
        registry = url.apply(lambda u: u.split("/", 1)[0])
        token = aws.ecr.get_authorization_token_output(
            registry_id=self.repository.registry_id, opts=pulumi.InvokeOutputOptions(parent=self)
        )
        cache_ref = url.apply(lambda u: f"{u}:{CACHE_TAG}")
        # Relative to the project directory (Pulumi's working directory), so the state does not
        # depend on where the repository is checked out.
        location = Path(os.path.relpath(args.context, ROOT))
        return docker_build.Image(
            f"{name}-image",
            context=docker_build.BuildContextArgs(location=location.as_posix()),
            dockerfile=docker_build.DockerfileArgs(location=(location / DOCKERFILE).as_posix()),
            build_args=dict(versions.TRAINING_IMAGE_BUILD_ARGS),
            platforms=[docker_build.Platform(versions.TRAINING_IMAGE_PLATFORM)],
            tags=[url.apply(lambda u: f"{u}:{self.tag}")],
            push=True,
            # A CUDA + PyTorch image takes many minutes to build: `pulumi preview` only checks the
            # Dockerfile's syntax; `pulumi up` builds and pushes.
            build_on_preview=False,
            # The ECR token expires after 12 hours; docker-build ignores password changes in its
            # diff, so a new token never rebuilds an unchanged image.
            registries=[
                docker_build.RegistryArgs(
                    address=registry, username=token.user_name, password=pulumi.Output.secret(token.password)
                )
            ],
            # Layers cached in the repository itself (ECR needs image-manifest + OCI media types).
            cache_from=[docker_build.CacheFromArgs(registry=docker_build.CacheFromRegistryArgs(ref=cache_ref))],
            cache_to=[
                docker_build.CacheToArgs(
                    registry=docker_build.CacheToRegistryArgs(
                        ref=cache_ref,
                        mode=docker_build.CacheMode.MAX,
                        image_manifest=True,
                        oci_media_types=True,
                        ignore_error=True,
                    )
                )
            ],
            opts=pulumi.ResourceOptions(parent=self),
        )
