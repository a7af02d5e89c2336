"""The Prometheus metrics the training job serves: each name as a scrape shows it, and its type.

The one home of these names. ``training.prometheus`` serves them; the Grafana dashboard and the
alert rules of the infrastructure are written against them (``components/dashboards/``,
``components/observability_rules.yaml``), and their tests read this module. Import-light (no
dependency): the infrastructure imports it without the training stack.
"""

from __future__ import annotations

STEP = "fsdp_train_step"
STEPS_TOTAL = "fsdp_train_steps_total"
LOSS = "fsdp_train_loss"
LEARNING_RATE = "fsdp_train_learning_rate"
TOKENS_PER_SECOND = "fsdp_train_tokens_per_second"
TOKENS_PER_SECOND_PER_GPU = "fsdp_train_tokens_per_second_per_gpu"
MFU_RATIO = "fsdp_train_mfu_ratio"
STEP_SECONDS = "fsdp_train_step_seconds"
LAST_CHECKPOINT_TIMESTAMP = "fsdp_train_last_checkpoint_timestamp_seconds"
LAST_STEP_TIMESTAMP = "fsdp_train_last_step_timestamp_seconds"
EVAL_LOSS = "fsdp_train_eval_loss"
EVAL_PERPLEXITY = "fsdp_train_eval_perplexity"
NODE_CHECK_BUSBW = "fsdp_node_check_busbw_gigabytes_per_second"
NODE_CHECK_STORAGE = "fsdp_node_check_storage_megabytes_per_second"
NODE_CHECK_SECONDS = "fsdp_node_check_seconds"

SERVED: dict[str, str] = {
    STEP: "gauge",
    STEPS_TOTAL: "counter",
    LOSS: "gauge",
    LEARNING_RATE: "gauge",
    TOKENS_PER_SECOND: "gauge",
    TOKENS_PER_SECOND_PER_GPU: "gauge",
    MFU_RATIO: "gauge",
    STEP_SECONDS: "gauge",
    LAST_CHECKPOINT_TIMESTAMP: "gauge",
    LAST_STEP_TIMESTAMP: "gauge",
    EVAL_LOSS: "gauge",
    EVAL_PERPLEXITY: "gauge",
    NODE_CHECK_BUSBW: "gauge",
    NODE_CHECK_STORAGE: "gauge",
    NODE_CHECK_SECONDS: "gauge",
}
"""Every metric the job serves -> its Prometheus type (a counter is rated, a gauge is not)."""
