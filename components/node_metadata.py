"""Instance metadata (IMDS) on every node this stack launches: IMDSv2 only, one hop.

With a hop limit of 1 the IMDSv2 token's reply dies one hop out of the host, so a pod in its own
network namespace cannot read the node role's credentials (EKS best practices, "Restrict access to
the instance profile assigned to the worker node"; the AWS SDKs then fall through to the pod's own
credentials). With the former hop limit 2 any pod on a GPU node could act as the node role.

Who still reads IMDS, and how (nodes: system and GPU):

- **Host-network pods** (``aws-node`` with the network policy agent, ``kube-proxy``,
  ``eks-pod-identity-agent``) share the host's namespace: zero hops, unaffected.
- **EBS CSI driver** (EKS add-on): falls back to the Kubernetes API (the node's providerID and
  topology labels) when IMDS does not answer (aws-ebs-csi-driver ``docs/install.md``, "Metadata";
  aws/karpenter-provider-aws#7200, where Karpenter's hop limit 1 meets the driver). Its credentials
  come from Pod Identity (components/observability/metrics_stack.py). That fallback cannot count a
  node's ENIs, so the attach limit it reports is conservative (aws-ebs-csi-driver#2262); only the
  system nodes attach EBS volumes (Prometheus).
- **FSx CSI driver** (Helm): ``NewMetadataService`` falls back to the Kubernetes API for the
  instance id (aws-fsx-csi-driver ``pkg/cloud/metadata.go``, ``metadata_k8s.go``), which carries no
  region, so the chart's ``controller.region`` / ``node.region`` are set (components/storage.py).
  It calls no AWS API for a static volume: no credentials at all.
- **CloudWatch agent** (optional add-on): without IMDS it finds its instance with
  ``ec2:DescribeInstances`` (amazon-cloudwatch-agent#1139, #1149), which
  ``CloudWatchAgentServerPolicy`` lacks: its Pod Identity role gets that one action inline.
- **dcgm-exporter, NVIDIA and EFA device plugins, etcd, the training workers**: no AWS API, no IMDS.
- **Alertmanager** (SNS receiver only): credentials from Pod Identity, region from the topic ARN.
"""

from __future__ import annotations

import pulumi_aws as aws

HOP_LIMIT = 1
"""IMDSv2 replies reach the host only, never a pod's network namespace."""


def metadata_options() -> aws.ec2.LaunchTemplateMetadataOptionsArgs:
    """Launch-template metadata options of every node group: IMDSv2 required, one hop."""
    return aws.ec2.LaunchTemplateMetadataOptionsArgs(
        http_endpoint="enabled",
        http_tokens="required",
        http_put_response_hop_limit=HOP_LIMIT,
    )
