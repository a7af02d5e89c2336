"""Stack configuration -> Settings: every validation rule, checked against its error message.

Each case starts from a stack file of the repository (known to be valid), breaks one thing, and
asserts that the error names the key a user has to change. Checked against the field facts of
docs/design.md (reservations, AZs, versions).
"""

from __future__ import annotations

import pytest

from components import versions
from components.settings import Secrets, SettingsError
from components.settings_parser import parse_settings
from tests.harness import SECRETS, parse, settings_error
from tests.harness import raw_settings as raw


def errors(config: dict, secrets: Secrets = SECRETS) -> str:
    return str(settings_error(config, secrets))


@pytest.mark.parametrize("stack", ["p5", "p4de"])
def test_committed_stacks_are_valid(stack):
    """The case where nothing should change: the repository's stack files parse cleanly."""
    settings = parse(raw(stack))
    assert settings.profile_name == stack
    assert settings.gpu_nodes.availability_zone in settings.network.availability_zones


def test_unknown_profile():
    config = raw("p5")
    config["profile"] = "zz9-test"
    message = errors(config)
    assert "fsdp-eks:profile = 'zz9-test'" in message and "p4de, p5" in message


def test_p4de_without_reservation():
    config = raw("p4de")
    del config["gpuNodes"]["capacityReservationId"]
    assert "gpuNodes.capacityReservationId = None: p4de.24xlarge" in errors(config)


def test_malformed_reservation_id():
    config = raw("p4de")
    config["gpuNodes"]["capacityReservationId"] = "reservation-1"
    assert "gpuNodes.capacityReservationId = 'reservation-1'" in errors(config)


def test_capacity_block_without_reservation():
    config = raw("p5")
    config["gpuNodes"]["capacityBlock"] = True
    assert "capacityBlock needs the capacity block's reservation id" in errors(config)


def test_gpu_az_outside_cluster_azs():
    config = raw("p5")
    config["gpuNodes"]["availabilityZone"] = "us-west-2d"
    assert "gpuNodes.availabilityZone = 'us-west-2d'" in errors(config)


@pytest.mark.parametrize(
    "sizes",
    [
        {"minSize": 3, "desiredSize": 2, "maxSize": 4},  # min > desired
        {"minSize": 0, "desiredSize": 3, "maxSize": 2},  # desired > max
        {"minSize": 0, "desiredSize": 0, "maxSize": 0},  # max < 1
    ],
)
def test_gpu_node_counts_out_of_order(sizes):
    config = raw("p5")
    config["gpuNodes"].update(sizes)
    assert "gpuNodes.minSize/desiredSize/maxSize" in errors(config)


def test_system_node_counts_out_of_order():
    config = raw("p5")
    config["cluster"]["systemNodes"] = {"minSize": 2, "desiredSize": 1, "maxSize": 3}
    assert "cluster.systemNodes.minSize/desiredSize/maxSize" in errors(config)


@pytest.mark.parametrize("cidr", ["10.0.0/16", "10.0.0.0/33", "not-a-cidr"])
def test_malformed_cidr(cidr):
    config = raw("p5")
    config["network"]["vpcCidr"] = cidr
    assert f"network.vpcCidr = '{cidr}': give an IPv4 CIDR" in errors(config)


def test_vpc_too_small_for_pods():
    config = raw("p5")
    config["network"]["vpcCidr"] = "10.0.0.0/24"
    assert "network.vpcCidr = '10.0.0.0/24': use a /20 or larger" in errors(config)


def test_one_az_is_not_enough():
    config = raw("p5")
    config["network"]["availabilityZones"] = ["us-west-2c"]
    assert "network.availabilityZones" in errors(config)


@pytest.mark.parametrize("version", ["1.29", "1.32", "latest"])
def test_kubernetes_version_outside_pinned_set(version):
    config = raw("p5")
    config["cluster"]["kubernetesVersion"] = version
    message = errors(config)
    assert f"cluster.kubernetesVersion = '{version}'" in message
    assert all(v in message for v in versions.SUPPORTED_KUBERNETES_VERSIONS)


def test_supported_versions_are_133_or_newer():
    """A pinned Kubernetes version of 1.33 or newer (docs/design.md), add-ons pinned for each."""
    for version, addons in versions.EKS_ADDONS.items():
        assert tuple(map(int, version.split("."))) >= (1, 33)
        assert set(addons) >= {"vpc-cni", "coredns", "kube-proxy", "eks-pod-identity-agent"}


def test_unknown_key_is_named_with_the_known_ones():
    config = raw("p5")
    config["gpuNodes"]["desiredSise"] = 2
    message = errors(config)
    assert "gpuNodes.desiredSise" in message and "desiredSize" in message


def test_wrong_type_is_named():
    config = raw("p5")
    config["gpuNodes"]["maxSize"] = "two"
    assert "gpuNodes.maxSize = 'two': must be a whole number" in errors(config)


@pytest.mark.parametrize("section, key, value, fix", [
    ("job", "sharding", "ZERO3", "use one of FULL_SHARD"),
    ("cluster", "systemNodes", 3, "must be an object"),
])
def test_bad_value_is_reported_not_crashed_on(section, key, value, fix):
    """A value the rules cannot use is named and left out; the other rules still run."""
    config = raw("p5")
    config[section][key] = value
    config["gpuNodes"]["availabilityZone"] = "us-west-2d"
    message = errors(config)
    assert f"{section}.{key} = {value!r}: {fix}" in message
    assert "gpuNodes.availabilityZone = 'us-west-2d'" in message


def test_job_needs_the_nodes_it_asks_for():
    """Without the autoscaler the group stays at desiredSize; with it, pending pods bring nodes
    up to maxSize."""
    config = raw("p5")
    config["job"]["nodes"] = 3
    config["gpuNodes"].update(maxSize=4, scaleDownDelayMinutes=0)
    assert "job.nodes = 3: raise gpuNodes.desiredSize" in errors(config)


def test_gated_model_needs_a_token():
    message = errors(raw("p5"), Secrets(hf_token=None, grafana_admin_password="pw"))
    assert "fsdp-eks:hfToken = None" in message and "--secret" in message


def test_every_problem_is_listed_at_once():
    """One preview lists everything wrong, not the first thing."""
    config = raw("p4de")
    config["network"]["vpcCidr"] = "bad"
    config["cluster"]["kubernetesVersion"] = "1.20"
    config["gpuNodes"]["availabilityZone"] = "eu-west-1a"
    del config["gpuNodes"]["capacityReservationId"]
    config["gpuNodes"]["rootVolumeGib"] = 300  # misspelt key
    config["job"]["epochs"] = "one"  # wrong type
    with pytest.raises(SettingsError) as info:
        parse(config)
    keys = {p.key for p in info.value.problems}
    assert {"network.vpcCidr", "cluster.kubernetesVersion", "gpuNodes.availabilityZone",
            "gpuNodes.capacityReservationId", "gpuNodes.rootVolumeGib", "job.epochs"} <= keys


def test_existing_cluster_skips_network_and_node_rules():
    config = raw("p5")
    config["cluster"]["existingClusterName"] = "research"
    config["storage"] = {"existingClaimName": "checkpoints"}  # storage.fsx needs a cluster of ours
    config["network"] = {}
    config["gpuNodes"] = {}
    settings = parse(config)
    assert not settings.creates_cluster


def test_project_runs_the_pip_virtualenv_runtime():
    """`pulumi up` installs requirements.txt into .venv."""
    from pathlib import Path

    import yaml

    project = yaml.safe_load((Path(__file__).resolve().parents[2] / "Pulumi.yaml").read_text())
    assert project["name"] == "fsdp-eks"
    assert project["runtime"] == {"name": "python", "options": {"toolchain": "pip", "virtualenv": ".venv"}}


def test_project_requires_only_what_every_stack_needs():
    """Checked against Pulumi's project config semantics (pulumi/pulumi
    ValidateStackConfigAndApplyProjectConfig: a key declared in Pulumi.yaml without a default is
    "missing configuration value" on any stack that lacks it) and the settings rules: a key may
    be declared without a default only if the rules refuse every stack without it. The secrets
    are needed only by a gated model (hfToken) and observability (grafanaAdminPassword)."""
    from pathlib import Path

    import yaml

    project = yaml.safe_load((Path(__file__).resolve().parents[2] / "Pulumi.yaml").read_text())
    required = {k for k, v in (project.get("config") or {}).items() if "default" not in v}
    # A stack that needs neither secret: an open model, no observability.
    config = raw("p5")
    config["job"].update(model="NousResearch/Llama-2-7b-hf", modelParameters=6.74,  # an ungated copy
                         activationCheckpointing="full")
    config["observability"] = {"enabled": False}
    parse(config, Secrets())  # valid without either secret
    for key in required:
        without = {k: v for k, v in config.items() if k != key}
        assert key in errors(without, Secrets()), f"Pulumi.yaml requires {key} on every stack; the rules do not"


# ----------------------------------------------------------------------------- the training keys
@pytest.mark.parametrize("key, value, fix", [
    ("seqLen", 4, "must be at least 8"),
    ("warmupSteps", -1, "must be >= 0"),
    ("maxSteps", 0, "must be >= 1 when set"),
    ("learningRate", 1.5, "must be in (0, 1)"),
    ("keepCheckpoints", 0, "must be >= 1"),
    ("hsdpShardSize", 4, "only applies with job.sharding HYBRID_SHARD"),
])
def test_training_keys_are_refused_by_the_packages_own_rules(key, value, fix):
    """Checked against training/config.py's rules, the ones the pod applies: what the pod would
    refuse fails at preview, under the stack key, with the package's reason in stack terms."""
    config = raw("p5")
    config["job"][key] = value
    assert f"job.{key} = {value!r}: {fix}" in errors(config)


def test_what_the_package_accepts_the_stack_accepts():
    """`checkpointEvery: 0` (only at the end) is valid for the package, so for the stack too."""
    config = raw("p5")
    config["job"].update(checkpointEvery=0, maxGradNorm=0.0, weightDecay=0.1)
    job = parse(config).job.training
    assert (job.checkpoint.checkpoint_every, job.optim.max_grad_norm, job.optim.weight_decay) == (0, 0.0, 0.1)


@pytest.mark.parametrize("key", ["checkpointDir", "outputDir", "cacheDir", "metricsPort", "metricsFile"])
def test_paths_and_ports_of_the_pod_are_not_stack_keys(key):
    """The pod's volumes and ports decide these: a value from the stack file would be ignored."""
    config = raw("p5")
    config["job"][key] = "/somewhere"
    assert f"job.{key} = '/somewhere': set by the stack" in errors(config)


@pytest.mark.parametrize("section, key, fix", [
    ("job", "nodes", "must be a whole number"), ("job", "seqLen", "must be a whole number"),
    ("job", "sharding", "use one of FULL_SHARD"), ("gpuNodes", "minSize", "must be a whole number"),
    ("observability", "prometheusRetention", "must be a string"),
])
def test_an_empty_value_is_named_not_a_traceback(section, key, fix):
    """Checked against YAML: ``key:`` with nothing after it is null. Where the key does not take
    null, that is a problem naming it (before: the rules ran on None and raised TypeError/KeyError)."""
    config = raw("p5")
    config[section][key] = None
    assert f"{section}.{key} = None: {fix}" in errors(config)


def test_a_null_is_kept_where_the_key_takes_it():
    """``job.maxSteps: null`` is its default (no step limit), not a problem."""
    config = raw("p5")
    config["job"]["maxSteps"] = None
    assert parse(config).job.training.train.max_steps is None


def test_a_training_key_of_the_wrong_type_is_named_once():
    config = raw("p5")
    config["job"]["seqLen"] = "long"
    message = errors(config)
    assert "job.seqLen = 'long': must be a whole number" in message and message.count("job.seqLen") == 1


def test_float8_is_refused_on_a100_and_accepted_on_h100():
    """Checked against the hardware table: the A100 (p4de) has no float8 matrix units, so the
    preview names job.precision and the fix; the same job on p5 (H100) is accepted."""
    config = raw("p4de")
    config["job"]["precision"] = "fp8"
    message = errors(config)
    assert "job.precision = 'fp8'" in message and "A100" in message and "bf16" in message
    config = raw("p5")
    config["job"]["precision"] = "fp8"
    assert parse(config).job.training.model.precision == "fp8"


# ----------------------------------------------------------------------------- the data keys
def test_default_data_is_the_seeds_samsum():
    """Checked against the seed (llama-recipes' samsum_dataset.py): samsum's dialogue ->
    summary with its prompt 'Summarize this dialog:\\n{dialog}\\n---\\nSummary:\\n', here from
    the script-free knkarthick/samsum mirror, validated by the package's rules."""
    data = parse(raw("p5")).job.training.data
    assert (data.dataset, data.data_format, data.prompt_field, data.response_field) == (
        "knkarthick/samsum", "fields", "dialogue", "summary")
    assert data.prompt_template.format(dialogue="A: hi\nB: bye") == (
        "Summarize this dialog:\nA: hi\nB: bye\n---\nSummary:\n")


def test_own_dataset_drops_the_samsum_mapping():
    """A stack file naming its own dataset gets the package's auto-detection, not samsum's
    fields (which its records would lack); a mapping it gives itself is kept."""
    config = raw("p5")
    config["job"]["dataset"] = "/fsx/data/chat.jsonl"
    data = parse(config).job.training.data
    assert (data.data_format, data.prompt_field, data.prompt_template) == ("auto", None, None)
    config["job"].update(promptField="question", responseField="answer")
    data = parse(config).job.training.data
    assert (data.data_format, data.prompt_field, data.response_field) == (
        "fields", "question", "answer")


@pytest.mark.parametrize("job, key, fix", [
    ({"dataset": "my/data", "promptField": "q"}, "responseField",
     "job.dataFormat fields needs both job.promptField and job.responseField"),
    ({"promptTemplate": "Summarize {dialog}"}, "promptTemplate",
     "must name the prompt field as {dialogue}; it names {dialog}"),
    ({"promptTemplate": "Summarize {dialogue"}, "promptTemplate", "is not a Python format string"),
    ({"promptTemplate": "Summarize {dialogue.upper}"}, "promptTemplate",
     "names {dialogue.upper}: a field's attribute or index is not its text; name the field alone, "
     "e.g. {dialogue}"),
    ({"dataFormat": "chat"}, "promptField", "only applies with job.dataFormat fields"),
    ({"valFraction": 0.5}, "valFraction", "must be in [0, 0.5)"),
    ({"evalEvery": -1}, "evalEvery", "must be >= 0"),
    ({"valFraction": 0.0, "keepBest": True}, "keepBest", "needs a validation set"),
])
def test_data_keys_are_refused_by_the_packages_rules(job, key, fix):
    """Checked against training/config.py's data rules: each mistake is named at preview under
    its stack key, in stack terms."""
    config = raw("p5")
    config["job"].update(job)
    message = errors(config)
    assert f"job.{key} = " in message and fix in message, message


def test_the_data_keys_the_package_accepts_the_stack_accepts():
    """Evaluation every 50 steps, no validation split, and keepBest with evaluation on are all
    valid for the package, so for the stack (the pod always gets a checkpoint directory)."""
    config = raw("p5")
    config["job"].update(evalEvery=50, keepBest=True, valFraction=0.1)
    training = parse(config).job.training
    assert (training.train.eval_every, training.checkpoint.keep_best,
            training.data.val_fraction) == (50, True, 0.1)
    config["job"].update(keepBest=False, valFraction=0.0)
    assert parse(config).job.training.data.val_fraction == 0.0


# ----------------------------------------------------------------------------- stack files gone wrong
def problems_of(config: dict) -> dict[str, list[str]]:
    """Key -> the messages on it, of a config that must be refused."""
    found: dict[str, list[str]] = {}
    for p in settings_error(config).problems:
        found.setdefault(p.key, []).append(str(p))
    return found


@pytest.mark.parametrize("profile", ["zz9-test", "p5.48xlarge", ["p5"], {"name": "p5"}, None])
def test_an_unknown_profile_does_not_hide_the_other_problems(profile):
    """A profile that is no row of the table (or not even a name) is named, and every problem that
    does not depend on the profile is still listed (before: only the profile, or a TypeError for a
    list)."""
    config = raw("p5")
    config["profile"] = profile
    config["network"]["vpcCidr"] = "bad"
    config["job"]["seqLen"] = 4
    config["gpuNodes"]["capacityReservationId"] = "reservation-1"
    found = problems_of(config)
    assert set(found) == {"profile", "network.vpcCidr", "job.seqLen", "gpuNodes.capacityReservationId"}, found
    assert "use one of p4de, p5" in found["profile"][0]


@pytest.mark.parametrize("section, value", [("job", "nodes: 2"), ("gpuNodes", [1, 2]), ("storage", True),
                                            ("network", None)])
def test_a_section_that_is_not_an_object_does_not_hide_the_others(section, value):
    """Checked against YAML: ``fsdp-eks:job: nodes: 2`` on one line is a string, a ``- item`` list
    a list, an empty section null. The section is named; the other sections' rules still run,
    and no rule reports the defaults that stood in for it (``job.nodes`` against the default
    ``gpuNodes.desiredSize``)."""
    config = raw("p5")
    config["cluster"]["kubernetesVersion"] = "1.20"
    config["job"]["nodes"] = 3
    config["gpuNodes"].update(desiredSize=3, maxSize=3)
    config[section] = value
    found = problems_of(config)
    assert section in found and "key: value pairs" in found[section][0], found
    assert "cluster.kubernetesVersion" in found, found
    assert not [k for k in found if k != section and k.startswith(f"{section}.")], found
    if section == "gpuNodes":
        assert "job.nodes" not in found, "compared with the stand-in default desiredSize"
    if value is None:
        assert "is empty" in found[section][0]


@pytest.mark.parametrize("section, key, value", [
    ("storage", "fsx", "yes"),  # YAML 1.2: a string (1.1's yes/no booleans are not Pulumi's)
    ("network", "availabilityZones", "us-west-2a,us-west-2b"),
    ("cluster", "systemNodes", {"minSize": "1", "desiredSize": 2, "maxSize": 3}),
])
def test_a_refused_value_is_named_once(section, key, value):
    """A value of the wrong type is named with its fix, once: not again by a rule that ran on the
    default in its place (``storage.fsx = False: a job on 2 nodes needs ...``), and a nested key
    given with the wrong type is not also 'required'."""
    config = raw("p5")
    config[section][key] = value
    found = problems_of(config)
    assert len([m for messages in found.values() for m in messages]) == 1, found


@pytest.mark.parametrize("section, key, meant", [
    ("job", "seqlen", "did you mean job.seqLen?"),
    ("job", "batch_size", "did you mean job.batchSize?"),
    ("gpuNodes", "desiredSise", "did you mean gpuNodes.desiredSize?"),
    ("gpuNodes", "nodes", "it belongs in job: job.nodes"),
    ("network", "availabilityZone", "it belongs in gpuNodes: gpuNodes.availabilityZone"),
    ("job", "profile", "it belongs at the top level: profile"),
    (None, "prfile", "did you mean profile?"),
    (None, "gpu_nodes", "did you mean gpuNodes?"),
    (None, "nodes", "it belongs in job: job.nodes"),
    (None, "region", "it belongs to the AWS provider: aws:region"),
])
def test_a_misspelt_or_misplaced_key_names_the_key_meant(section, key, meant):
    config = raw("p5")
    (config if section is None else config[section])[key] = 2
    [message] = problems_of(config)[key if section is None else f"{section}.{key}"]
    assert f": unknown key: {meant}" in message, message


TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"
WEBHOOK = "https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXXXXXX"


@pytest.mark.parametrize("section, key, value, secret_key", [
    ("job", "hfToken", TOKEN, "hfToken"),
    ("job", "hf_token", TOKEN, "hfToken"),
    (None, "HF_TOKEN", TOKEN, "hfToken"),
    ("observability", "grafanaAdminPassword", "correct horse battery", "grafanaAdminPassword"),
    ("observability", "alertSlackWebhook", WEBHOOK, "alertSlackWebhook"),
    ("gpuNodes", "slackWebhook", WEBHOOK, None),
    ("job", "apiKey", "sk-123456", None),
    ("job", "notes", f"token {TOKEN}", None),
    ("job", "env", {"HF_TOKEN": "anything"}, None),
])
def test_a_secret_in_the_wrong_place_is_never_printed(section, key, value, secret_key):
    """A secret written into the stack file's plain text (anywhere but a ``--secret`` key) is
    refused without repeating it: the preview's output goes to CI logs. A known secret's key is
    named with the command that stores it encrypted."""
    config = raw("p5")
    (config if section is None else config[section])[key] = value
    message = errors(config)
    assert TOKEN not in message and "hooks.slack.com" not in message and "battery" not in message
    assert "sk-123456" not in message and "anything" not in message
    assert "(not shown)" in message
    if secret_key:
        assert f"pulumi config set --secret {secret_key} <value>" in message


@pytest.mark.parametrize("key, value", [("modelParameters", float("nan")), ("modelParameters", float("inf")),
                                        ("learningRate", float("nan")), ("valFraction", float("-inf"))])
def test_a_number_that_is_not_finite_is_named(key, value):
    """YAML's ``.nan`` and ``.inf`` are floats: refused as such, not compared (every comparison
    with nan is false: a nan parameter count passed the positivity rule and the fit check
    printed 'nan GiB')."""
    config = raw("p5")
    config["job"][key] = value
    message = errors(config)
    assert f"job.{key} = {value!r}: must be a finite number" in message
    assert "nan GiB" not in message and "inf GiB" not in message


def test_an_unquoted_version_is_told_to_be_quoted():
    """YAML reads ``kubernetesVersion: 1.30`` as the float 1.3."""
    config = raw("p5")
    config["cluster"]["kubernetesVersion"] = 1.30
    assert "cluster.kubernetesVersion = 1.3: must be a string: quote it" in errors(config)


@pytest.mark.parametrize("section, key, value", [("job", "maxRestarts", 10**12), ("gpuNodes", "maxSize", 1e300),
                                                 ("job", "seqLen", 2**31)])
def test_a_number_beyond_32_bits_is_named(section, key, value):
    """Kubernetes' int32 fields (a PyTorchJob's maxRestarts, replicas) and AWS API Integers (a node
    group's sizes) take at most 2**31 - 1: beyond, refused at preview, not by the API during `up`."""
    config = raw("p5")
    config[section][key] = value
    assert f"{section}.{key} = {value!r}: must be a whole number of at most 2147483647" in errors(config)


def test_a_stack_without_its_region_is_told_to_set_it():
    """``aws:region`` unset: preview names it (before: a ValueError from the EFA plugin's image
    registry, after the first resources were registered)."""
    with pytest.raises(SettingsError) as info:
        parse_settings(raw("p5"), project="fsdp-eks", stack="p5", region="", secrets=SECRETS)
    [problem] = info.value.problems
    assert str(problem).startswith("(aws:region) = '': set the stack's AWS region: pulumi config set aws:region")


@pytest.mark.parametrize("section, key", [("cluster", "existingClusterName"), ("network", "existingVpcId"),
                                          ("gpuNodes", "capacityReservationId"), ("gpuNodes", "placementGroupName"),
                                          ("observability", "alertSnsTopicArn"), ("storage", "existingClaimName")])
def test_an_empty_optional_name_is_named_once(section, key):
    """``key: ""`` for a key whose unset value is none: one problem on it. Before, an empty
    existingClusterName meant an existing cluster (and refused storage.fsx for it), an empty
    existingVpcId asked for subnets."""
    config = raw("p5")
    config[section][key] = ""
    found = problems_of(config)
    assert found == {f"{section}.{key}": [f"fsdp-eks:{section}.{key} = '': is empty: give a value, or remove "
                                         "the key (unset is none)"]}, found


@pytest.mark.parametrize("section, key, value, meant", [
    (None, "profile", "p5.48xlarge", "p5"), (None, "profile", "P4DE", "p4de"),
    ("job", "sharding", "full_shard", "FULL_SHARD"), ("job", "precision", "BF16", "bf16"),
    ("job", "activationCheckpointing", "Selective", "selective"), ("cluster", "supportType", "extended", "EXTENDED"),
])
def test_a_choice_spelt_otherwise_names_the_one_meant(section, key, value, meant):
    """Checked against the profile table (p5 is p5.48xlarge) and the choices' exact spellings."""
    config = raw("p5")
    (config if section is None else config[section])[key] = value
    dotted = key if section is None else f"{section}.{key}"
    assert f"{dotted} = {value!r}: did you mean {meant}? use one of " in errors(config)


def test_a_key_set_without_path_says_so():
    """Checked against Pulumi's config keys: ``pulumi config set job.nodes 2`` without ``--path``
    stores a top-level key named ``job.nodes`` (a key is ``<namespace>:<name>``, and the name may
    hold dots); ``--path`` sets ``nodes`` inside the ``job`` object."""
    config = raw("p5")
    config["job.nodes"] = 1
    [message] = problems_of(config)["job.nodes"]
    assert "set without --path" in message
    assert "`pulumi config rm job.nodes` and `pulumi config set --path job.nodes <value>`" in message


@pytest.mark.parametrize("section, key, value, unquote", [
    ("job", "nodes", "2", True), ("storage", "fsx", "true", True), ("job", "learningRate", "2e-5", True),
    ("job", "nodes", "2.5", False), ("job", "nodes", "two", False), ("storage", "fsx", "yes", False),
])
def test_a_quoted_number_or_boolean_is_told_to_lose_its_quotes(section, key, value, unquote):
    """YAML reads ``nodes: "2"`` as a string: refused for a number, saying the quotes are the
    problem when the text is one (and only then)."""
    config = raw("p5")
    config[section][key] = value
    [message] = problems_of(config)[f"{section}.{key}"]
    assert message.endswith(": write it without quotes in the stack file") == unquote, message


def test_a_key_of_ours_under_another_namespace_is_named():
    """The program reads only ``fsdp-eks:`` keys: one of ours under a misspelt namespace or a
    provider's is ignored, so preview names it. ``aws:profile`` and ``aws:region`` are the AWS
    provider's own keys (its configuration reference), not ours."""
    others = ["aws:region", "aws:profile", "aws:gpuNodes", "fsdp_eks:job", "fsdpeks:observability", "pulumi:tags"]
    with pytest.raises(SettingsError) as info:
        parse_settings(raw("p5"), project="fsdp-eks", stack="p5", region="us-west-2", secrets=SECRETS,
                       other_keys=others)
    named = {p.key: str(p) for p in info.value.problems}
    assert set(named) == {"(aws:gpuNodes)", "(fsdp_eks:job)", "(fsdpeks:observability)"}, named
    assert named["(aws:gpuNodes)"].endswith("not the project's namespace, so the key is ignored: write fsdp-eks:gpuNodes")
