"""What runs beside the job: the secrets it needs, observability and checkpoint storage."""

from __future__ import annotations

import re

from components.settings import FSX_THROUGHPUTS_PER_TIB, Problem, Settings, job_node_bounds


def secret_rules(s: Settings) -> list[Problem]:
    problems = []
    if s.job.training.model.model.startswith("meta-llama/") and s.secrets.hf_token is None:
        problems.append(Problem("hfToken", None, f"{s.job.training.model.model} is gated: "
                                "pulumi config set --secret hfToken hf_..."))
    if s.observability.enabled and s.secrets.grafana_admin_password is None:
        problems.append(Problem("grafanaAdminPassword", None,
                                "pulumi config set --secret grafanaAdminPassword <a strong password>"))
    return problems


PROMETHEUS_DURATION = re.compile(r"(\d+(ms|s|m|h|d|w|y))+")
"""A Prometheus duration such as ``15d`` or ``1w3d``."""


def observability_rules(s: Settings) -> list[Problem]:
    o = s.observability
    if not o.enabled:
        return []
    problems = []
    if not PROMETHEUS_DURATION.fullmatch(o.prometheus_retention) or not re.search(r"[1-9]", o.prometheus_retention):
        problems.append(Problem("observability.prometheusRetention", o.prometheus_retention,
                                "give a Prometheus duration such as 15d, 12h or 1w"))
    if o.prometheus_storage_gib < 10:
        problems.append(Problem("observability.prometheusStorageGiB", o.prometheus_storage_gib,
                                "use at least 10 (EBS gp3, GiB)"))
    topic = o.alert_sns_topic_arn
    if topic is not None and not SNS_TOPIC_ARN.fullmatch(topic):
        problems.append(Problem("observability.alertSnsTopicArn", topic,
                                "give an SNS topic ARN such as arn:aws:sns:us-west-2:123456789012:gpu-alerts"))
    if topic is not None and not s.creates_cluster:
        problems.append(Problem("observability.alertSnsTopicArn", topic,
                                "only for a cluster this stack creates (Alertmanager publishes through EKS Pod Identity): "
                                "on an existing cluster use the alertSlackWebhook secret"))
    if o.cloudwatch_container_insights and not s.creates_cluster:
        problems.append(Problem("observability.cloudwatchContainerInsights", True,
                                "only for a cluster this stack creates: on an existing cluster install the "
                                "amazon-cloudwatch-observability add-on yourself, with "
                                "accelerated_compute_metrics false (one DCGM exporter per GPU node)"))
    return problems


SNS_TOPIC_ARN = re.compile(r"arn:aws(-[a-z]+)*:sns:[a-z]{2}(-[a-z]+)+-\d:\d{12}:[A-Za-z0-9_-]{1,256}(\.fifo)?")
"""A standard or FIFO SNS topic ARN; its region is the fourth field (Alertmanager signs for it)."""


def fsx_capacity_valid(gib: int) -> bool:
    """FSx for Lustre PERSISTENT_2 on SSD: 1200 GiB, 2400 GiB, or increments of 2400 GiB.

    (FSx API CreateFileSystem ``StorageCapacity``; 3600 is not a valid size.)
    """
    return gib == 1200 or (gib >= 2400 and gib % 2400 == 0)


def storage_rules(s: Settings) -> list[Problem]:
    st = s.storage
    problems = []
    if st.fsx and st.existing_claim_name is not None:
        problems.append(Problem("storage.existingClaimName", st.existing_claim_name,
                                "use one of storage.fsx (a new FSx for Lustre file system) and "
                                "storage.existingClaimName (a claim you already have)"))
    if st.fsx and not s.creates_cluster:
        problems.append(Problem("storage.fsx", True,
                                "only for a cluster this stack creates (the file system needs its GPU subnet and "
                                "security groups): on an existing cluster create a ReadWriteMany "
                                f"PersistentVolumeClaim in {s.job.namespace} and set storage.existingClaimName"))
    if st.fsx and not fsx_capacity_valid(st.fsx_storage_capacity_gib):
        problems.append(Problem("storage.fsxStorageCapacityGiB", st.fsx_storage_capacity_gib,
                                "FSx for Lustre PERSISTENT_2 takes 1200, 2400 or a multiple of 2400 GiB"))
    if st.fsx and st.fsx_throughput_per_tib not in FSX_THROUGHPUTS_PER_TIB:
        problems.append(Problem("storage.fsxThroughputPerTiB", st.fsx_throughput_per_tib,
                                f"use one of {', '.join(map(str, FSX_THROUGHPUTS_PER_TIB))} (MB/s per TiB, PERSISTENT_2)"))
    most = max(s.job.nodes, job_node_bounds(s.job)[1])
    if most > 1 and not st.shared:
        problems.append(Problem("storage.fsx", st.fsx,
                                f"a job on {most} nodes needs storage every node shares: each node writes its "
                                "checkpoint shards to its own NVMe, so a checkpoint would be scattered across "
                                "nodes and a restarted or resumed run could not load it. Set storage.fsx: true "
                                "(storage.existingClaimName on an existing cluster), or run on one node (job.nodes: 1)"))
    return problems


def no_alert_receiver_warning(s: Settings) -> list[Problem]:
    o = s.observability
    if o.enabled and o.alert_sns_topic_arn is None and s.secrets.alert_slack_webhook is None:
        return [Problem("observability.alertSnsTopicArn", None,
                        "no alert receiver: the GPU and training alerts fire but reach no one. Set it, or "
                        "`pulumi config set --secret alertSlackWebhook https://hooks.slack.com/...`")]
    return []
