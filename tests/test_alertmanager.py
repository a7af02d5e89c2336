"""Alert delivery (SNS or Slack, README "Observability"), checked by amtool (Alertmanager 0.25, Debian's
`prometheus-alertmanager` package) on the Alertmanager configuration the program renders into
kube-prometheus-stack's values, and on the objects around it (the Slack Secret, the SNS role).

`amtool check-config` parses the configuration as Alertmanager would; `amtool config routes test`
shows the receiver each alert of observability_rules.yaml reaches. Missing amtool skips these
tests on a workstation and fails them under CI (`.ci/run` installs it).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from components import versions
from components.observability.alert_delivery import (
    ALERT_RECEIVER,
    ALERTMANAGER_SERVICE_ACCOUNT,
    NULL_RECEIVER,
    SLACK_SECRET,
    SLACK_SECRET_KEY,
    alert_names,
)
from offline.recording import is_secret_value
from components.settings_parser import settings_warnings
from tests.harness import (
    POD_IDENTITY,
    Recording,
    parse,
    plain,
    raw_settings,
    release,
    require_tool,
    secure,
    settings_error,
    variant,
)

TOPIC = "arn:aws:sns:eu-west-1:111122223333:gpu-alerts"
WEBHOOK = "https://hooks.slack.com/services/T0000/B0000/not-a-real-webhook-secret"


def amtool() -> str:
    return require_tool("amtool", "install Debian's `prometheus-alertmanager` package (.ci/run does)")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)


def render(slack: bool, sns: bool) -> Recording:
    return variant("p5", **({"observability": {"alertSnsTopicArn": TOPIC}} if sns else {}),
                   **({"alertSlackWebhook": secure(WEBHOOK)} if slack else {}))


@pytest.fixture(scope="module", params=[(True, False), (False, True), (True, True)], ids=["slack", "sns", "both"])
def delivery(request) -> tuple[bool, bool, Recording]:
    slack, sns = request.param
    return slack, sns, render(slack, sns)


def kps_values(recording: Recording) -> dict:
    return plain(release(recording, versions.KUBE_PROMETHEUS_STACK).inputs["values"])


def config_file(recording: Recording, tmp_path: Path) -> Path:
    path = tmp_path / "alertmanager.yaml"
    path.write_text(yaml.safe_dump(kps_values(recording)["alertmanager"]["config"], sort_keys=False))
    return path


def route(config: Path, **labels: str) -> list[str]:
    result = run(amtool(), "config", "routes", "test", f"--config.file={config}",
                 *(f"{k}={v}" for k, v in labels.items()))
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.split()


def test_amtool_accepts_the_rendered_configuration(delivery, tmp_path: Path):
    *_, recording = delivery
    result = run(amtool(), "check-config", str(config_file(recording, tmp_path)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_reaches_the_receiver_and_nothing_else_does(delivery, tmp_path: Path):
    """Each alert of observability_rules.yaml routes to `fsdp-eks`; a chart alert, and a name that
    merely starts like one of ours, go to `null` (the regex is anchored by Alertmanager)."""
    *_, recording = delivery
    config = config_file(recording, tmp_path)
    for name in alert_names():
        assert route(config, alertname=name, namespace="training", severity="critical") == [ALERT_RECEIVER], name
    assert route(config, alertname="KubePodCrashLooping", namespace="kube-system") == [NULL_RECEIVER]
    assert route(config, alertname=f"{alert_names()[0]}Extra") == [NULL_RECEIVER]


def test_the_receiver_delivers_where_asked(delivery):
    slack, sns, recording = delivery
    (receiver,) = [r for r in kps_values(recording)["alertmanager"]["config"]["receivers"] if r["name"] == ALERT_RECEIVER]
    assert ("slack_configs" in receiver) == slack and ("sns_configs" in receiver) == sns
    if sns:
        (target,) = receiver["sns_configs"]
        assert target["topic_arn"] == TOPIC and target["sigv4"] == {"region": "eu-west-1"}


def test_slack_webhook_is_a_mounted_secret_file_never_a_value(tmp_path: Path):
    """The webhook reaches Alertmanager as the file of a Secret that alertmanagerSpec.secrets mounts
    (prometheus-operator: /etc/alertmanager/secrets/<secret>/<key>); it is in no Helm value, no
    other input and no export, and the Secret carries it as a Pulumi secret."""
    recording = render(slack=True, sns=False)
    am = kps_values(recording)["alertmanager"]
    (slack,) = next(r for r in am["config"]["receivers"] if r["name"] == ALERT_RECEIVER)["slack_configs"]
    assert slack["api_url_file"] == f"/etc/alertmanager/secrets/{SLACK_SECRET}/{SLACK_SECRET_KEY}"
    assert "api_url" not in slack and SLACK_SECRET in am["alertmanagerSpec"]["secrets"]
    secret = recording.one("kubernetes:core/v1:Secret", "observability-alertmanager-slack")
    assert secret.inputs["metadata"]["namespace"] == "monitoring"
    assert is_secret_value(secret.inputs["stringData"]), "the Secret's data is a Pulumi secret"
    assert plain(secret.inputs["stringData"])[SLACK_SECRET_KEY] == WEBHOOK
    kps = release(recording, versions.KUBE_PROMETHEUS_STACK)
    assert secret.name in kps.dependencies, "Alertmanager may start before its webhook file exists"
    for r in recording.resources:
        if r is not secret:
            assert WEBHOOK not in json.dumps(plain(r.inputs)), f"webhook in plain text in {r.type} {r.name}"
    assert WEBHOOK not in json.dumps(recording.exports)


def test_sns_publishes_through_pod_identity_on_that_topic_only():
    recording = render(slack=False, sns=True)
    (assoc,) = [r for r in recording.of_type(POD_IDENTITY)
                if (r.inputs["namespace"], r.inputs["serviceAccount"]) == ALERTMANAGER_SERVICE_ACCOUNT]
    role = next(r for r in recording.of_type("aws:iam/role:Role") if assoc.inputs["roleArn"].endswith(f":{r.name}"))
    (policy,) = [r for r in recording.of_type("aws:iam/rolePolicy:RolePolicy") if r.inputs["role"] == role.name]
    assert json.loads(policy.inputs["policy"])["Statement"] == [
        {"Effect": "Allow", "Action": ["sns:Publish"], "Resource": TOPIC}]
    assert not [r for r in recording.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
                if r.inputs["role"] == role.name], "Alertmanager's role has a managed policy"
    values = kps_values(recording)["alertmanager"]
    assert values["serviceAccount"]["name"] == ALERTMANAGER_SERVICE_ACCOUNT[1]
    kps = release(recording, versions.KUBE_PROMETHEUS_STACK)
    assert assoc.name in kps.dependencies, "Alertmanager may start before its credentials exist"


def test_without_a_receiver_the_alerts_route_nowhere_and_preview_says_so(recording: Recording, tmp_path: Path):
    """The committed stacks set neither: `null` only, and a warning at preview."""
    config = config_file(recording, tmp_path)
    assert run(amtool(), "check-config", str(config)).returncode == 0
    assert route(config, alertname=alert_names()[0]) == [NULL_RECEIVER]
    assert "observability.alertSnsTopicArn" in [w.key for w in settings_warnings(parse(raw_settings("p5")))]


@pytest.mark.parametrize("topic", ["gpu-alerts", "arn:aws:sqs:us-west-2:111122223333:q",
                                   "arn:aws:sns:us-west-2:1111:gpu-alerts"])
def test_a_bad_topic_arn_is_named(topic: str):
    config = raw_settings("p5")
    config["observability"] = {**config["observability"], "alertSnsTopicArn": topic}
    assert any(p.key == "observability.alertSnsTopicArn" and "SNS topic ARN" in p.fix
               for p in settings_error(config).problems)


def test_a_webhook_in_the_stack_file_is_refused_without_echoing_it():
    config = raw_settings("p5")
    config["observability"] = {**config["observability"], "alertSlackWebhook": WEBHOOK}
    error = settings_error(config)
    assert any(p.key == "observability.alertSlackWebhook" and "--secret alertSlackWebhook" in p.fix
               for p in error.problems)
    assert WEBHOOK not in str(error)
