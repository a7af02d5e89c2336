"""Alert delivery: who hears the alerts of ``observability_rules.yaml``.

Alertmanager (part of kube-prometheus-stack) routes every alert of ``observability_rules.yaml`` to
one receiver, ``fsdp-eks``: Slack when the ``alertSlackWebhook`` secret is set, SNS when
``observability.alertSnsTopicArn`` is, or both; the chart's own alerts keep its ``null`` receiver.
The webhook URL never enters Helm values (which a preview diff shows and the release stores): it
lives in a Kubernetes Secret that ``alertmanagerSpec.secrets`` mounts at
``/etc/alertmanager/secrets/<secret>/<key>``, and the Slack config names that file
(``api_url_file``, Alertmanager >= 0.22). SNS publishing signs with the credentials of a Pod Identity
role for Alertmanager's service account whose one permission is ``sns:Publish`` on that topic, and
with the region of the topic's ARN (without one Alertmanager cannot sign: prometheus-operator#5130).
With neither set, preview warns that the alerts reach no one. ``alertmanager_config`` is the whole
configuration (every top-level key of the chart's default, so nothing of that default survives
Helm's merge), and the tests run ``amtool check-config`` and ``amtool config routes test`` on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from components.observability.common import KPS_FULLNAME, MONITORING_NAMESPACE, EksAddonTarget, ObservabilityPart
from components.pod_identity import inline_policy, pod_identity_role

RULES_FILE = Path(__file__).parents[1] / "observability_rules.yaml"
ALERT_RECEIVER = "fsdp-eks"
"""The Alertmanager receiver of every alert in ``observability_rules.yaml``."""
NULL_RECEIVER = "null"
"""The chart's receiver of everything else (its default route): delivered nowhere."""
ALERTMANAGER_SERVICE_ACCOUNT = (MONITORING_NAMESPACE, f"{KPS_FULLNAME}-alertmanager")
SLACK_SECRET = "alertmanager-slack"
SLACK_SECRET_KEY = "webhook-url"
ALERTMANAGER_SECRETS_DIR = "/etc/alertmanager/secrets"
"""Where the operator mounts each ``alertmanagerSpec.secrets`` entry, one folder per Secret."""
SLACK_WEBHOOK_FILE = f"{ALERTMANAGER_SECRETS_DIR}/{SLACK_SECRET}/{SLACK_SECRET_KEY}"


def load_rule_groups() -> dict[str, Any]:
    """The alert rule groups (``{"groups": [...]}``), exactly as promtool reads them."""
    return yaml.safe_load(RULES_FILE.read_text())


def alert_names() -> list[str]:
    """Every alert of ``observability_rules.yaml``, in file order."""
    return [rule["alert"] for group in load_rule_groups()["groups"] for rule in group["rules"] if "alert" in rule]


def sns_region(topic_arn: str) -> str:
    """The region field of an SNS topic ARN (``arn:aws:sns:<region>:<account>:<name>``)."""
    return topic_arn.split(":")[3]


def alert_receiver(*, slack: bool, sns_topic_arn: str | None) -> dict[str, Any] | None:
    """The ``fsdp-eks`` receiver: Slack through the mounted webhook file, SNS through Pod Identity."""
    receiver: dict[str, Any] = {"name": ALERT_RECEIVER}
    if slack:
        receiver["slack_configs"] = [{"api_url_file": SLACK_WEBHOOK_FILE, "send_resolved": True}]
    if sns_topic_arn is not None:
        receiver["sns_configs"] = [{
            "topic_arn": sns_topic_arn,
            "sigv4": {"region": sns_region(sns_topic_arn)},
            "subject": '{{ template "sns.default.subject" . }}',
            "send_resolved": True,
        }]
    return receiver if len(receiver) > 1 else None


def alertmanager_config(*, slack: bool, sns_topic_arn: str | None) -> dict[str, Any]:
    """Alertmanager's whole configuration: our alerts to ``fsdp-eks`` (when it has a target), the
    rest (the chart's own alerts, its Watchdog) to ``null``. No secret in here: Slack's URL is a file."""
    receiver = alert_receiver(slack=slack, sns_topic_arn=sns_topic_arn)
    ours = "|".join(alert_names())
    routes = [{"receiver": NULL_RECEIVER, "matchers": ['alertname = "Watchdog"']}]
    if receiver is not None:
        routes.insert(0, {
            "receiver": ALERT_RECEIVER,
            "matchers": [f'alertname =~ "{ours}"'],
            "group_by": ["alertname", "namespace"],
            # A failing GPU or a stalled run costs node-hours: repeat sooner than the chart's 12h.
            "repeat_interval": "4h",
        })
    return {
        "global": {"resolve_timeout": "5m"},
        # A critical alert silences the warning of the same name and namespace (the chart's default).
        "inhibit_rules": [{
            "source_matchers": ["severity = critical"],
            "target_matchers": ["severity =~ warning|info"],
            "equal": ["namespace", "alertname"],
        }],
        "route": {
            "group_by": ["namespace"],
            "group_wait": "30s",
            "group_interval": "5m",
            "repeat_interval": "12h",
            "receiver": NULL_RECEIVER,
            "routes": routes,
        },
        "receivers": [{"name": NULL_RECEIVER}, *([receiver] if receiver is not None else [])],
        "templates": ["/etc/alertmanager/config/*.tmpl"],
    }


@dataclass(frozen=True, kw_only=True)
class AlertDeliveryArgs:
    """Inputs of ``AlertDelivery``."""

    provider: k8s.Provider
    namespace: k8s.core.v1.Namespace
    sns_topic_arn: str | None = None
    """``observability.alertSnsTopicArn``; None: no SNS delivery."""
    alert_slack_webhook: pulumi.Input[str] | None = None
    """The ``alertSlackWebhook`` Pulumi secret; None: no Slack delivery."""
    eks: EksAddonTarget | None = None
    """The cluster whose Pod Identity signs for SNS (a settings rule requires one with a topic)."""
    ready: Sequence[pulumi.Resource] = field(default_factory=tuple)


class AlertDelivery(ObservabilityPart):
    """The Slack webhook Secret and Alertmanager's SNS role, which ``alertmanager_config`` routes
    to; ``alertmanager_ready``: what Alertmanager must wait for."""

    def __init__(self, name: str, args: AlertDeliveryArgs, opts: pulumi.ResourceOptions):
        super().__init__("fsdp-eks:observability:AlertDelivery", f"{name}-alert-delivery", args.provider, args.ready,
                         opts)
        self.slack_secret = self._slack_secret(name, args)
        self.credentials = self._alertmanager_credentials(name, args)
        self.alertmanager_ready: list[pulumi.Resource] = [
            *([self.slack_secret] if self.slack_secret is not None else []), *self.credentials]
        self.register_outputs({})

    def _slack_secret(self, name: str, args: AlertDeliveryArgs) -> k8s.core.v1.Secret | None:
        """The Slack webhook URL, as the file Alertmanager reads (never in Helm values)."""
        if args.alert_slack_webhook is None:
            return None
        return k8s.core.v1.Secret(
            f"{name}-alertmanager-slack",
            metadata={"name": SLACK_SECRET, "namespace": MONITORING_NAMESPACE},
            type="Opaque",
            string_data={SLACK_SECRET_KEY: pulumi.Output.secret(args.alert_slack_webhook)},
            opts=self.in_cluster(args.namespace),
        )

    def _alertmanager_credentials(self, name: str, args: AlertDeliveryArgs) -> list[pulumi.Resource]:
        """Alertmanager's Pod Identity role: ``sns:Publish`` on the alert topic, nothing else.
        Returns what Alertmanager waits for (none without a topic)."""
        topic = args.sns_topic_arn
        if topic is None:
            return []
        assert args.eks is not None, "an SNS topic needs Pod Identity on a cluster of ours (settings rule)"
        _, credentials = pod_identity_role(
            f"{name}-alertmanager", cluster_name=args.eks.cluster_name,
            service_account=ALERTMANAGER_SERVICE_ACCOUNT, inline=inline_policy(["sns:Publish"], topic),
            parent=self, ready=self.ready, aliases=self.moved,
        )
        return credentials
