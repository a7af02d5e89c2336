"""Prometheus metrics of the training job, served by local rank 0 of every node.

The names and types are those of ``training.metric_names``, the contract with the dashboard and
the alert rules. Every node exports the job-wide values (loss and throughput are already
all-reduced), so a scrape of any node tells the job's state and
`fsdp_train_last_step_timestamp_seconds` going stale on one node shows that node is stuck.
"""

from __future__ import annotations

import logging
import socket
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from training.errors import UserError
from training.metric_names import (
    EVAL_LOSS,
    EVAL_PERPLEXITY,
    LAST_CHECKPOINT_TIMESTAMP,
    LAST_STEP_TIMESTAMP,
    LEARNING_RATE,
    LOSS,
    MFU_RATIO,
    NODE_CHECK_BUSBW,
    NODE_CHECK_SECONDS,
    NODE_CHECK_STORAGE,
    STEP,
    STEP_SECONDS,
    STEPS_TOTAL,
    TOKENS_PER_SECOND,
    TOKENS_PER_SECOND_PER_GPU,
)

log = logging.getLogger(__name__)


def _port_taken(port: int, e: OSError) -> str:
    return (f"--metrics-port {port}: cannot serve on it on this node ({e.strerror}); another "
            "process listens there: pick another port, or stop that process")


def check_port(port: int) -> str:
    """Refuse (UserError) a --metrics-port this node cannot listen on, at the job's start: the
    server itself starts only with the first step (so that its gauges say nothing stale while
    the model loads). Bound the way prometheus_client's server binds (all addresses, address
    reuse) and closed again; "" where it can."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as e:
            raise UserError(_port_taken(port, e)) from None
    return ""


class TrainingMetrics:
    """The fsdp_train_* gauges and counter on their own registry, served over HTTP."""

    def __init__(self, port: int):
        self.registry = CollectorRegistry()
        r = self.registry
        self.step = Gauge(STEP, "Last completed optimizer step.", registry=r)
        # prometheus_client takes a counter's name without "_total" and serves it with it.
        self.steps = Counter(STEPS_TOTAL.removesuffix("_total"), "Optimizer steps completed by this process.",
                             registry=r)
        self.loss = Gauge(LOSS, "Training loss (mean per target token) of the last step.",
                          registry=r)
        self.lr = Gauge(LEARNING_RATE, "Learning rate of the last step.", registry=r)
        self.tps = Gauge(TOKENS_PER_SECOND, "Tokens per second of the whole job, last step.",
                         registry=r)
        self.tps_gpu = Gauge(TOKENS_PER_SECOND_PER_GPU, "Tokens per second per GPU, last step.",
                             registry=r)
        self.mfu = Gauge(MFU_RATIO, "Model FLOPs utilisation (0..1) of the last step against "
                         "the GPU's dense bf16 peak; 0 where the peak is unknown.", registry=r)
        self.step_seconds = Gauge(STEP_SECONDS, "Wall time of the last optimizer step.",
                                  registry=r)
        self.last_checkpoint = Gauge(LAST_CHECKPOINT_TIMESTAMP,
                                     "Unix time of the last complete checkpoint.", registry=r)
        self.last_step = Gauge(LAST_STEP_TIMESTAMP, "Unix time the last step completed.",
                               registry=r)
        self.eval_loss = Gauge(EVAL_LOSS, "Validation loss (mean per target token over the whole "
                               "validation set) at the last evaluation.", registry=r)
        self.eval_perplexity = Gauge(EVAL_PERPLEXITY, "exp(validation loss) at the last "
                                     "evaluation.", registry=r)
        self.check_busbw = Gauge(
            NODE_CHECK_BUSBW, "Node check at the job's start: bus bandwidth (nccl-tests' "
            "definition) of a collective at the size FSDP moves for one unit of the model; "
            "scope job: over all ranks, node: inside this node.",
            ["collective", "unit", "scope"], registry=r)
        self.check_storage = Gauge(NODE_CHECK_STORAGE, "Node check at the job's start: write "
                                   "and read throughput of the checkpoint directory from this "
                                   "node.", ["direction"], registry=r)
        self.check_seconds = Gauge(NODE_CHECK_SECONDS, "Wall time of the node check at the "
                                   "job's start.", registry=r)
        try:
            self.server, _ = start_http_server(port, registry=r)  # the thread is a daemon
        except OSError as e:  # taken since check_port
            raise UserError(_port_taken(port, e)) from None
        log.info("serving Prometheus metrics on port %d", port)

    def observe_step(self, m: dict) -> None:
        """Update from one record of `metrics.step_metrics`."""
        self.step.set(m["train/step"])
        self.steps.inc()
        self.loss.set(m["train/loss"])
        self.lr.set(m["train/lr"])
        self.tps.set(m["perf/tokens_per_s"])
        self.tps_gpu.set(m["perf/tokens_per_s_per_gpu"])
        self.mfu.set((m["perf/mfu_pct"] or 0.0) / 100.0)
        self.step_seconds.set(m["perf/step_time_s"])
        self.last_step.set(m["time/unix_s"])

    def observe_eval(self, m: dict) -> None:
        """Update from one record of `metrics.eval_metrics`."""
        self.eval_loss.set(m["eval/loss"])
        self.eval_perplexity.set(m["eval/perplexity"])

    def observe_checkpoint(self) -> None:
        self.last_checkpoint.set(time.time())

    def observe_node_check(self, report, node: str) -> None:
        """The figures of `node_check.Report` that concern the whole job and this node."""
        if report is None:  # --no-node-check
            return
        self.check_seconds.set(report.seconds)
        for row in report.bandwidth:
            self.check_busbw.labels(row["collective"], row["unit"], "job").set(row["busbw_gbs"])
        for row in report.node_bandwidth:
            if row["node"] == node:
                self.check_busbw.labels(row["collective"], row["unit"], "node").set(
                    row["busbw_gbs"])
        for result in report.results:
            if result["node"] == node and "write_mbs" in result["values"]:
                self.check_storage.labels("write").set(result["values"]["write_mbs"])
                self.check_storage.labels("read").set(result["values"]["read_mbs"])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class NoMetrics:
    """Stand-in on ranks that serve nothing, or when --metrics-port is 0."""

    def observe_step(self, m: dict) -> None:
        pass

    def observe_eval(self, m: dict) -> None:
        pass

    def observe_checkpoint(self) -> None:
        pass

    def observe_node_check(self, report, node: str) -> None:
        pass

    def close(self) -> None:
        pass
