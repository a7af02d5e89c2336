"""Benchmark the package's own training step on synthetic tokens; one JSON per run.

    torchrun --nproc-per-node 2 -m training.bench --shape llama2-7b --seq-len 4096 \\
        --batch-size 3 --activation-checkpointing none --compile

Every flag of `training.finetune` means the same here (the same `JobConfig`), plus the
benchmark's own (`--shape`, `--bench-steps`, ...; see --help). The model is the one
`training.finetune` builds, with its builders (`parallelize_model`: attention backend, loss
forward, AC, compile, fully_shard; `build_model`, `build_optimizer`, `build_scheduler`) and the
same `train_step`; only the weights (random, or `--model DIR` through the real loading path) and
the data (uniform random token ids) differ. No special fast path. The JSON names what the
fine-tune also reports as it does: `run/*` (`finetune.run_description`), `perf/*`
(`metrics.perf_metrics`); the rest is the bench's own.

Method (docs/design.md#measuring-speed): `--bench-warmup` steps (compilation, allocator growth,
and the GPU's clock settling under its power limit after the compile's idle seconds: on an H200
the first float8 steps after 3 warm-up steps ran ~5 % slower at a ~5 % lower SM clock, and after
10 they did not) are excluded;
then `--bench-steps` steps are timed without a host sync between them (the host queues ahead, as
in `train_step`), with CUDA events at step boundaries for the per-step spread and one wall-clock
interval for the mean. tokens/s/GPU = per-GPU tokens per step / mean step time; MFU = tokens/s/GPU
x FLOPs/token / dense bf16 peak (`training.metrics`). Memory: the allocator's peaks over the timed
steps (max over ranks); model state = memory allocated when the optimizer step starts (fp32
params + fp32 grads + AdamW moments), against 16 B x local parameters.
"""

from __future__ import annotations

import time

_STARTED = time.perf_counter()  # before torch is imported: time to first step counts imports

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

from training import hub, shapes, tiny  # noqa: E402
from training.config import JobConfig, flag, parse_args  # noqa: E402
from training.dist import DistEnv, batch_to_device, init_distributed  # noqa: E402
from training.dataset import PackedData, pack  # noqa: E402
from training.errors import UserError  # noqa: E402
from training.finetune import (build_model, run_description,  # noqa: E402
                               parallelize_model, set_runtime_defaults, train_step)
from training.gc_schedule import GcSchedule  # noqa: E402
from training.gpu_clocks import ClockSampler, per_step  # noqa: E402
from training.logs import setup_logging  # noqa: E402
from training.metrics import peak_flops, perf_metrics  # noqa: E402
from training.optim import build_optimizer, build_scheduler  # noqa: E402
from training.parallel import Parallelism, check_precision  # noqa: E402
from training.model import init_random_, meta_model_from_config  # noqa: E402

log = logging.getLogger("training.bench")

GIB = 2**30
SHAPES: dict[str, dict] = {
    **{name: shape.llama_config() for name, shape in shapes.SHAPES.items()},
    "tiny": {k: tiny.LLAMA_KWARGS[k] for k in (
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "vocab_size")},
}
"""The package's shapes table (training/shapes.py) as LlamaConfig arguments; tiny is the
package's test preset."""
SHAPE_FLAGS = {"layers": "num_hidden_layers", "hidden": "hidden_size",
               "intermediate": "intermediate_size", "heads": "num_attention_heads",
               "kv_heads": "num_key_value_heads", "vocab": "vocab_size"}


def bench_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m training.bench", add_help=False,
        description="Benchmark flags; every training.finetune flag is accepted too.")
    p.add_argument("--shape", choices=sorted(SHAPES),
                   help="random-init model of this shape; unset: load --model (the real path)")
    for name in SHAPE_FLAGS:
        p.add_argument(flag(name), type=int, dest=name,
                       help="override one dimension of --shape (default shape llama2-7b)")
    p.add_argument("--bench-steps", type=int, default=10, help="timed steps (default 10)")
    p.add_argument("--bench-warmup", type=int, default=10,
                   help="untimed steps first, the first one included (default 10: the GPU's "
                        "clock settles under its power limit after the compile's idle seconds)")
    p.add_argument("--out", default="docs/benchmarks", help="directory of the JSON")
    p.add_argument("--tag", default="", help="name of the run (default: from the config)")
    p.add_argument("--memory-fraction", type=float, default=None,
                   help="cap the CUDA caching allocator at this fraction of the GPU "
                        "(torch.cuda.set_per_process_memory_fraction)")
    p.add_argument("--project-world", type=int, default=16,
                   help="world size to project peak memory to (model state / world)")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="after the timed steps, profile this many more (torch.profiler) and "
                        "write rank 0's Chrome trace beside the JSON (.trace.json.gz)")
    p.add_argument("--memory-snapshot", action="store_true",
                   help="after the timed steps, record one more step's allocations with their "
                        "Python stacks (torch.cuda.memory._record_memory_history) and write "
                        "rank 0's snapshot beside the JSON (.memory.pickle; what is live at the "
                        "step's peak: docs/benchmarks/memory_peak.py)")
    p.add_argument("--fsdp-at-world-1", action="store_true",
                   help="keep fully_shard on one GPU (default: local mixed precision there), "
                        "to measure what FSDP costs at world size 1")
    p.add_argument("--checkpoint-cost", metavar="DIR", default=None,
                   help="after the timed steps, measure what one checkpoint of the model and "
                        "optimizer state (DCP, as training/checkpoint.py) costs the steps: "
                        "dcp.save, and dcp.async_save with default and pinned staging, to DIR")
    p.add_argument("--sync-every-step", action="store_true",
                   help="read the loss on the host after every step (as a per-step logger "
                        "would), to measure what that sync costs")
    p.add_argument("--gc-every", type=int, default=0, metavar="N",
                   help="Python's garbage collector: 0 = automatic; N = off after setup and a "
                        "young-generation collection every N steps (training/gc_schedule.py; "
                        "measured to change nothing, docs/performance.md)")
    p.add_argument("--doc-lengths", metavar="MIN:MAX|FILE", default=None,
                   help="packed rows, as the fine-tune packs its records: documents of random "
                        "tokens (<s> ... </s>), lengths drawn uniformly from MIN..MAX tokens or "
                        "from FILE's lengths (one integer per line), packed whole into rows with "
                        "position ids that restart per document (attention per "
                        "--packed-attention). Unset: rows of uniform random tokens, plain causal")
    return p


def document_lengths(spec: str) -> list[int]:
    """The lengths --doc-lengths draws from (each equally likely): MIN:MAX or a file."""
    if ":" in spec and not Path(spec).exists():
        low, _, high = spec.partition(":")
        try:
            lengths = list(range(int(low), int(high) + 1))
        except ValueError:
            lengths = []
    else:
        try:
            lengths = [int(line) for line in Path(spec).read_text().split()]
        except (OSError, ValueError) as e:
            raise UserError(f"--doc-lengths {spec}: not MIN:MAX and not a file of integers "
                            f"({e})") from None
    if not lengths or min(lengths) < 2:
        raise UserError(f"--doc-lengths {spec}: give MIN:MAX with 2 <= MIN <= MAX, or a file "
                        "of lengths >= 2 (a document is <s>, its tokens and </s>)")
    return lengths


BOS_ID, EOS_ID, PAD_ID = 1, 2, 0
"""Special token ids of the packed documents (Llama's); random tokens are drawn above them."""


def packed_rows(gen: torch.Generator, vocab: int, rows: int, seq_len: int,
                lengths: list[int]) -> PackedData:
    """`rows` packed rows of random documents (`dataset.pack`, the fine-tune's packing): each
    document <s>, random tokens, </s>, its length drawn from `lengths`. Documents are drawn
    until the rows are closed (the next document did not fit), so each row ends as a
    fine-tune's row does, in padding."""
    docs, total = [], 0
    while total < (rows + 1) * seq_len:
        n = lengths[int(torch.randint(len(lengths), (1,), generator=gen))]
        body = torch.randint(EOS_ID + 1, vocab, (n - 2,), generator=gen).tolist()
        docs.append(([BOS_ID, *body, EOS_ID], [True] * n))
        total += n
    packed = pack(docs, seq_len, PAD_ID)
    take = slice(0, rows)
    return PackedData(inputs=packed.inputs[take], targets=packed.targets[take],
                      positions=packed.positions[take], documents=packed.documents[take],
                      stats=packed.stats)


def _model_config(args: argparse.Namespace, seq_len: int):
    from transformers import LlamaConfig

    kwargs = dict(SHAPES[args.shape or "llama2-7b"])
    for name, key in SHAPE_FLAGS.items():
        if getattr(args, name) is not None:
            kwargs[key] = getattr(args, name)
    return LlamaConfig(**kwargs, max_position_embeddings=max(4096, seq_len), rms_norm_eps=1e-5,
                       tie_word_embeddings=False, use_cache=False)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _StateProbe:
    """Memory allocated when the optimizer step starts: params + grads (+ AdamW moments)."""

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device):
        self.allocated = None
        self.device = device
        optimizer.register_step_pre_hook(self._hook)

    def _hook(self, *_):
        if self.device.type == "cuda":
            self.allocated = torch.cuda.memory_allocated(self.device)


def _max_over_ranks(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _versions(env: DistEnv) -> dict:
    """Versions beside run/torch and run/transformers."""
    cuda = env.device.type == "cuda"
    out = {"python": platform.python_version(),
           "cuda": torch.version.cuda if cuda else None,
           "cudnn": torch.backends.cudnn.version() if cuda else None,
           "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None}
    try:
        import torchao

        out["torchao"] = torchao.__version__
    except ImportError:
        pass
    return out


def _build_model(args: argparse.Namespace, cfg: JobConfig,
                 env: DistEnv) -> tuple[nn.Module, Parallelism, str]:
    """(model, what `parallelize` did to it, where its weights come from): a random-init model
    of the --shape through `finetune.parallelize_model`, or --model through
    `finetune.build_model`."""
    if args.shape or any(getattr(args, n) is not None for n in SHAPE_FLAGS):
        model = meta_model_from_config(_model_config(args, cfg.data.seq_len))
        _, parallel = parallelize_model(cfg, model, env, fsdp_at_world_1=args.fsdp_at_world_1)
        init_random_(model, cfg.train.seed)
        model.train()
        return model, parallel, f"random init, shape {args.shape or 'custom'}"
    model_dir = hub.fetch_model(cfg.model.model, cfg.model.cache_dir, cfg.train.seed, env)
    model, parallel = build_model(cfg, model_dir, env)
    return model, parallel, f"loaded from {cfg.model.model}"


def _stepper(args: argparse.Namespace, cfg: JobConfig, env: DistEnv, model: nn.Module,
             parallel: Parallelism, optimizer: torch.optim.Optimizer,
             scheduler: torch.optim.lr_scheduler.LRScheduler,
             packing: list[torch.Tensor]) -> Callable[[], tuple]:
    """`finetune.train_step` on fresh random rows (uniform random tokens, or packed documents
    with --doc-lengths; each micro-batch's documents per row are appended to `packing` when a
    step takes it), as a call without arguments.

    Each step's rows are drawn and sent to the device while the step before runs, as the
    fine-tune's rows are packed before its first step: drawing and packing ~40 random documents
    in Python takes the host milliseconds, which the step right after the warm-up's barrier
    (an empty GPU queue) would otherwise wait for."""
    gen = torch.Generator().manual_seed(cfg.train.seed * 1000 + env.rank)
    b, s, vocab = cfg.train.batch_size, cfg.data.seq_len, model.config.vocab_size
    lengths = document_lengths(args.doc_lengths) if args.doc_lengths else None

    def micro_batch() -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
        """(the device batch, documents per row or None for uniform random tokens)."""
        if lengths is None:
            tokens = torch.randint(0, vocab, (b, s + 1), generator=gen)
            return batch_to_device((tokens[:, :-1], tokens[:, 1:]), env.device), None
        rows = packed_rows(gen, vocab, b, s, lengths)
        return batch_to_device(rows.batch(torch.arange(b)), env.device), rows.documents

    def micro_batches() -> list:
        return [micro_batch() for _ in range(cfg.train.grad_accum)]

    ahead = [micro_batches()]

    def step():
        batches = ahead.pop()
        packing.extend(docs for _, docs in batches if docs is not None)
        result = train_step(model, parallel, optimizer, scheduler, [batch for batch, _ in batches],
                            cfg.optim.max_grad_norm, env)
        ahead.append(micro_batches())  # the next step's, while this one runs
        return result

    return step


def _warm_up(args: argparse.Namespace, step: Callable[[], tuple], device: torch.device,
             timings: dict) -> list[torch.Tensor]:
    """The first step (timed: time to first step) and the rest of --bench-warmup; then every
    rank is lined up and the memory peaks are reset. Returns the steps' losses."""
    started = time.perf_counter()
    losses = [step()[0]]
    _sync(device)
    timings["first_step_s"] = time.perf_counter() - started
    timings["time_to_first_step_s"] = time.perf_counter() - _STARTED
    log.info("first step done %.1f s after start: %s", timings["time_to_first_step_s"],
             json.dumps({k: round(v, 2) for k, v in timings.items()}))
    for _ in range(args.bench_warmup - 1):
        losses.append(step()[0])
    _sync(device)
    dist.barrier()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    return losses


def _timed_steps(args: argparse.Namespace, step: Callable[[], tuple], device: torch.device,
                 losses: list[torch.Tensor],
                 collector: GcSchedule) -> tuple[list[float], float, list[dict] | None]:
    """--bench-steps steps without a host sync between them (unless --sync-every-step);
    appends their losses. Returns (each step's time, from CUDA events on a GPU; the wall-clock
    time of all of them; each step's mean SM clock and power where NVML can be read, else
    None: training/gpu_clocks.py)."""
    cuda = device.type == "cuda"
    events = [torch.cuda.Event(enable_timing=True)] if cuda else []
    clocks = ClockSampler(device.index or 0) if cuda else None
    if cuda:
        clocks.start()
        events[0].record()
    stamps = [time.perf_counter()]
    for i in range(args.bench_steps):
        loss, _ = step()
        collector.step(args.bench_warmup + i + 1)
        losses.append(loss)
        if args.sync_every_step:
            float(loss)
        if cuda:
            events.append(torch.cuda.Event(enable_timing=True))
            events[-1].record()
        stamps.append(time.perf_counter())
    _sync(device)
    wall = time.perf_counter() - stamps[0]
    if not cuda:
        return [b - a for a, b in zip(stamps, stamps[1:])], wall, None
    times = [a.elapsed_time(b) / 1e3 for a, b in zip(events, events[1:])]
    samples = clocks.stop()
    return times, wall, (per_step(samples, stamps[0], times) if clocks.available else None)


def _profile(args: argparse.Namespace, cfg: JobConfig, env: DistEnv,
             step: Callable[[], tuple]) -> None:
    """--profile-steps more steps under torch.profiler; rank 0's Chrome trace beside the JSON."""
    from torch.profiler import ProfilerActivity, profile

    cuda = env.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(args.profile_steps):
            step()
        _sync(env.device)
    if env.is_main:
        trace = Path(args.out) / f"{_name(args, cfg, env)}.trace.json.gz"
        trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace))


def _memory_snapshot(args: argparse.Namespace, cfg: JobConfig, env: DistEnv,
                     step: Callable[[], tuple]) -> None:
    """--memory-snapshot: one more step with the allocator's history recorded (Python stacks
    only: C++ stacks slow every allocation down); rank 0's snapshot beside the JSON."""
    _sync(env.device)
    torch.cuda.memory._record_memory_history(max_entries=10**6, stacks="python")
    try:
        step()
        _sync(env.device)
        if env.is_main:
            path = Path(args.out) / f"{_name(args, cfg, env)}.memory.pickle"
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.cuda.memory._dump_snapshot(str(path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def run(args: argparse.Namespace, cfg: JobConfig, env: DistEnv, timings: dict) -> dict:
    """Build as the fine-tune does, warm up, time --bench-steps steps, optionally profile and
    measure a checkpoint; returns the run's record."""
    device = env.device
    if args.memory_fraction is not None and device.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(args.memory_fraction, device)
    check_precision(cfg.model.precision, device)
    started = time.perf_counter()
    model, parallel, source = _build_model(args, cfg, env)
    _sync(device)
    timings["model_s"] = time.perf_counter() - started
    started = time.perf_counter()
    optimizer = build_optimizer(model, cfg.optim, device, compiled=cfg.parallel.compile,
                                local=parallel.local)
    scheduler = build_scheduler(optimizer, cfg.optim, total=10**6)  # warm-up, then flat
    probe = _StateProbe(optimizer, device)
    timings["optimizer_s"] = time.perf_counter() - started
    packing: list[torch.Tensor] = []
    step = _stepper(args, cfg, env, model, parallel, optimizer, scheduler, packing)
    collector = GcSchedule(args.gc_every)
    losses = _warm_up(args, step, device, timings)
    step_times, wall, clocks = _timed_steps(args, step, device, losses, collector)
    collector.close()
    if args.profile_steps:
        _profile(args, cfg, env, step)
    if args.memory_snapshot and device.type == "cuda":
        _memory_snapshot(args, cfg, env, step)
    checkpoint_cost = (_checkpoint_cost(step, model, optimizer, Path(args.checkpoint_cost),
                                        device) if args.checkpoint_cost else None)
    setup = _setup_record(args, cfg, env, model, parallel, source)
    record = {**setup, **_speed_record(args, cfg, env, setup["run/flops_per_token"], step_times,
                                       wall),
              "gpu_clock_per_step": clocks,
              "packed": _packing_record(args, packing),
              "losses": [float(t) for t in losses],
              "memory_gib": _memory(args, env, model, probe,
                                    _state_bytes_per_param(parallel, cfg.train.grad_accum)),
              "time_to_first_step_s": timings["time_to_first_step_s"],
              "startup_s": {k: v for k, v in timings.items() if k != "time_to_first_step_s"},
              "config": cfg.to_dict()}
    if checkpoint_cost is not None:
        record["checkpoint_cost"] = checkpoint_cost
    return record


def _setup_record(args: argparse.Namespace, cfg: JobConfig, env: DistEnv, model: nn.Module,
                  parallel: Parallelism, source: str) -> dict:
    """What was run: the fine-tune's description (`run/*`, `finetune.run_description`) with the
    model's source as run/model, and what only the bench reports."""
    mcfg = model.config
    b, accum = cfg.train.batch_size, cfg.train.grad_accum
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "tag": args.tag,
        "status": "ok",
        **run_description(cfg, env, model, parallel),
        "run/model": source,
        "model": {"shape": args.shape, "intermediate": mcfg.intermediate_size,
                  "heads": mcfg.num_attention_heads, "kv_heads": mcfg.num_key_value_heads,
                  "vocab": mcfg.vocab_size},
        "batch": {"per_gpu_sequences": b * accum, "per_gpu_tokens": b * cfg.data.seq_len * accum,
                  "micro_batch_sequences": b, "grad_accum": accum,
                  "global_sequences": b * accum * env.world_size},
        "precision": {"master_params": "float32"},
        "allocator": os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get(
            "PYTORCH_ALLOC_CONF"),
        "strategy": parallel.strategy(cfg.parallel.sharding),
        "wrapped": parallel.wrapped,
        "sync_every_step": args.sync_every_step,
        "gc_every": args.gc_every,
        "memory_fraction": args.memory_fraction,
        "versions": _versions(env),
        "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCHINDUCTOR_CACHE_DIR",
                                               "CUDA_VISIBLE_DEVICES", "NCCL_MAX_CTAS")},
        "steps": {"warmup": args.bench_warmup, "timed": args.bench_steps},
    }


def _speed_record(args: argparse.Namespace, cfg: JobConfig, env: DistEnv, flops_token: float,
                  step_times: list[float], wall: float) -> dict:
    """The fine-tune's `perf/*` metrics (`metrics.perf_metrics`) of the mean timed step (the
    wall-clock time of all over their number), and the spread of the steps."""
    peak = peak_flops(env.device)
    tokens = cfg.train.batch_size * cfg.data.seq_len * cfg.train.grad_accum * env.world_size
    return {
        "peak_flops": peak,
        **perf_metrics(tokens=tokens, step_time_s=wall / args.bench_steps,
                       world_size=env.world_size, flops_token=flops_token, peak=peak),
        "step_time_s": {"median": statistics.median(step_times), "min": min(step_times),
                        "max": max(step_times), "stdev": statistics.pstdev(step_times),
                        "max_over_median": max(step_times) / statistics.median(step_times)},
        "step_times_s": step_times,
    }


def _packing_record(args: argparse.Namespace, packing: list[torch.Tensor]) -> dict | None:
    """What the packed rows held (None without --doc-lengths): documents per row and the
    padding, over every micro-batch the run drew."""
    if not packing:
        return None
    docs = torch.cat(packing).double()
    return {"doc_lengths": args.doc_lengths,
            "documents_per_row": {"mean": float(docs.mean()), "min": int(docs.min()),
                                  "max": int(docs.max())},
            "micro_batches": len(packing)}


def _checkpoint_cost(step, model, optimizer, where: Path, device: torch.device) -> dict:
    """What one checkpoint costs the training steps (docs/performance.md, the checkpoint
    cost), with the DCP calls of
    training/checkpoint.py (model and optimizer state dicts of `get_*_state_dict`).

    sync: the step that saves with `dcp.save` minus a plain step (the median of 5). async: the
    time `dcp.async_save` blocks (the state staged into CPU memory), plus what the steps run
    during the background write lose against the plain step (`_async_save_costs`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         get_optimizer_state_dict)

    def state() -> dict:
        return {"model": get_model_state_dict(model),
                "optimizer": get_optimizer_state_dict(model, optimizer)}

    base = statistics.median(_synced_step_times(step, device, 5))
    out: dict = {"state_gib_per_rank": _local_bytes(state()) / GIB, "plain_step_s": base,
                 "dir": str(where)}
    started = time.perf_counter()
    step()
    dcp.save(state(), checkpoint_id=str(where / "sync"))
    _sync(device)
    out["sync"] = {"blocked_s": time.perf_counter() - started - base}
    log.info("checkpoint cost: %s", json.dumps(out))
    shutil.rmtree(where / "sync", ignore_errors=True)
    out.update(_async_save_costs(step, state, where, device, base))
    return out


def _async_save_costs(step, state: Callable[[], dict], where: Path, device: torch.device,
                      base: float) -> dict:
    """Variant -> what one `dcp.async_save` of ``state()`` costs against the plain step ``base``.
    Three variants: the default stager (a blocking copy to pageable memory), and a pinned-memory
    stager with non-blocking copies, kept across saves as a job would (its first save allocates
    the pinned buffers, the second is the steady state)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    out: dict = {}
    cuda = device.type == "cuda"  # pinned memory and non-blocking copies need a GPU
    stager = DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                          use_async_staging=True, use_non_blocking_copy=cuda))
    for name, kwargs in (("async_pinned_first", {"async_stager": stager}),
                         ("async_pinned", {"async_stager": stager}),
                         ("async_default_staging", {})):
        step()
        _sync(device)
        started = time.perf_counter()
        response = dcp.async_save(state(), checkpoint_id=str(where / name), **kwargs)
        staging = getattr(response, "staging_completion", None)
        upload = getattr(response, "upload_completion", response)
        if staging is not None:  # the next optimizer step must not change what is staged
            staging.result()
        blocked = time.perf_counter() - started
        during = []
        while not upload.done():
            during += _synced_step_times(step, device, 1)
        upload.result()
        out[name] = {"blocked_s": blocked, "write_s": time.perf_counter() - started,
                     "steps_during_write": len(during),
                     "step_during_write_median_s": statistics.median(during) if during else None,
                     "lost_during_write_s": sum(d - base for d in during),
                     "cost_s": blocked + sum(d - base for d in during)}
        log.info("checkpoint cost %s: %s", name, json.dumps(out[name]))
        shutil.rmtree(where / name, ignore_errors=True)
    stager.close()
    return out


def _synced_step_times(step, device: torch.device, n: int) -> list[float]:
    """The wall-clock seconds of ``n`` calls of ``step``, each up to the device's sync."""
    out = []
    for _ in range(n):
        started = time.perf_counter()
        step()
        _sync(device)
        out.append(time.perf_counter() - started)
    return out


def _local_bytes(tree) -> int:
    """The bytes this rank holds of a (nested) state dict: a DTensor's local shard only."""
    if isinstance(tree, dict):
        return sum(_local_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(_local_bytes(v) for v in tree)
    if isinstance(tree, torch.Tensor):
        t = tree.to_local() if isinstance(tree, DTensor) else tree
        return t.numel() * t.element_size()
    return 0


def _state_bytes_per_param(parallel: Parallelism, grad_accum: int) -> int:
    """Bytes per parameter held when the optimizer step starts: fp32 weights and AdamW moments
    (12), and the gradients: fp32 under FSDP and plain fp32 (4); under the local mixed precision
    the bf16 gradients of one micro-batch (2) or their fp32 sum (4), beside no bf16 copies (the
    backward dropped them: `parallel.LocalMixedPrecision`)."""
    return 14 if parallel.local is not None and grad_accum == 1 else 16


def _memory(args: argparse.Namespace, env: DistEnv, model: nn.Module, probe: _StateProbe,
            bytes_per_param: int) -> dict | None:
    """The allocator's peaks since the warm-up (max over ranks), model state against
    `bytes_per_param` x params / world, and the peak projected to --project-world GPUs: model
    state shrinks as world / project, activations and transients stay. None without a GPU."""
    device = env.device
    if device.type != "cuda":
        return None
    peak_alloc, peak_reserved, state = _max_over_ranks(
        [torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device),
         probe.allocated or 0], device)
    local_params = sum((p.to_local() if isinstance(p, DTensor) else p).numel()
                       for p in model.parameters())
    formula_state = bytes_per_param * sum(p.numel() for p in model.parameters()) / env.world_size
    shrink = state * (1 - env.world_size / args.project_world)
    return {
        "peak_allocated": peak_alloc / GIB, "peak_reserved": peak_reserved / GIB,
        "model_state_measured": state / GIB,
        "model_state_expected_local": bytes_per_param * local_params / GIB,
        "model_state_formula": formula_state / GIB,
        "model_state_error_pct": 100.0 * (state - formula_state) / formula_state,
        "activations_and_transients": (peak_alloc - state) / GIB,
        "project_world": args.project_world,
        "projected_model_state": (state - shrink) / GIB,
        "projected_peak_allocated": (peak_alloc - shrink) / GIB,
        "projected_peak_reserved": (peak_reserved - shrink) / GIB,
    }


def _name(args: argparse.Namespace, cfg: JobConfig, env: DistEnv) -> str:
    if args.tag:
        return args.tag
    shape = args.shape or Path(cfg.model.model).name
    return (f"{shape}-s{cfg.data.seq_len}-b{cfg.train.batch_size}x{cfg.train.grad_accum}"
            f"-ac{cfg.parallel.activation_checkpointing}"
            f"-{'compile' if cfg.parallel.compile else 'eager'}-{cfg.parallel.sharding}"
            f"-{env.world_size}gpu")


def _replayable(argv: list[str]) -> list[str]:
    """The run's flags without the ones that name its outputs or add profiling."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--tag", "--out", "--profile-steps", "--memory-fraction"):
            skip = True
        elif not a.startswith(("--tag=", "--out=", "--profile-steps=", "--memory-fraction=")):
            out.append(a)
    return out


def write(record: dict, out: str, name: str) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
    path = Path(out) / f"{name}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def _log_record(name: str, record: dict, path: Path) -> None:
    """One line for the run written to ``path``: its speed, memory and time to the first step,
    or its status when it did not finish."""
    if record["status"] != "ok":
        log.error("%s: %s -> %s", name, record["status"], path)
        return
    mem = record["memory_gib"] or {}
    mfu = record["perf/mfu_pct"]
    log.info("%s: %.0f tokens/s/GPU, MFU %s, step %.3f s (median %.3f, max %.3f), "
             "memory %s, first step after %.1f s -> %s", name,
             record["perf/tokens_per_s_per_gpu"], "n/a" if mfu is None else f"{mfu:.1f}%",
             record["perf/step_time_s"], record["step_time_s"]["median"],
             record["step_time_s"]["max"],
             json.dumps({k: round(v, 2) for k, v in mem.items()}),
             record["time_to_first_step_s"], path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        bench_parser().print_help()
        print("\nAll training.finetune flags (python -m training.finetune --help) apply.")
        return 0
    parser = bench_parser()
    args, rest = parser.parse_known_args(argv)
    if args.gc_every < 0:
        parser.error(f"--gc-every must be >= 0 (0 = automatic collection), got {args.gc_every}")
    if args.doc_lengths:
        try:
            document_lengths(args.doc_lengths)
        except UserError as e:
            parser.error(str(e))
    cfg = parse_args(rest)
    set_runtime_defaults(cfg)
    timings: dict = {"imports_s": time.perf_counter() - _STARTED}
    started = time.perf_counter()
    env = init_distributed()
    timings["init_distributed_s"] = time.perf_counter() - started
    setup_logging(env)
    name = _name(args, cfg, env)
    try:
        record = run(args, cfg, env, timings)
        status = 0
    except torch.cuda.OutOfMemoryError as e:
        record = {"tag": name, "status": "oom", "error": str(e).splitlines()[0],
                  "memory_fraction": args.memory_fraction, "config": cfg.to_dict(),
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                      timespec="seconds")}
        print(f"[rank {env.rank}] out of memory: {record['error']}", file=sys.stderr)
        status = 1
    if env.is_main:
        record["tag"] = name
        record["argv"] = _replayable(argv)
        _log_record(name, record, write(record, args.out, name))
    if status == 0:
        dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
