"""One benchmark JSON under today's key names, for the scripts that read them (table.py,
peer_table.py, report.py): `training.bench` and peer_torchtitan.py write the fine-tune's names
(`run/*`, `perf/*`) for what the fine-tune also reports; the JSONs committed before that
(docs/benchmarks/h200/, h200-peer/) keep their earlier top-level names, renamed here on load."""

import json
from pathlib import Path

RENAMED = {  # earlier name -> the fine-tune's name (finetune.run_description, metrics.py)
    "tokens_per_s_per_gpu": "perf/tokens_per_s_per_gpu",
    "tokens_per_s": "perf/tokens_per_s",
    "mfu_pct": "perf/mfu_pct",
    "flops_per_token": "run/flops_per_token",
    "seq_len": "run/seq_len",
    "gpus": "run/gpus",
    "nodes": "run/nodes",
    "gpu_name": "run/device",
    "activation_checkpointing": "run/activation_checkpointing",
    "compile": "run/compile",
    "sdpa_backend": "run/sdpa_backend",
    "loss": "run/loss",
}


def load(path: str | Path) -> dict:
    """The JSON at `path`, its earlier top-level names renamed."""
    return {RENAMED.get(k, k): v for k, v in json.loads(Path(path).read_text()).items()}
