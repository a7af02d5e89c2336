"""Fine-tune a Llama-family model with FSDP2: `torchrun ... -m training.finetune --help`.

Setup is a list of `build_*` steps (the public ones serve `training.bench` too); `train_step` is
the whole optimization step; `run` is the job as a list of steps: build, resume, the loop
(`_train`: step, log, evaluate, checkpoint), export, summary. Test hooks are environment
variables named FSDP_EKS_TEST_* (see `checkpoint.TEST_KILL_IN_SAVE_ENV` and `TEST_STEP_DELAY_ENV`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.elastic.multiprocessing.errors import record

from training import hub
from training.attention import use_document_mask
from training.checkpoint import EVAL_LOSS_KEY, Checkpointer, TrainerState
from training.config import JobConfig, OptimConfig, flag, parse_args
from training.dataset import (
    IGNORE_INDEX,
    PackedData,
    Records,
    StepSampler,
    eval_rows,
    pack_records,
    prepare,
)
from training.dist import DistEnv, all_sum, check_locked_memory, init_distributed
from training.errors import OOM_ADVICE, UserError
from training.export import export_hf
from training.logs import setup_logging
from training.loss import install_loss_forward
from training.metrics import (
    JsonLines,
    device_name,
    dtype_name,
    eval_metrics,
    eval_summary,
    model_flops,
    peak_flops,
    step_metrics,
    summarize,
)
from training.model import allocate, build_meta_model, load_weights, set_sdpa_backend
from training.node_check import check_job, node_name
from training.optim import build_optimizer, clip_and_step
from training.parallel import (
    DTYPES,
    build_mesh,
    check_precision,
    compute_dtype,
    parallelize,
    set_requires_gradient_sync,
    strategy,
)
from training.prometheus import NoMetrics, TrainingMetrics

log = logging.getLogger("training")

TEST_STEP_DELAY_ENV = "FSDP_EKS_TEST_STEP_DELAY_S"
"""Test hook: sleep this many seconds after every step, so a test can act mid-run."""
TEST_EXIT_AFTER_STEP_ENV = "FSDP_EKS_TEST_EXIT_AFTER_STEP"
"""Test hook: stop cleanly (status 0) right after this step and its checkpoint, like a job
that was stopped; no final checkpoint or export."""


# ----------------------------------------------------------------------------- setup steps
def _file_in_the_way(paths: Sequence[Path]) -> Path | None:
    """The first of ``paths`` that exists and is not a directory (so nothing can be created
    inside it), or None."""
    return next((p for p in paths if p.exists() and not p.is_dir()), None)


def _check_paths(cfg: JobConfig) -> None:
    """Refuse output paths that cannot be used, before any data is read or model built: an
    existing file (or a file among the parents) where a directory must go, a directory where
    the metrics file must go, and --keep-best without checkpoints to choose from."""
    c = cfg.checkpoint
    for name, value in (("checkpoint_dir", c.checkpoint_dir), ("output_dir", c.output_dir)):
        if value is None:
            continue
        path = Path(value).expanduser()
        blocking = _file_in_the_way([path, *path.parents])
        if blocking is not None:
            what = "" if blocking == path else f": {blocking} is a file"
            raise UserError(f"{flag(name)} {value}: exists and is not a directory{what}; give "
                            "a directory path (it is created if missing)")
    metrics = cfg.metrics.metrics_file
    if metrics is not None and Path(metrics).expanduser().is_dir():
        raise UserError(f"--metrics-file {metrics}: is a directory; give a file path")
    blocking = None if metrics is None else _file_in_the_way(Path(metrics).expanduser().parents)
    if blocking is not None:
        raise UserError(f"--metrics-file {metrics}: {blocking} is a file, not a directory; give "
                        "a file path whose directories can be created")
    if c.keep_best and c.checkpoint_dir is None:
        raise UserError("--keep-best: needs --checkpoint-dir (the best checkpoint is kept there "
                        "and exported at the end)")


def _build_records(cfg: JobConfig, env: DistEnv) -> Records:
    """Load, split and check every record, before the model is fetched: a bad record or file
    fails the run in seconds, with the same message on every rank."""
    loaded: dict[str, Records] = {}

    def load() -> str:
        loaded["records"] = prepare(cfg.data, cfg.model.cache_dir)
        return ""

    hub.on_node_leader_first(env, load)  # one process per node fills the datasets cache first
    records = loaded.get("records") or prepare(cfg.data, cfg.model.cache_dir)
    log.info("data: %s format, %d training and %d validation records (validation: %s)",
             records.fmt, len(records.train), len(records.val), records.val_source)
    return records


def _build_data(cfg: JobConfig, records: Records, tokenizer,
                env: DistEnv) -> tuple[PackedData, PackedData | None, StepSampler]:
    """Tokenize and pack the training and validation examples; the order of the training
    rows."""
    chat = records.fmt == "chat"
    data = pack_records(records.train, tokenizer, cfg.data, chat)
    if not len(data):
        raise UserError(f"--dataset: no training example keeps a trained token within --seq-len "
                        f"{cfg.data.seq_len} ({json.dumps(data.stats)}); raise --seq-len")
    log.info("training data: %s", json.dumps(data.stats))
    if data.stats["examples_truncated"]:
        log.warning("%d of %d training examples are longer than --seq-len %d and lose their "
                    "end (%d tokens)", data.stats["examples_truncated"], data.stats["examples"],
                    cfg.data.seq_len, data.stats["tokens_cropped"])
    val = pack_records(records.val, tokenizer, cfg.data, chat) if records.val else None
    if val is not None:
        log.info("validation data: %s", json.dumps(val.stats))
    if val is not None and not len(val):
        log.warning("no validation example keeps a trained token within --seq-len: no "
                    "evaluation")
        val = None
    sampler = StepSampler(len(data), env.world_size, env.rank, cfg.train.batch_size,
                          cfg.train.grad_accum, cfg.train.seed)
    return data, val, sampler


def parallelize_model(cfg: JobConfig, model: nn.Module, env: DistEnv,
                      fsdp_at_world_1: bool = False) -> tuple[DeviceMesh, dict]:
    """A meta-device model -> attention backend, loss forward, AC, compile, fully_shard (local
    mixed precision at world size 1) -> storage for this rank's shards (uninitialised)."""
    set_sdpa_backend(cfg.model.sdpa_backend, env.device)
    install_loss_forward(model, fused=cfg.model.loss == "fused",
                         document_mask=use_document_mask(cfg.model.packed_attention, env.device))
    mesh = build_mesh(cfg.parallel, env)
    wrapped = parallelize(model, cfg.parallel, mesh,
                          compute_dtype(cfg.model.precision, env.device),
                          fp8=cfg.model.precision == "fp8",
                          fsdp_at_world_1=fsdp_at_world_1)
    allocate(model, env.device)
    return mesh, wrapped


def build_model(cfg: JobConfig, model_dir: Path, env: DistEnv) -> nn.Module:
    """The model of `model_dir`, ready to train: meta-device model -> `parallelize_model` ->
    load weights."""
    model = build_meta_model(model_dir)
    mesh, wrapped = parallelize_model(cfg, model, env)
    started = time.perf_counter()
    read = all_sum(load_weights(model, model_dir), env.device)
    log.info("model: %s, mesh %s, wrapped %s; loaded %.1f MB of weights across ranks in %.1f s",
             type(model).__name__, dict(zip(mesh.mesh_dim_names, mesh.shape)), wrapped,
             read / 2**20, time.perf_counter() - started)
    model.train()
    return model


class WarmupCosine:
    """LR factor: linear warm-up to 1 over `warmup` steps, cosine down to `min_ratio` at the
    last step. A callable object, so LambdaLR's state_dict carries its fields."""

    def __init__(self, warmup: int, total: int, min_ratio: float):
        self.warmup, self.total, self.min_ratio = warmup, total, min_ratio

    def __call__(self, done: int) -> float:
        if done < self.warmup:
            return (done + 1) / self.warmup
        progress = min(1.0, (done - self.warmup) / max(1, self.total - self.warmup - 1))
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig,
                    total: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The learning-rate schedule: `WarmupCosine` ending at step `total`."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, WarmupCosine(cfg.warmup_steps, total, cfg.min_lr_ratio))


# ----------------------------------------------------------------------------- the step
def train_step(model: nn.Module, optimizer: torch.optim.Optimizer,
               scheduler: torch.optim.lr_scheduler.LRScheduler,
               micro_batches: list[tuple[torch.Tensor, ...]], max_grad_norm: float,
               env: DistEnv) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step over gradient-accumulation micro-batches; returns (loss, grad norm)
    as 0-d device tensors.

    The loss is the mean over every target token of the global batch. FSDP averages gradients
    over ranks, so each rank scales its token-sum loss by world / global target tokens.
    Gradients are reduced only on the last micro-batch. Nothing here waits for the GPU: the
    token count is summed on the device and the results stay tensors, so the host can queue
    the next step while this one runs (`float()` on a result waits for it).
    """
    targets = torch.stack([(batch[1] != IGNORE_INDEX).sum() for batch in micro_batches]).sum()
    targets = targets.to(torch.float64)
    counted = dist.all_reduce(targets, async_op=True)  # waited for after the first forward
    scale = None
    loss_sum = torch.zeros((), device=env.device)
    for i, batch in enumerate(micro_batches):  # (inputs, labels, position ids)
        set_requires_gradient_sync(model, i == len(micro_batches) - 1)
        loss = model(*batch)  # summed token loss (training/loss.py)
        if scale is None:
            counted.wait()  # the compute stream waits; the host does not
            targets = targets.clamp(min=1.0)
            scale = (env.world_size / targets).float()
        (loss * scale).backward()
        loss_sum += loss.detach()
    grad_norm = clip_and_step(model, optimizer, max_grad_norm)
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    dist.all_reduce(loss_sum)
    return (loss_sum / targets).float(), grad_norm


def evaluate(model: nn.Module, val: PackedData, batch_size: int, env: DistEnv) -> tuple[float,
                                                                                      int]:
    """(mean token loss, target tokens) over the whole validation set: every rank takes every
    world-th row, sums its token losses and counts, and one all-reduce adds them up, so the
    result does not depend on the world size. Eval mode (no dropout), no gradients."""
    model.eval()
    sums = torch.zeros(2, dtype=torch.float64, device=env.device)
    with torch.no_grad():
        for rows in eval_rows(len(val), env.world_size, env.rank, batch_size):
            index = torch.tensor(rows).clamp(min=0)
            labels = val.targets[index].masked_fill(torch.tensor(rows)[:, None] < 0, IGNORE_INDEX)
            batch = (val.inputs[index], labels, *val.batch(index)[2:])
            sums[0] += model(*(t.to(env.device) for t in batch)).double()
            sums[1] += (labels != IGNORE_INDEX).sum().item()
    dist.all_reduce(sums)
    model.train()
    return float(sums[0] / sums[1].clamp(min=1)), int(sums[1])


# ----------------------------------------------------------------------------- resume
def _build_checkpointer(cfg: JobConfig, env: DistEnv) -> Checkpointer | None:
    c = cfg.checkpoint
    if not c.checkpoint_dir:
        log.warning("no --checkpoint-dir: a failure loses all progress of this run")
        return None
    return Checkpointer(c.checkpoint_dir, c.keep_checkpoints, env, async_save=c.async_checkpoint,
                        timeout_s=cfg.parallel.collective_timeout_s, keep_best=c.keep_best)


def _resume(ckpt: Checkpointer | None, model: nn.Module, optimizer: torch.optim.Optimizer,
            state: TrainerState) -> None:
    """Load the latest complete checkpoint, if there is one."""
    latest = ckpt.resume(model, optimizer, state) if ckpt else None
    if latest is not None:
        log.info("resumed from %s (step %d, epoch %d)", latest, state.step, state.epoch)


def _set_horizon(cfg: JobConfig, sampler: StepSampler, state: TrainerState,
                 scheduler: torch.optim.lr_scheduler.LambdaLR) -> int:
    """The last step (--epochs, capped by --max-steps), and the schedule's horizon set to it:
    after the resume, since a new --max-steps or world size moves it."""
    total = state.step + sampler.remaining_steps(state.epoch, state.offset, cfg.train.epochs)
    if cfg.train.max_steps is not None:
        total = min(total, cfg.train.max_steps)
    schedule = scheduler.lr_lambdas[0]
    schedule.total = total
    for group, base_lr in zip(scheduler.optimizer.param_groups, scheduler.base_lrs):
        group["lr"] = base_lr * schedule(scheduler.last_epoch)
    return total


# ----------------------------------------------------------------------------- the loop
@dataclass
class _Run:
    """What the loop works on (keeps `run` readable)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    ckpt: Checkpointer | None
    data: PackedData
    val: PackedData | None
    sampler: StepSampler
    state: TrainerState
    total: int
    """The last step."""
    evals: list[dict] = dataclasses.field(default_factory=list)
    """This process's evaluation records, in order."""


class _Outputs:
    """Where the metrics go: the JSON-lines file (rank 0), Prometheus (one process per node),
    the progress bar and the log (rank 0). Closed by `stack`."""

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
        self.jsonl.write(e)
        self.prom.observe_eval(e)


def _micro_batches(run: _Run, device: torch.device) -> list[tuple[torch.Tensor, ...]]:
    indices, run.state.epoch, run.state.offset = run.sampler.next_step(run.state.epoch,
                                                                       run.state.offset)
    return [tuple(t.to(device, non_blocking=True) for t in run.data.batch(i)) for i in indices]


def _step(cfg: JobConfig, run: _Run, step: int, flops_token: float, peak: float | None,
          env: DistEnv) -> dict:
    """Optimizer step `step`, timed; its metrics."""
    if run.ckpt:
        run.ckpt.poll()  # completes a background save once every rank has written it
    started = time.perf_counter()
    lr = run.optimizer.param_groups[0]["lr"]
    loss, grad_norm = (float(t) for t in train_step(
        run.model, run.optimizer, run.scheduler, _micro_batches(run, env.device),
        cfg.optim.max_grad_norm, env))
    elapsed = time.perf_counter() - started
    tokens = run.sampler.global_batch * cfg.data.seq_len
    run.state.step, run.state.tokens_seen = step, run.state.tokens_seen + tokens
    return step_metrics(step=step, epoch=run.state.epoch, loss=loss, lr=lr, grad_norm=grad_norm,
                        tokens=tokens, step_time_s=elapsed, world_size=env.world_size,
                        flops_token=flops_token, peak=peak, device=env.device)


def _eval_due(cfg: JobConfig, run: _Run, step: int) -> bool:
    """After the last step, and every --eval-every steps (0: at the end of every epoch)."""
    every = cfg.train.eval_every
    return run.val is not None and (step == run.total or (
        step % every == 0 if every else run.sampler.epoch_done(run.state.offset)))


def _evaluate(cfg: JobConfig, run: _Run, env: DistEnv) -> dict:
    started = time.perf_counter()
    loss, tokens = evaluate(run.model, run.val, cfg.train.batch_size, env)
    m = eval_metrics(step=run.state.step, epoch=run.state.epoch, loss=loss, tokens=tokens,
                     eval_time_s=time.perf_counter() - started)
    run.evals.append(m)
    log.info("eval at step %d | loss %.4f | perplexity %.3f | %d tokens | %.1f s",
             run.state.step, loss, m["eval/perplexity"], tokens, m["eval/time_s"])
    return m


def _checkpoint_due(cfg: JobConfig, run: _Run, step: int, evaluated: bool) -> bool:
    """Every --checkpoint-every steps, after the last step, and with --keep-best after every
    evaluation."""
    every = cfg.checkpoint.checkpoint_every
    return run.ckpt is not None and ((every and step % every == 0) or step == run.total
                                     or (evaluated and cfg.checkpoint.keep_best))


def _save(cfg: JobConfig, run: _Run, step: int, evaluated: bool) -> None:
    run.ckpt.save(step, run.model, run.optimizer, run.state, {
        "config": cfg.to_dict(),
        **({EVAL_LOSS_KEY: run.evals[-1]["eval/loss"]} if evaluated else {})})


def _train(cfg: JobConfig, run: _Run, out: _Outputs, flops_token: float,
           env: DistEnv) -> list[dict] | None:
    """The loop: step, log, evaluate, checkpoint. Returns the steps' metrics, or None where
    the test hook TEST_EXIT_AFTER_STEP_ENV stopped the run."""
    peak = peak_flops(env.device)
    delay = float(os.environ.get(TEST_STEP_DELAY_ENV, "0"))
    exit_after = int(os.environ.get(TEST_EXIT_AFTER_STEP_ENV, "0"))
    history: list[dict] = []
    for step in range(run.state.step + 1, run.total + 1):
        history.append(_step(cfg, run, step, flops_token, peak, env))
        out.step(history[-1])
        evaluated = _eval_due(cfg, run, step)
        if evaluated:
            out.eval(_evaluate(cfg, run, env))
        if _checkpoint_due(cfg, run, step, evaluated):
            _save(cfg, run, step, evaluated)
            out.prom.observe_checkpoint()
        if delay:
            time.sleep(delay)
        if step == exit_after:
            if run.ckpt:
                run.ckpt.close()
            log.warning("test hook %s: stopping after step %d", TEST_EXIT_AFTER_STEP_ENV, step)
            return None
    return history


def describe(cfg: JobConfig, env: DistEnv, model: nn.Module) -> dict:
    """What docs/design.md#measuring-speed asks to report beside every speed number (`run/*` keys)."""
    total, embedding, flops_token = model_flops(model, cfg.data.seq_len)
    mcfg = model.config
    global_seqs = env.world_size * cfg.train.batch_size * cfg.train.grad_accum
    import transformers
    return {
        "run/model": cfg.model.model, "run/params": total, "run/params_without_embedding":
        total - embedding, "run/layers": mcfg.num_hidden_layers, "run/hidden": mcfg.hidden_size,
        "run/seq_len": cfg.data.seq_len, "run/gpus": env.world_size, "run/nodes": env.num_nodes,
        "run/device": device_name(env.device),
        "run/tokens_per_gpu_batch": cfg.train.batch_size * cfg.data.seq_len,
        "run/tokens_per_global_batch": global_seqs * cfg.data.seq_len,
        "run/param_dtype": dtype_name(compute_dtype(cfg.model.precision, env.device)),
        "run/reduce_dtype": "float32", "run/optimizer_state_dtype": "float32",
        "run/sharding": strategy(model, cfg.parallel.sharding),
        "run/activation_checkpointing": cfg.parallel.activation_checkpointing,
        "run/compile": cfg.parallel.compile, "run/sdpa_backend": cfg.model.sdpa_backend,
        "run/packed_attention": ("flex" if use_document_mask(cfg.model.packed_attention,
                                                             env.device) else "sdpa"),
        "run/loss": cfg.model.loss, "run/precision": cfg.model.precision,
        "run/flops_per_token": flops_token,
        "run/torch": torch.__version__, "run/transformers": transformers.__version__,
    }


def run(cfg: JobConfig, env: DistEnv) -> dict:
    """The whole job; returns the summary dict (rank 0's is complete)."""
    from transformers import AutoTokenizer

    _check_paths(cfg)
    node_check = check_job(cfg, env)  # the nodes and the fabric, before any download
    check_precision(cfg.model.precision, env.device)
    records = _build_records(cfg, env)
    model_dir = hub.fetch_model(cfg.model.model, cfg.model.cache_dir, cfg.train.seed, env)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    data, val, sampler = _build_data(cfg, records, tokenizer, env)
    model = build_model(cfg, model_dir, env)
    optimizer = build_optimizer(model, cfg.optim, env.device, compiled=cfg.parallel.compile)
    scheduler = build_scheduler(optimizer, cfg.optim, total=1)  # the horizon is set after resume
    state = TrainerState(scheduler)
    torch.manual_seed(cfg.train.seed)  # identical RNG on every rank from here on
    ckpt = _build_checkpointer(cfg, env)
    _resume(ckpt, model, optimizer, state)
    total = _set_horizon(cfg, sampler, state, scheduler)
    run_ = _Run(model, optimizer, scheduler, ckpt, data, val, sampler, state, total)
    description = describe(cfg, env, model)
    log.info("plan: steps %d..%d, %s", state.step + 1, run_.total, json.dumps(description))
    with ExitStack() as stack:
        out = _Outputs(cfg, env, stack, state.step, run_.total)
        out.prom.observe_node_check(node_check, node_name())
        history = _train(cfg, run_, out, description["run/flops_per_token"], env)
        if history is None:  # stopped by the test hook
            return {}
        if ckpt:
            ckpt.close()  # the last checkpoint is complete before the export and the exit
        best = _export(cfg, model, tokenizer, ckpt, state.step, env)
        summary = _summary(history, run_.evals, best, description)
        out.jsonl.write(summary)
        _log_summary(summary)
    return summary


def _export(cfg: JobConfig, model: nn.Module, tokenizer, ckpt: Checkpointer | None, step: int,
            env: DistEnv) -> dict:
    """Write --output-dir: the final weights, or with --keep-best the weights of the checkpoint
    with the lowest validation loss (its step may come from before a restart). Returns the
    summary's keys for it."""
    best = ckpt.best() if ckpt is not None and cfg.checkpoint.keep_best else None
    keys = ({"summary/best_eval_step": best[0], "summary/best_eval_loss": best[2]} if best
            else {})
    if not cfg.checkpoint.output_dir:
        return keys
    if best is not None and best[0] != step:
        problems = ckpt.load_model(best[1], model)
        if problems:  # the weights in memory are still the last step's
            log.warning("--keep-best: the best checkpoint %s cannot be used (%s); exporting the "
                        "last step's weights instead", best[1], "; ".join(problems))
            keys = {}
        else:
            log.info("--keep-best: exporting %s (validation loss %.4f) instead of step %d",
                     best[1], best[2], step)
            step = best[0]
    export_hf(model, tokenizer, cfg.checkpoint.output_dir, DTYPES[cfg.checkpoint.export_dtype],
              env)
    return {**keys, "summary/exported_step": step}


def _summary(history: list[dict], evals: list[dict], best: dict, description: dict) -> dict:
    """The run's summary: steady-state speed (the first steps, up to 10, skipped), the last and
    best evaluation, the export, and the run's description."""
    skip = min(10, max(1, len(history) // 5)) if len(history) > 1 else 0
    return {**summarize(history, skip), **eval_summary(evals), **best, **description}


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


ALLOCATOR_DEFAULTS = "expandable_segments:True"
"""The CUDA caching allocator's default here: segments that grow in place instead of new
fixed-size blocks, so freed activation memory is reused across sizes. Measured on 2 x H200
(Llama-2-7B, batch 3, no AC, compile): reserved 109.6 GiB for 89.3 GiB allocated without it;
docs/performance.md has the run with it."""


def set_runtime_defaults(cfg: JobConfig) -> None:
    """Process-wide defaults, set before CUDA initialises; explicit environment values win.

    - the allocator (ALLOCATOR_DEFAULTS);
    - with --compile and --cache-dir: Inductor's compiled-kernel cache under the cache dir
      (<cache-dir>/torchinductor) instead of /tmp, so a restarted worker (elastic restart, a
      resumed job on the same node-local cache) reuses the compiled blocks instead of
      compiling again; docs/performance.md has the time to first step cold and warm.
    """
    if not (os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")):
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ALLOCATOR_DEFAULTS
    if cfg.parallel.compile and cfg.model.cache_dir:
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR",
                              str(Path(cfg.model.cache_dir).expanduser() / "torchinductor"))


@record
def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    # First, before any download or collective: EFA with too little locked memory fails only
    # deep inside NCCL's first all-reduce.
    memlock = check_locked_memory()
    if memlock is not None:
        print(f"error: {memlock}", file=sys.stderr)
        return 1
    set_runtime_defaults(cfg)
    env = init_distributed(cfg.parallel.collective_timeout_s)
    setup_logging(env)
    try:
        run(cfg, env)
        return 0
    except UserError as e:
        if env.is_main:
            log.error("%s", e)
        elif env.is_local_main:  # one line per node; the other ranks hit the same error
            print(f"[rank {env.rank}] error: {e}", file=sys.stderr)
        return 1
    except torch.cuda.OutOfMemoryError:
        where = (f" on {torch.cuda.get_device_name(env.device)}" if env.device.type == "cuda"
                 else "")
        print(f"[rank {env.rank}] " + OOM_ADVICE.format(where=where), file=sys.stderr)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
