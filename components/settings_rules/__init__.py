"""The validation rules of the stack's settings: each takes ``Settings`` and returns its problems.

``components/settings_parser.py`` runs every rule of ``RULES`` and reports all problems at once,
and every rule of ``WARNINGS`` for what preview warns about but accepts. The rules live by
concern: the network and cluster, the GPU nodes, the job, its fit in memory, the services beside
it (secrets, observability, storage), and the names that become Kubernetes or AWS names.
The job's training keys are not checked here: the training package's own rules check them
(``training/config.py``), so there is one rule for each, where the pod reads it.
"""

from __future__ import annotations

from collections.abc import Callable

from components.settings import Problem, Settings
from components.settings_rules.cluster import cluster_rules, network_rules, open_endpoint_warning
from components.settings_rules.fit import gpu_memory_rules, host_memory_rules
from components.settings_rules.gpu_nodes import gpu_node_rules
from components.settings_rules.job import (
    context_warning,
    hsdp_straddles_nodes_warning,
    job_rules,
    no_efa_across_nodes_warning,
)
from components.settings_rules.names import name_rules, region_rules
from components.settings_rules.services import (
    no_alert_receiver_warning,
    observability_rules,
    secret_rules,
    storage_rules,
)

Rule = Callable[[Settings], list[Problem]]

WARNINGS: list[Rule] = [open_endpoint_warning, no_alert_receiver_warning, hsdp_straddles_nodes_warning,
                        context_warning, no_efa_across_nodes_warning]
"""What preview warns about but accepts (``settings_parser.settings_warnings``)."""

RULES: list[Rule] = [network_rules, cluster_rules, gpu_node_rules, job_rules, secret_rules,
                     gpu_memory_rules, host_memory_rules, observability_rules, storage_rules, name_rules,
                     region_rules]
