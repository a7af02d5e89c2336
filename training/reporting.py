"""One metrics logger: every number the run reports goes through it to the JSON-lines file
(rank 0), Prometheus (local rank 0 of each node), the progress bar and the log (rank 0), and
it writes the run's summary."""

from __future__ import annotations

import json
import logging
import sys
from contextlib import ExitStack

from training.config import JobConfig
from training.dist import DistEnv
from training.metrics import JsonLines, eval_summary, summarize
from training.prometheus import NoMetrics, TrainingMetrics

log = logging.getLogger("training")


class MetricsLogger:
    """The run's outputs, closed by ``stack``; steps ``first + 1`` .. ``total``."""

    def __init__(self, cfg: JobConfig, env: DistEnv, stack: ExitStack, first: int, total: int):
        from tqdm import tqdm

        self.jsonl = JsonLines(cfg.metrics.metrics_file if env.is_main else None)
        stack.callback(self.jsonl.close)
        self.prom = (TrainingMetrics(cfg.metrics.metrics_port)
                     if cfg.metrics.metrics_port and env.is_local_main else NoMetrics())
        stack.callback(self.prom.close)
        self.bar = tqdm(total=total, initial=first, unit="step", dynamic_ncols=True,
                        file=sys.stderr, disable=not (env.is_main and sys.stderr.isatty()))
        stack.callback(self.bar.close)
        self.total, self.log_every = total, cfg.train.log_every

    def step(self, m: dict) -> None:
        self.jsonl.write(m)
        self.prom.observe_step(m)
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{m['train/loss']:.4f}", tok_s=f"{m['perf/tokens_per_s']:,.0f}")
        if m["train/step"] % self.log_every == 0 or m["train/step"] == self.total:
            log.info(_format(m, self.total))

    def eval(self, e: dict) -> None:
        log.info("eval at step %d | loss %.4f | perplexity %.3f | %d tokens | %.1f s",
                 e["eval/step"], e["eval/loss"], e["eval/perplexity"], e["eval/tokens"],
                 e["eval/time_s"])
        self.jsonl.write(e)
        self.prom.observe_eval(e)

    def checkpoint(self) -> None:
        self.prom.observe_checkpoint()

    def node_check(self, report, node: str) -> None:
        """The node check's figures (`node_check.Report`, None with --no-node-check)."""
        self.prom.observe_node_check(report, node)

    def summary(self, history: list[dict], evals: list[dict], best: dict,
                description: dict) -> dict:
        """The run's summary, written and logged: steady-state speed (the first steps, up to
        10, skipped), the last and best evaluation, the export, and the run's description."""
        skip = min(10, max(1, len(history) // 5)) if len(history) > 1 else 0
        summary = {**summarize(history, skip), **eval_summary(evals), **best, **description}
        self.jsonl.write(summary)
        _log_summary(summary)
        return summary


def _log_summary(summary: dict) -> None:
    if "summary/steps" in summary:  # the run made a step
        mfu = summary["summary/mfu_pct"]
        log.info("done: %d steps, final loss %.4f, %s tokens/s (%s per GPU), MFU %s",
                 summary["summary/steps"], summary["summary/final_loss"],
                 f"{summary['summary/tokens_per_s']:,.0f}",
                 f"{summary['summary/tokens_per_s_per_gpu']:,.0f}",
                 "n/a (no GPU peak)" if mfu is None else f"{mfu:.1f} %")
    if "summary/eval_loss" in summary:
        log.info("validation: final loss %.4f (perplexity %.3f), best %.4f at step %d%s",
                 summary["summary/eval_loss"], summary["summary/eval_perplexity"],
                 summary["summary/best_eval_loss"], summary["summary/best_eval_step"],
                 f"; exported step {summary['summary/exported_step']}"
                 if "summary/exported_step" in summary else "")
    log.info("summary: %s", json.dumps(summary))


def _format(m: dict, total: int) -> str:
    mfu = "n/a" if m["perf/mfu_pct"] is None else f"{m['perf/mfu_pct']:.1f}%"
    mem = m.get("memory/max_allocated_gib", m.get("memory/max_rss_gib"))
    return (f"step {m['train/step']}/{total} | loss {m['train/loss']:.4f} | lr {m['train/lr']:.2e}"
            f" | grad_norm {m['train/grad_norm']:.3f} | {m['perf/tokens_per_s']:,.0f} tok/s"
            f" | {m['perf/tokens_per_s_per_gpu']:,.0f} tok/s/gpu | mfu {mfu}"
            f" | {m['perf/step_time_s']:.3f} s/step | mem {mem:.2f} GiB")
