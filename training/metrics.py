"""Speed and progress metrics: one flat dict per step with namespaced, unit-carrying keys.

MFU = tokens/s/GPU x FLOPs/token / peak (the peak: training/hardware.py), with
FLOPs/token = 6 x (parameters without the input-embedding table) + 12 x layers x hidden x seq
(the second term is attention's QK^T and AV matmuls, forward and backward). Recomputation by
activation checkpointing is not counted: MFU measures useful work. This is PaLM's definition
(Chowdhery et al. 2022, appendix B); for Llama-2-7B at sequence 4096 it gives 46.09 GFLOP/token.
"""

from __future__ import annotations

import json
import math
import resource
import sys
import time
from pathlib import Path

import torch

from training.hardware import peak_bf16_flops
from training.shapes import flops_per_token


def model_flops(model: torch.nn.Module, seq_len: int) -> tuple[int, int, float]:
    """(all parameters, input-embedding parameters, training FLOPs per token at `seq_len`) of a
    Hugging Face causal LM; a tensor shared by two modules (tied weights) is counted once."""
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight.numel()
    cfg = model.config
    return total, embedding, flops_per_token(total - embedding, cfg.num_hidden_layers,
                                             cfg.hidden_size, seq_len)


def mfu_pct(tokens_per_s_per_gpu: float, flops_token: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation in percent; None where the peak is unknown (CPU, unknown GPU)."""
    return 100.0 * (tokens_per_s_per_gpu * flops_token / peak) if peak else None


def device_name(device: torch.device) -> str:
    """The GPU's name as torch reports it, or "cpu"."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def dtype_name(dtype: torch.dtype) -> str:
    """"bfloat16" for torch.bfloat16."""
    return str(dtype).removeprefix("torch.")


def peak_flops(device: torch.device) -> float | None:
    """Dense bf16 peak FLOP/s of one device; None on CPU or an unknown GPU (MFU is then null)."""
    return peak_bf16_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


def memory_gib(device: torch.device) -> dict[str, float]:
    if device.type == "cuda":
        return {"memory/max_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30,
                "memory/max_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30}
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024
    return {"memory/max_rss_gib": rss_kib * scale / 2**30}


def perf_metrics(*, tokens: int, step_time_s: float, world_size: int, flops_token: float,
                 peak: float | None) -> dict:
    """The speed of a step of `step_time_s` seconds in which the whole job processed `tokens`
    tokens (global batch x sequence length): the fine-tune's per step, the bench's over the
    mean timed step."""
    tokens_per_s = tokens / step_time_s
    per_gpu = tokens_per_s / world_size
    return {
        "perf/step_time_s": step_time_s,
        "perf/tokens_per_s": tokens_per_s,
        "perf/tokens_per_s_per_gpu": per_gpu,
        "perf/tflops_per_gpu": per_gpu * flops_token / 1e12,
        "perf/mfu_pct": mfu_pct(per_gpu, flops_token, peak),
    }


def step_metrics(*, step: int, epoch: int, loss: float, lr: float, grad_norm: float,
                 tokens: int, step_time_s: float, world_size: int, flops_token: float,
                 peak: float | None, device: torch.device) -> dict:
    """The metrics of one optimizer step.

    tokens: tokens processed by the whole job in this step (global batch x sequence length).
    """
    return {
        "train/step": step,
        "train/epoch": epoch,
        "train/loss": loss,
        "train/lr": lr,
        "train/grad_norm": grad_norm,
        "train/tokens": tokens,
        **perf_metrics(tokens=tokens, step_time_s=step_time_s, world_size=world_size,
                       flops_token=flops_token, peak=peak),
        **memory_gib(device),
        "time/unix_s": time.time(),
    }


def perplexity(loss: float) -> float:
    """exp(mean token loss); infinite where exp overflows a float."""
    return math.exp(loss) if loss < 709 else math.inf


def eval_metrics(*, step: int, epoch: int, loss: float, tokens: int, eval_time_s: float) -> dict:
    """The metrics of one evaluation on the validation set (after optimizer step `step`)."""
    return {
        "eval/step": step,
        "eval/epoch": epoch,
        "eval/loss": loss,
        "eval/perplexity": perplexity(loss),
        "eval/tokens": tokens,
        "eval/time_s": eval_time_s,
        "time/unix_s": time.time(),
    }


def eval_summary(evals: list[dict]) -> dict:
    """The last and the best evaluation of a run; {} without evaluations."""
    if not evals:
        return {}
    best = min(evals, key=lambda m: m["eval/loss"])
    return {
        "summary/eval_loss": evals[-1]["eval/loss"],
        "summary/eval_perplexity": evals[-1]["eval/perplexity"],
        "summary/best_eval_loss": best["eval/loss"],
        "summary/best_eval_step": best["eval/step"],
    }


def summarize(history: list[dict], warmup_steps: int) -> dict:
    """Steady-state means over `history`, skipping its first `warmup_steps` records."""
    if not history:
        return {}
    steady = history[warmup_steps:] or history[-1:]
    mean = lambda key: (math.fsum(h[key] for h in steady) / len(steady)  # noqa: E731
                        if steady[0].get(key) is not None else None)
    return {
        "summary/steps": history[-1]["train/step"],
        "summary/final_loss": history[-1]["train/loss"],
        "summary/steady_steps": len(steady),
        "summary/step_time_s": mean("perf/step_time_s"),
        "summary/tokens_per_s": mean("perf/tokens_per_s"),
        "summary/tokens_per_s_per_gpu": mean("perf/tokens_per_s_per_gpu"),
        "summary/tflops_per_gpu": mean("perf/tflops_per_gpu"),
        "summary/mfu_pct": mean("perf/mfu_pct"),
    }


def _last_byte(path: str) -> bytes:
    """The file's last byte; empty for a missing or empty file."""
    try:
        with open(path, "rb") as f:
            if f.seek(0, 2) == 0:
                return b""
            f.seek(-1, 2)
            return f.read(1)
    except FileNotFoundError:
        return b""


def _strict(value):
    """``value`` with every float that is not finite as None: JSON has no NaN or Infinity
    (Python's json would write the bare words, which jq and JavaScript refuse). The log line
    and the run's error say which it was."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(v) for v in value]
    return value


class JsonLines:
    """Appends one JSON object per line (rank 0 only, strict JSON: a NaN or infinite value is
    null); flushed per line so a crash loses none.

    A writer killed inside a write can leave a last line without its newline; a restarted run
    ends that line first, so the damage stays on one line and every new record parses."""

    def __init__(self, path: str | None):
        self.file = None
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            unfinished = _last_byte(path) not in (b"", b"\n")
            self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115
            if unfinished:
                self.file.write("\n")

    def write(self, record: dict) -> None:
        if self.file:
            self.file.write(json.dumps(_strict(record), allow_nan=False) + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file:
            self.file.close()
