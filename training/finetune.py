"""Fine-tune a Llama-family model with FSDP2: `torchrun ... -m training.finetune --help`.

`run` is the job in its order: the checks that need no GPU (training/preflight.py: paths,
ownership, flags, every record of the data), the node check, the model's download, the data
packed, the model built, resume, the loop (`_train`: step; evaluate and checkpoint when the
evaluator and the checkpointer say they are due; report through the one metrics logger),
export, summary. Each setup step lives with the module that owns it; the ones here build the
model (`build_model`, `parallelize_model`: `training.bench` uses them too). `train_step` is the
whole optimization step. The tests' fault hooks come in through `run`'s ``faults`` argument
only (training/faults.py).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.elastic.multiprocessing.errors import record

from training import faults, hub
from training.attention import check_no_attention_dropout, use_document_mask
from training.checkpoint import EVAL_LOSS_KEY, Checkpointer, TrainerState, checkpointer_for
from training.config import JobConfig, parse_args
from training.dataset import IGNORE_INDEX, PackedData, StepSampler, pack_training_data
from training.dist import (DistEnv, all_sum, batch_to_device, check_locked_memory,
                           init_distributed)
from training.errors import OOM_ADVICE, UserError
from training.evaluation import Evaluator
from training.export import export_hf
from training.faults import Faults
from training.logs import setup_logging
from training.loss import install_loss_forward
from training.metrics import (
    device_name,
    dtype_name,
    model_flops,
    peak_flops,
    step_metrics,
)
from training.model import (allocate, build_meta_model, load_weights, set_sdpa_backend,
                            warn_beyond_context)
from training.node_check import check_job, node_name
from training.optim import build_optimizer, build_scheduler, set_horizon
from training.parallel import DTYPES, Parallelism, build_mesh, compute_dtype, parallelize
from training.preflight import check_inputs
from training.reporting import MetricsLogger
from training.step_queue import StepQueue
from training.termination import Terminated, TerminationRequest, exit_status

log = logging.getLogger("training")


# ----------------------------------------------------------------------------- setup steps
def parallelize_model(cfg: JobConfig, model: nn.Module, env: DistEnv,
                      fsdp_at_world_1: bool = False) -> tuple[DeviceMesh, Parallelism]:
    """A meta-device model -> attention backend, loss forward, AC, compile, fully_shard (local
    mixed precision at world size 1) -> storage for this rank's shards (uninitialised)."""
    set_sdpa_backend(cfg.model.sdpa_backend, env.device)
    document_mask = use_document_mask(cfg.model.packed_attention, env.device, cfg.parallel.compile)
    check_no_attention_dropout(document_mask, model.config)
    install_loss_forward(model, fused=cfg.model.loss == "fused", document_mask=document_mask,
                         compiled=cfg.parallel.compile and env.device.type == "cuda")
    mesh = build_mesh(cfg.parallel, env)
    parallel = parallelize(model, cfg.parallel, mesh,
                           compute_dtype(cfg.model.precision, env.device),
                           float8_recipe=(cfg.model.float8_recipe
                                          if cfg.model.precision == "fp8" else None),
                           fsdp_at_world_1=fsdp_at_world_1)
    allocate(model, env.device)
    return mesh, parallel


def build_model(cfg: JobConfig, model_dir: Path, env: DistEnv) -> tuple[nn.Module, Parallelism]:
    """The model of `model_dir`, ready to train: meta-device model -> `parallelize_model` ->
    load weights; and what `parallelize` did to it."""
    model = build_meta_model(model_dir)
    warn_beyond_context(cfg.data.seq_len, model.config)
    mesh, parallel = parallelize_model(cfg, model, env)
    started = time.perf_counter()
    read = all_sum(load_weights(model, model_dir), env.device)
    log.info("model: %s, mesh %s, wrapped %s; loaded %.1f MB of weights across ranks in %.1f s",
             type(model).__name__, dict(zip(mesh.mesh_dim_names, mesh.shape)), parallel.wrapped,
             read / 2**20, time.perf_counter() - started)
    model.train()
    return model, parallel


# ----------------------------------------------------------------------------- the step
def train_step(model: nn.Module, parallel: Parallelism, optimizer: torch.optim.Optimizer,
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
        parallel.set_requires_gradient_sync(model, i == len(micro_batches) - 1)
        loss = model(*batch)  # summed token loss (training/loss.py)
        if scale is None:
            counted.wait()  # the compute stream waits; the host does not
            targets = targets.clamp(min=1.0)
            scale = (env.world_size / targets).float()
        (loss * scale).backward()
        loss_sum += loss.detach()
    grad_norm = optimizer.clip_and_step(max_grad_norm)  # LocalAdamW or ClippedAdamW
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    dist.all_reduce(loss_sum)
    return (loss_sum / targets).float(), grad_norm


# ----------------------------------------------------------------------------- resume
def _resume(ckpt: Checkpointer | None, model: nn.Module, optimizer: torch.optim.Optimizer,
            state: TrainerState) -> None:
    """Load the latest complete checkpoint, if there is one, once the checkpointer has
    checked what this run changes against the run that wrote it."""
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
    set_horizon(scheduler, total)
    return total


# ----------------------------------------------------------------------------- the loop
@dataclass
class _Run:
    """What the loop works on (keeps `run` readable)."""

    model: nn.Module
    parallel: Parallelism
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    ckpt: Checkpointer | None
    evaluator: Evaluator
    data: PackedData
    sampler: StepSampler
    state: TrainerState
    total: int
    """The last step."""


def _micro_batches(run: _Run, device: torch.device) -> list[tuple[torch.Tensor, ...]]:
    indices, run.state.epoch, run.state.offset = run.sampler.next_step(run.state.epoch,
                                                                       run.state.offset)
    return [batch_to_device(run.data.batch(i), device) for i in indices]


def _queue_step(cfg: JobConfig, run: _Run, queue: StepQueue, step: int, env: DistEnv,
                termination: TerminationRequest) -> dict:
    """Queue optimizer step `step` on the device (nothing waits for the GPU); what the host
    knows of it already: the fields of its metrics record that are not read from the device."""
    if run.ckpt:
        run.ckpt.poll()  # completes a background save once every rank has written it
    lr = run.optimizer.param_groups[0]["lr"]
    start = queue.start()
    loss, grad_norm = train_step(run.model, run.parallel, run.optimizer, run.scheduler,
                                 _micro_batches(run, env.device), cfg.optim.max_grad_norm, env)
    queue.push(step, start, loss, grad_norm, termination.signal or 0)
    tokens = run.sampler.global_batch * cfg.data.seq_len
    run.state.step, run.state.tokens_seen = step, run.state.tokens_seen + tokens
    return {"epoch": run.state.epoch, "lr": lr, "tokens": tokens}


def _stop_if_not_finite(record: dict, ckpt: Checkpointer | None) -> None:
    """A loss or gradient norm that is not finite has already reached the weights (the step
    applied it): stop before they are evaluated or saved, so that every checkpoint on disk stays
    one to resume from. The loss is all-reduced and the norm global, so every rank stops at the
    same step."""
    loss, norm = record["train/loss"], record["train/grad_norm"]
    if math.isfinite(loss) and math.isfinite(norm):
        return
    if ckpt:
        ckpt.close()  # a background save of an earlier step completes
    raise UserError(
        f"step {record['train/step']}: the training loss is {loss} and the gradient norm "
        f"{norm}, so the weights are no longer finite; the run stops without saving them. The "
        "checkpoints written so far are sound: resume from the newest with a lower "
        "--learning-rate (or with --max-grad-norm), or check the model's weights and the data.")


def _stop_on_termination(run: _Run, out: MetricsLogger, step: int, saved: bool,
                         signum: int) -> None:
    """A rank was sent `signum` to stop: save `step` (unless the loop just did), complete the
    save on every rank, and stop (training/termination.py)."""
    if run.ckpt:
        if not saved:
            _save(run, out, step, evaluated=False)
        run.ckpt.close()
    raise Terminated(signum, step, saved=run.ckpt is not None)


def _save(run: _Run, out: MetricsLogger, step: int, evaluated: bool) -> None:
    """Save `step`'s checkpoint (with the eval loss where `step` was just evaluated) and count it."""
    run.ckpt.save(step, run.model, run.optimizer, run.state,
                  {EVAL_LOSS_KEY: run.evaluator.records[-1]["eval/loss"]} if evaluated else {})
    out.checkpoint()


def _train(cfg: JobConfig, run: _Run, out: MetricsLogger, flops_token: float, env: DistEnv,
           faults: Faults | None, termination: TerminationRequest) -> list[dict] | None:
    """The loop: queue a step, then read the step before it (training/step_queue.py: the GPU
    runs the new step meanwhile) and report it. Before a step is evaluated or saved, after the
    last step and at a test's fault stop, every queued step is read first, so that a loss or
    gradient norm that is not finite stops the run before those weights are used
    (`_stop_if_not_finite`). A stop signal seen in a step's numbers stops the run after the newest
    queued step, saved (`_stop_on_termination`). Returns the steps' metrics, or None where a
    test's fault hook stopped the run."""
    peak = peak_flops(env.device)
    history: list[dict] = []
    queue = StepQueue(env.device)
    known: dict[int, dict] = {}  # by step: what `_queue_step` knew on the host
    stop_signal = 0  # the first stop signal seen in a step's numbers (training/termination.py)

    def read(keep: int) -> None:
        nonlocal stop_signal
        while len(queue) > keep:
            result = queue.pop()
            host = known.pop(result.step)
            history.append(step_metrics(
                step=result.step, epoch=host["epoch"], loss=result.loss, lr=host["lr"],
                grad_norm=result.grad_norm, tokens=host["tokens"],
                step_time_s=result.step_time_s, world_size=env.world_size,
                flops_token=flops_token, peak=peak, device=env.device))
            out.step(history[-1])
            _stop_if_not_finite(history[-1], run.ckpt)
            stop_signal = stop_signal or result.stop_signal

    for step in range(run.state.step + 1, run.total + 1):
        known[step] = _queue_step(cfg, run, queue, step, env, termination)
        evaluated = run.evaluator.due(step, run.total, run.state.offset)
        saved = run.ckpt is not None and run.ckpt.due(step, run.total, evaluated)
        fault_stop = faults is not None and faults.stop_after(step, termination.signalled)
        read(keep=0 if evaluated or saved or fault_stop or step == run.total else 1)
        if evaluated:
            out.eval(run.evaluator(run.model, step, run.state.epoch))
        if saved:
            _save(run, out, step, evaluated)
        if fault_stop:
            if run.ckpt:
                run.ckpt.close()
            return None
        if stop_signal:
            read(keep=0)
            _stop_on_termination(run, out, step, saved, stop_signal)
    return history


def run_description(cfg: JobConfig, env: DistEnv, model: nn.Module, parallel: Parallelism) -> dict:
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
        "run/sharding": parallel.strategy(cfg.parallel.sharding),
        "run/activation_checkpointing": cfg.parallel.activation_checkpointing,
        "run/compile": cfg.parallel.compile, "run/sdpa_backend": cfg.model.sdpa_backend,
        "run/packed_attention": ("flex" if use_document_mask(cfg.model.packed_attention, env.device,
                                                             cfg.parallel.compile) else "sdpa"),
        "run/loss": cfg.model.loss, "run/precision": cfg.model.precision,
        "run/float8_recipe": cfg.model.float8_recipe if cfg.model.precision == "fp8" else "none",
        "run/flops_per_token": flops_token,
        "run/torch": torch.__version__, "run/transformers": transformers.__version__,
    }


def run(cfg: JobConfig, env: DistEnv, termination: TerminationRequest,
        faults: Faults | None = None) -> dict:
    """The whole job; returns the summary dict (rank 0's is complete). ``termination``: the
    stop signals' handler, deferred to step boundaries once the loop starts. ``faults``: the tests'
    fault hooks (training/faults.py), None in production."""
    from transformers import AutoTokenizer

    records = check_inputs(cfg, env)  # paths, ownership, flags and data: no GPU needed
    if faults:
        faults.in_setup()
    # the nodes and the fabric, before the model's download
    node_check = check_job(cfg, env, faults.node_probe() if faults else None)
    model_dir = hub.fetch_model(cfg.model.model, cfg.model.cache_dir, cfg.train.seed, env)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    data, val, sampler = pack_training_data(cfg, records, tokenizer, env)
    model, parallel = build_model(cfg, model_dir, env)
    optimizer = build_optimizer(model, cfg.optim, env.device, compiled=cfg.parallel.compile,
                                local=parallel.local)
    scheduler = build_scheduler(optimizer, cfg.optim, total=1)  # the horizon is set after resume
    state = TrainerState(scheduler)
    torch.manual_seed(cfg.train.seed)  # identical RNG on every rank from here on
    ckpt = checkpointer_for(cfg, env, data, faults.files_written if faults else None)
    _resume(ckpt, model, optimizer, state)
    total = _set_horizon(cfg, sampler, state, scheduler)
    evaluator = Evaluator(val, cfg.train.batch_size, cfg.train.eval_every, sampler, env)
    run_ = _Run(model, parallel, optimizer, scheduler, ckpt, evaluator, data, sampler, state,
                total)
    description = run_description(cfg, env, model, parallel)
    log.info("plan: steps %d..%d, %s", state.step + 1, run_.total, json.dumps(description))
    with ExitStack() as stack:
        out = MetricsLogger(cfg, env, stack, state.step, run_.total)
        out.node_check(node_check, node_name())
        termination.defer()  # from the first step on, a stop signal stops at a step boundary
        history = _train(cfg, run_, out, description["run/flops_per_token"], env, faults,
                         termination)
        if history is None:  # stopped by a test's fault hook
            return {}
        if ckpt:
            ckpt.close()  # the last checkpoint is complete before the export and the exit
        best = _export(cfg, model, tokenizer, ckpt, state.step, env)
        return out.summary(history, evaluator.records, best, description)


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
    with TerminationRequest() as termination:  # on every rank before its first collective
        try:
            env = init_distributed(cfg.parallel.collective_timeout_s)
        except Terminated as e:  # during the rendezvous
            print(f"[rank {os.environ.get('RANK', 0)}] {e}", file=sys.stderr)
            return e.exit_status
        return _run_to_status(cfg, env, termination)


def _run_to_status(cfg: JobConfig, env: DistEnv, termination: TerminationRequest) -> int:
    """`run`, and the process's exit status: 0, 1 with one error line, or 128 + the signal
    after SIGTERM or SIGINT (training/termination.py), also where the signal cut a collective
    short."""
    try:
        setup_logging(env)
        run(cfg, env, termination, faults.from_environment(env))
        return 0
    except Terminated as e:
        if env.is_main:
            log.warning("%s", e)
        return e.exit_status
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
    except Exception as e:
        if not termination.signalled:
            raise
        if env.is_local_main:  # e.g. a peer stopped first: the signal is the cause, not the error
            print(f"[rank {env.rank}] stopped on {termination.signal.name} ({type(e).__name__} "
                  "after the signal, as when a peer stopped first); the next start resumes from "
                  "the last complete checkpoint", file=sys.stderr)
        return exit_status(termination.signal)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
