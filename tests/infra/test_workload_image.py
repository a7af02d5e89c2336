"""The training image: ECR repository, lifecycle, push credentials, and the content-hash tag.

Checked against: Docker's ``.dockerignore`` semantics (moby patternmatcher: last match wins,
``!`` re-includes, a matched directory excludes its contents, ``**`` any depth), the ECR
lifecycle-policy format, and the docker-build provider's inputs (mocks).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from components import registry, versions
from offline.recording import is_secret_value
from components.registry import (
    content_hash,
    context_files,
    dockerignore_rules,
    image_tag,
    is_ignored,
)
from components.stack import Export
from tests.harness import Recording, plain

IMAGE = "docker-build:index:Image"
REPO = "aws:ecr/repository:Repository"


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture
def context(tmp_path: Path) -> Path:
    return tree(tmp_path / "ctx", {
        "Dockerfile": "FROM scratch\n",
        ".dockerignore": "Dockerfile\n.dockerignore\n**/__pycache__\nnotes/\n*.md\n!KEEP.md\n",
        "__init__.py": "",
        "finetune.py": "print('train')\n",
        "data/instructions.jsonl": '{"a": 1}\n',
        "README.md": "docs\n",
        "KEEP.md": "kept\n",
    })


def tag(ctx: Path) -> str:
    return content_hash(ctx, dockerfile=ctx / "Dockerfile", build_args={"A": "1"}, platform="linux/amd64")


def test_the_hash_changes_when_a_file_changes(context: Path):
    """Checked against a copy of the tree with one byte changed."""
    before = tag(context)
    (context / "finetune.py").write_text("print('train!')\n")
    assert tag(context) != before


@pytest.mark.parametrize("edit", [
    lambda c: (c / "data" / "more.jsonl").write_text("{}\n"),
    lambda c: (c / "finetune.py").rename(c / "train.py"),
    lambda c: (c / "Dockerfile").write_text("FROM scratch\nUSER 1000\n"),
    lambda c: (c / "KEEP.md").write_text("changed\n"),
])
def test_the_hash_changes_with_anything_the_build_reads(context: Path, edit):
    """Checked against the build's inputs: a new file, a rename, the Dockerfile, a re-included file."""
    before = tag(context)
    edit(context)
    assert tag(context) != before


def test_the_hash_changes_with_build_args_and_platform(context: Path):
    """Checked against the same tree built with other arguments."""
    base = tag(context)
    assert content_hash(context, dockerfile=context / "Dockerfile", build_args={"A": "2"}, platform="linux/amd64") != base
    assert content_hash(context, dockerfile=context / "Dockerfile", build_args={"A": "1"}, platform="linux/arm64") != base


@pytest.mark.parametrize("edit", [
    lambda c: tree(c, {"__pycache__/finetune.cpython-311.pyc": "bytecode", "data/__pycache__/x.pyc": "b"}),
    lambda c: tree(c, {"stray.pyc": "bytecode"}),
    lambda c: tree(c, {"README.md": "other docs\n", "notes/todo.txt": "x"}),
    lambda c: os.utime(c / "finetune.py", (1, 1)),
    lambda c: tree(c, {".dockerignore": "Dockerfile\n.dockerignore\n**/__pycache__\nnotes/\n*.md\n!KEEP.md\n"}),
])
def test_the_hash_ignores_what_docker_does_not_send(context: Path, edit):
    """The cases where nothing should change: byte code, ignored files, modification times."""
    before = tag(context)
    edit(context)
    assert tag(context) == before


def test_the_hash_does_not_depend_on_where_the_tree_is(context: Path, tmp_path: Path):
    """Checked against a copy elsewhere: relative paths only."""
    copy = shutil.copytree(context, tmp_path / "elsewhere" / "ctx")
    assert tag(Path(copy)) == tag(context)


def test_context_files_follow_the_dockerignore(context: Path):
    """Checked against the files Docker would send for this .dockerignore (``*.md`` is the root's
    only: ``*`` does not cross ``/``)."""
    tree(context, {"notes/todo.txt": "x", "pkg/__pycache__/m.pyc": "b", "pkg/m.py": "", "pkg/docs.md": ""})
    assert list(context_files(context)) == [
        "KEEP.md", "__init__.py", "data/instructions.jsonl", "finetune.py", "pkg/docs.md", "pkg/m.py",
    ]


@pytest.mark.parametrize("patterns, path, ignored", [
    ("tests", "tests/test_x.py", True),           # a directory excludes its contents
    ("*.md", "docs/a.md", False),                 # * does not cross /
    ("**/*.md", "docs/a.md", True),
    ("**/*.md", "a.md", True),                    # **/ also matches no directory
    ("docs/**", "docs/a/b.txt", True),
    ("*.md\n!KEEP.md", "KEEP.md", False),         # ! re-includes; the last match wins
    ("!KEEP.md\n*.md", "KEEP.md", True),
    ("/build", "build/out.bin", True),            # a leading / is the context root
    ("da?a", "data/x", True),
    ("[a-c]*.py", "b.py", True),
    ("[!a-c]*.py", "b.py", False),
    ("# comment\n\n", "x", False),
])
def test_dockerignore_matching(patterns: str, path: str, ignored: bool):
    """Checked against Docker's documented .dockerignore rules."""
    assert is_ignored(path, dockerignore_rules(patterns)) is ignored


def test_the_real_tag_is_the_hash_of_training(recording: Recording, tmp_path: Path, monkeypatch):
    """Checked against copies of the training/ tree: the pushed tag is what a copy of the tree
    hashes to, and it moves when a file the build sends changes or a pinned build argument does
    (so a stale image is never reused under a new tree, and a constant tag cannot pass)."""
    copy = Path(shutil.copytree(registry.TRAINING_DIR, tmp_path / "training"))
    (tag_,) = recording.one(IMAGE).inputs["tags"]
    assert re.fullmatch(r".+:[0-9a-f]{16}", tag_) and tag_.endswith(f":{image_tag(copy)}"), tag_
    (copy / "finetune.py").write_text((copy / "finetune.py").read_text() + "\n# changed\n")
    assert not tag_.endswith(f":{image_tag(copy)}"), "an edited training/finetune.py keeps the tag"
    shutil.rmtree(copy)
    copy = Path(shutil.copytree(registry.TRAINING_DIR, tmp_path / "training"))
    monkeypatch.setattr(versions, "TRAINING_IMAGE_BUILD_ARGS", {**versions.TRAINING_IMAGE_BUILD_ARGS, "X": "1"})
    assert not tag_.endswith(f":{image_tag(copy)}"), "a changed build argument keeps the tag"


def test_repository_scans_keeps_the_last_images_and_can_be_destroyed(recording: Recording):
    """Checked against ECR's API: scan on push, force delete, a count-based lifecycle rule."""
    repo = recording.one(REPO).inputs
    assert repo["imageScanningConfiguration"]["scanOnPush"] is True
    assert repo["forceDelete"] is True
    policy = json.loads(recording.one("aws:ecr/lifecyclePolicy:LifecyclePolicy").inputs["policy"])
    (rule,) = policy["rules"]
    # docs/design.md#image: the 20 most recent images stay (rollback targets and the build
    # cache's manifest), every older one expires, tagged or not (ECR "Lifecycle policies").
    assert rule["selection"] == {"tagStatus": "any", "countType": "imageCountMoreThan", "countNumber": 20}
    assert rule["action"] == {"type": "expire"}


def test_image_is_built_from_training_for_amd64_and_pushed_with_a_secret_token(recording: Recording):
    """Checked against the docker-build inputs: context, platform, push, secret registry password."""
    image = recording.one(IMAGE).inputs
    assert image["context"]["location"] == "training"
    assert image["dockerfile"]["location"] == "training/Dockerfile"
    assert image["platforms"] == ["linux/amd64"] and image["push"] is True
    assert image["buildArgs"] == versions.TRAINING_IMAGE_BUILD_ARGS
    registries = image["registries"]
    assert is_secret_value(registries), "the registry password must reach the engine as a secret"
    (reg,) = plain(registries)
    repo_url = recording.exports[Export.IMAGE_REF].split(":")[0]
    assert repo_url.startswith(reg["address"] + "/")
    assert reg["password"] == "ecr-password-secret" and reg["username"] == "AWS"
    assert "ecr-password-secret" not in json.dumps(recording.exports, default=str)
