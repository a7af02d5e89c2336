"""The PyTorchJob builder alone: a run is an object, named by what it runs.

Checked against: docs/design.md's "a finished PyTorchJob does not re-run when re-applied: a new run is
a new object" and "without rdzvId every job's run id is the literal none", the operator
webhook's DNS-1035 name rule, and the training package's CLI (training/config.py's parser).
"""

from __future__ import annotations

import dataclasses
import re
import shlex

import pytest

from components.planning.hardware import PROFILES
from components.settings import JobSettings
from components.training_job import (
    LAUNCHER,
    SHARED_DIR,
    model_slug,
    node_check_thresholds,
    pytorchjob_manifest,
    training_command,
)
from offline.mocks import run_program
from offline.stacks import ROOT, stack_config
from tests.harness import container, job_of, job_settings, parse, raw_settings, training_flags
from training import config as training_config
from training.config import build_parser, config_from_namespace

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/fsdp-eks-p5/training:0123456789abcdef@sha256:" + "a" * 64
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def render(job: JobSettings = JobSettings(), *, image: str = IMAGE, profile: str = "p5", **kwargs) -> dict:
    args = {"namespace": "training", "rdzv_host": "etcd.training.svc", "hf_secret": "hf-token", **kwargs}
    if job.rdzv_backend == "c10d":
        args["rdzv_host"] = None
    return pytorchjob_manifest(job, PROFILES[profile], image=image, **args)


def name(job: dict) -> str:
    return job["metadata"]["name"]


def test_the_same_spec_renders_the_same_object():
    """The case where nothing should change: two renders are equal, so Pulumi sees no diff."""
    assert render() == render()
    assert name(render()) == render()["spec"]["elasticPolicy"]["rdzvId"]


@pytest.mark.parametrize("change", [
    {"epochs": 2}, {"batch_size": 2}, {"seq_len": 2048}, {"learning_rate": 1e-5}, {"sharding": "HYBRID_SHARD"},
    {"activation_checkpointing": "selective"}, {"compile": True}, {"nodes": 1, "min_nodes": 1, "max_nodes": 1},
    {"max_restarts": 5}, {"dataset": "tatsu-lab/alpaca"}, {"model": "meta-llama/Llama-2-13b-hf"},
    {"rdzv_backend": "c10d"}, {"max_steps": 10},
])
def test_any_change_of_the_job_is_a_new_run(change):
    """Checked against the default job: each changed setting gives a new name and rdzvId."""
    before, after = render(), render(job_settings(**change))
    assert name(after) != name(before)
    assert after["spec"]["elasticPolicy"]["rdzvId"] == name(after)


def test_a_new_image_is_a_new_run():
    """Checked against the same job on another digest: the training code changed."""
    other = IMAGE.replace("a" * 64, "b" * 64)
    assert name(render(image=other)) != name(render())


def test_the_run_name_is_used_everywhere_the_run_is_named():
    """Checked against the rendered object: rdzvId, pod label and NVMe subPath carry the name."""
    job = render()
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    assert pod["metadata"]["labels"]["fsdp-eks/run"] == name(job)
    subpaths = {m.get("subPath") for c in (*pod["spec"]["containers"], *pod["spec"]["initContainers"])
                for m in c["volumeMounts"]}
    assert f"runs/{name(job)}" in subpaths
    assert "@RUN@" not in str(job)


@pytest.mark.parametrize("model, prefix", [
    ("meta-llama/Llama-2-7b-hf", "llama-2-7b-hf-"),
    ("meta-llama/Llama-3.1-8B-Instruct", "llama-3-1-8b-instruct-"),
    ("/fsx/models/7b", "job-7b-"),
    ("someone/" + "A" * 80, "a" * 28 + "-"),
])
def test_names_are_dns_labels_with_room_for_the_pod_suffix(model, prefix):
    """Checked against the operator webhook (DNS-1035) and the 63-character pod/Service names,
    also for a re-run's name (the rendered one plus ``-MMDDhhmmss``)."""
    job = render(job_settings(model=model))
    assert name(job).startswith(prefix), name(job)
    rerun = f"{name(job)}-1231235959"
    assert DNS_1035.fullmatch(rerun) and len(f"{rerun}-worker-99") <= 63


def test_model_slug_never_starts_with_a_digit_or_ends_with_a_dash():
    """Checked against DNS-1035: a label starts with a letter and ends alphanumeric."""
    for model in ("01-ai/Yi-34B", "x/---", "x/9", "org/name-"):
        slug = model_slug(model)
        assert DNS_1035.fullmatch(slug), (model, slug)


def test_elastic_only_when_asked():
    """Checked against docs/design.md#rendezvous-and-the-training-operator: min = max = nodes by default; bounds passed through otherwise."""
    fixed = render()["spec"]["elasticPolicy"]
    assert (fixed["minReplicas"], fixed["maxReplicas"]) == (2, 2)
    elastic = render(dataclasses.replace(JobSettings(), min_nodes=1, max_nodes=4))["spec"]["elasticPolicy"]
    assert (elastic["minReplicas"], elastic["maxReplicas"]) == (1, 4)


def test_job_max_restarts_bounds_both_torchruns_and_the_operators_restarts():
    """Checked against README's job.maxRestarts (torchrun's restarts, PET_MAX_RESTARTS from
    elasticPolicy.maxRestarts; a pod restarted by the operator counts against runPolicy's
    backoffLimit) and the PyTorchJob CRD's field names: the setting's value in both."""
    spec = render(dataclasses.replace(JobSettings(), max_restarts=5))["spec"]
    assert (spec["elasticPolicy"]["maxRestarts"], spec["runPolicy"]["backoffLimit"]) == (5, 5)


def test_without_a_token_no_hf_token_env():
    """Checked against the env list: no Secret name, no HF_TOKEN."""
    env = render(hf_secret=None)["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["env"]
    assert "HF_TOKEN" not in [e["name"] for e in env]


def test_efa_and_gpu_counts_follow_the_job_when_set():
    """Checked against the profile: overrides below the profile's counts are requested as given."""
    job = render(dataclasses.replace(JobSettings(), gpus_per_node=4, efa_per_node=16))
    c = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "4", "vpc.amazonaws.com/efa": "16"}
    assert job["spec"]["nprocPerNode"] == "4"


EVERY_TRAINING_FIELD_CHANGED = {
    "model": "org/some-model", "cache_dir": "/elsewhere", "precision": "fp8", "sdpa_backend": "cudnn",
    "packed_attention": "sdpa", "float8_recipe": "rowwise",
    "loss": "plain", "dataset": "data/train.jsonl", "dataset_split": "validation",
    "data_format": "fields", "prompt_field": "question", "response_field": "answer",
    "prompt_template": "{context}\n\nQ: {question}\nA: ", "val_fraction": 0.1,
    "seq_len": 2048, "mask_prompt": False, "epochs": 3, "max_steps": 5, "batch_size": 2,
    "grad_accum": 4, "seed": 7, "log_every": 5, "eval_every": 50, "learning_rate": 3e-4,
    "warmup_steps": 0,
    "min_lr_ratio": 0.05, "weight_decay": 0.1, "max_grad_norm": 0.5, "sharding": "HYBRID_SHARD",
    "hsdp_shard_size": 4, "activation_checkpointing": "none", "compile": True,
    "collective_timeout_s": 120, "async_checkpoint": False,
    "checkpoint_dir": "/elsewhere/ckpt", "checkpoint_every": 0, "keep_checkpoints": 5,
    "output_dir": "/elsewhere/out", "export_dtype": "fp32", "keep_best": True, "metrics_port": 1234,
    "metrics_file": "/elsewhere/m.jsonl", "node_check": False, "node_check_timeout_s": 60,
    "node_check_gpus": 4, "node_check_efa": 2, "node_check_min_shm_gib": 2.0,
    "node_check_min_busbw_gbs": 1.0, "node_check_min_node_busbw_gbs": 1.0,
}
"""A value other than the package's default for every field of training/config.py."""


def test_the_changed_config_changes_every_field():
    """The table above must keep up with the package: a new flag without a row here fails."""
    defaults = training_config.flat(training_config.JobConfig())
    assert EVERY_TRAINING_FIELD_CHANGED.keys() == defaults.keys()
    assert all(EVERY_TRAINING_FIELD_CHANGED[k] != v for k, v in defaults.items())


@pytest.mark.parametrize("changed", [{}, EVERY_TRAINING_FIELD_CHANGED], ids=["defaults", "every-field"])
def test_the_training_package_parses_the_command(changed):
    """Checked against the training package's own argument parser: the pod's command gives the
    package exactly the job's training settings, none dropped, plus the paths and port the pod
    provides (whatever the stack file said for those)."""
    job = JobSettings(training=training_config.from_fields(changed))
    command = training_command(job, PROFILES["p5"], data_dir="/fsx/runs/r")
    assert command[:5] == ["python", "-m", "training.launch", "-m", "training.finetune"]
    parsed = training_config.flat(config_from_namespace(build_parser().parse_args(training_flags(command))))
    pod_owned = {"checkpoint_dir": "/fsx/runs/r/checkpoints", "output_dir": "/fsx/runs/r/output",
                 "cache_dir": "/mnt/nvme/huggingface", "metrics_port": 9402,
                 "metrics_file": "/fsx/runs/r/metrics.jsonl",
                 **node_check_thresholds(job, PROFILES["p5"])}
    assert parsed == {**training_config.flat(job.training), **pod_owned}


@pytest.mark.parametrize("timeout_s", [None, 90])
def test_nccl_gives_up_on_a_hung_rank_when_the_package_does(timeout_s):
    """Checked against the training package's own --collective-timeout-s (the process-group
    timeout): the pod's NCCL heartbeat timeout is the same number of seconds, with the
    watchdog's async error handling on, so a hung GPU ends the process within that bound."""
    fields = {} if timeout_s is None else {"collective_timeout_s": timeout_s}
    job = job_settings(**fields)
    env = {e["name"]: e.get("value") for e in
           render(job)["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["env"]}
    command = training_command(job, PROFILES["p5"])
    parsed = config_from_namespace(build_parser().parse_args(training_flags(command)))
    assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == str(parsed.parallel.collective_timeout_s)
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert parsed.parallel.collective_timeout_s == (timeout_s or training_config.ParallelConfig().collective_timeout_s)


def test_the_training_readme_shows_the_command_the_pod_runs():
    """training/README.md's example is the command a worker of the p5 stack runs
    (``training_command``, which renders the package's own ``to_argv``), with ``RUN`` for the
    run's name: a changed default, flag or stack file that moves the pod's command fails here."""
    readme = (ROOT / "training" / "README.md").read_text()
    block = readme.split("```bash\n", 1)[1].split("\n```", 1)[0]
    start = block.index(" ".join(LAUNCHER))
    end = block.index("\npython -m training.finetune --help")
    shown = shlex.split(block[start:end].replace(" \\\n", " "))
    settings = parse(raw_settings("p5"))
    pod = training_command(settings.job, settings.profile, data_dir=f"{SHARED_DIR}/runs/RUN")
    assert shown == pod, f"training/README.md should show:\n{shlex.join(pod)}"


def test_the_packages_rules_run_once_per_process_on_each_side(monkeypatch):
    """Counted at the training package's one validation (``JobConfig.problems``): a whole preview
    of the p5 stack under mocks runs it once, when the settings read the stack file (the pod's
    command and the node check's are typed copies of that checked config, not checked again);
    the pod runs it once, when ``training.finetune`` parses that command."""
    checked = []
    problems = training_config.JobConfig.problems
    monkeypatch.setattr(training_config.JobConfig, "problems",
                        lambda cfg: checked.append(cfg) or problems(cfg))
    recording = run_program(stack_config("p5"), "p5-rules-once")
    assert len(checked) == 1, f"preview ran the package's rules {len(checked)} times"
    command = container(job_of(recording))["command"]
    checked.clear()
    parsed = training_config.parse_args(training_flags(command))
    assert checked == [parsed], f"the pod's command line ran the package's rules {len(checked)} times"
