"""torchtitan's own trainer on the shape, data, warm-up and timing rules of `training.bench`, so
the two can run side by side on one machine (docs/performance.md, "Beside torchtitan"). One JSON per run, with the fields
of a bench JSON that the comparison reads.

    torchrun --nproc-per-node 1 docs/benchmarks/peer_torchtitan.py --layers 16 \\
        --batch-size 3 --seq-len 4096 --ac none --out DIR --tag NAME [--float8]

What is torchtitan's: `torchtitan.train.Trainer` (0.2.2, carried as a wheel) builds the model
(its llama3 `Transformer` at the Llama-2-7B shape: dim 4096, 32 heads, 32 KV heads, FFN 11008,
vocabulary 32,000; with `--shape llama3-8b` its own `8B` flavor: 8 KV heads, FFN 14,336,
vocabulary 128,256, RoPE theta 500,000), applies its own `parallelize_llama` (AC, compile per block and of the
loss, FSDP2 when more than one GPU; bf16 autocast over fp32 weights on one GPU), its
fused AdamW, clipping, loss and `train_step`; float8 is its `quantize.linear.float8` converter
with its recommended settings (tensorwise, float8 all-gather and precomputed scales under
FSDP, output head kept bf16). What is ours: the data (uniform random token ids from the same
generator as `training.bench`: seed x 1000 + rank, (batch, seq + 1) per micro-batch) in place of
its tokenizer and dataset (which would need a download), and the timing loop: `--warmup` steps
(the first included), then `--steps` steps with no host sync between them, CUDA events at the
step boundaries, one wall-clock interval for the mean, exactly as `training.bench`. Its
metrics logging (a host sync) runs at step 1 only (`metrics.log_freq` past the run), or every
`--log-freq` steps. The
optimizer settings are the package's defaults (lr 2e-5, 10 warm-up steps, betas 0.9/0.95,
eps 1e-8, no weight decay, clipping at 1.0).

With `--doc-lengths` both sides train on the same packed rows: `training.bench.packed_rows`
(documents `<s> ... </s>` packed as the fine-tune packs records, from the same generator and
seed), and torchtitan attends block-causally with its own masks (`attn_mask_type
block_causal`, documents cut after each EOS token: the same boundaries; `--attn flex` its
FlexAttention, `--attn varlen` its varlen attention). Its tokenizer is a stub that only knows
the EOS id, which is all its masks read.

`datasets` is imported by torchtitan's text loaders at import time only; it is not installed
on the GPU machine, so a stub module stands in (nothing of it is called).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import sys
import time
import types
from pathlib import Path

from training.gpu_clocks import ClockSampler, per_step


def _stub_datasets() -> None:
    try:
        import datasets  # noqa: F401
    except ImportError:
        mod = types.ModuleType("datasets")
        mod.Dataset = object
        mod.IterableDataset = object

        def unavailable(*_, **__):
            raise RuntimeError("datasets is stubbed in the peer harness")

        mod.load_dataset = unavailable
        dist_mod = types.ModuleType("datasets.distributed")
        dist_mod.split_dataset_by_node = unavailable
        mod.distributed = dist_mod
        sys.modules["datasets"] = mod
        sys.modules["datasets.distributed"] = dist_mod


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="peer_torchtitan.py")
    p.add_argument("--shape", choices=("llama2-7b", "llama3-8b"), default="llama2-7b",
                   help="llama2-7b: torchtitan's llama3 Transformer at the Llama-2-7B shape; "
                        "llama3-8b: its own 8B flavor (8 KV heads, FFN 14,336, vocabulary "
                        "128,256), layers cut to --layers")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--ac", choices=("none", "full", "selective"), default="none")
    p.add_argument("--float8", action="store_true")
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=10)  # as training.bench's --bench-warmup
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", default="/tmp/peer")
    p.add_argument("--tag", default="")
    p.add_argument("--doc-lengths", metavar="MIN:MAX|FILE", default=None,
                   help="packed rows of EOS-delimited documents, the same rows as training.bench "
                        "--doc-lengths draws (its `packed_rows`, same generator and seed), "
                        "with torchtitan's block-causal attention over them (--attn)")
    p.add_argument("--attn", choices=("flex", "varlen"), default="flex",
                   help="torchtitan's attention for --doc-lengths: FlexAttention with its "
                        "document mask, or varlen attention (cumulative lengths from the EOS "
                        "tokens)")
    p.add_argument("--log-freq", type=int, default=10**6,
                   help="torchtitan's metrics logging (a host sync) every this many steps; "
                        "the default is past the run (step 1 only)")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="after the timed steps, profile this many (torch.profiler) and write the "
                        "Chrome trace beside the JSON, as training.bench does")
    return p.parse_args(argv)


def job_config(args: argparse.Namespace, flavor: str):
    from torchtitan.config import JobConfig

    cfg = JobConfig()
    cfg.job.dump_folder = "/tmp/torchtitan-peer"
    cfg.model.name = "llama3"
    cfg.model.flavor = flavor
    cfg.training.local_batch_size = args.batch_size
    cfg.training.seq_len = args.seq_len
    cfg.training.steps = args.warmup + args.steps + args.profile_steps
    cfg.training.max_norm = 1.0
    cfg.training.mixed_precision_param = "bfloat16"
    cfg.training.mixed_precision_reduce = "float32"
    cfg.optimizer.lr = 2e-5
    cfg.optimizer.eps = 1e-8
    cfg.optimizer.weight_decay = 0.0
    cfg.optimizer.implementation = "fused"
    cfg.lr_scheduler.warmup_steps = 10
    cfg.metrics.log_freq = args.log_freq
    cfg.metrics.enable_tensorboard = False
    cfg.activation_checkpoint.mode = args.ac
    cfg.compile.enable = args.compile
    cfg.compile.components = ["model", "loss"]
    cfg.checkpoint.enable = False
    if args.float8:
        cfg.model.converters = ["quantize.linear.float8"]
        f8 = cfg.quantize.linear.float8
        f8.enable_fsdp_float8_all_gather = True
        f8.precompute_float8_dynamic_scale_for_fsdp = True
        f8.filter_fqns = ["output"]
    return cfg


def main(argv: list[str] | None = None) -> int:
    _stub_datasets()
    args = parse(argv)
    import torch

    import torchtitan
    from torchtitan.models import llama3
    from torchtitan.models.llama3 import TransformerModelArgs
    from torchtitan.protocols.train_spec import register_train_spec
    from torchtitan.tools.logging import init_logger
    from torchtitan.train import Trainer

    init_logger()
    flavor = f"{args.shape.replace('-', '_')}_{args.layers}l"
    packed = args.doc_lengths is not None
    attention = (dict(attn_type=args.attn, attn_mask_type="block_causal") if packed else {})
    if args.shape == "llama3-8b":  # torchtitan's own flavor, its layers cut
        llama3.llama3_args[flavor] = dataclasses.replace(
            llama3.llama3_args["8B"], n_layers=args.layers, **attention)
    else:
        llama3.llama3_args[flavor] = TransformerModelArgs(
            dim=4096, n_layers=args.layers, n_heads=32, n_kv_heads=32, vocab_size=32000,
            multiple_of=256, rope_theta=10000, norm_eps=1e-5, **attention)
    rank = int(os.environ.get("RANK", "0"))
    vocab = llama3.llama3_args[flavor].vocab_size

    def random_tokens(dp_world_size, dp_rank, tokenizer, job_config, **_):
        gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
        if packed:
            from training.bench import document_lengths, packed_rows

            lengths = document_lengths(args.doc_lengths)

        def batches():
            while True:
                if packed:  # the bench's rows: documents end in </s>, torchtitan's EOS
                    rows = packed_rows(gen, vocab, args.batch_size, args.seq_len, lengths)
                    yield {"input": rows.inputs}, rows.targets
                    continue
                t = torch.randint(0, vocab, (args.batch_size, args.seq_len + 1), generator=gen)
                yield {"input": t[:, :-1]}, t[:, 1:]

        return batches()

    def eos_only_tokenizer(_job_config):  # all torchtitan's block-causal masks read of it
        from training.bench import EOS_ID

        return types.SimpleNamespace(eos_id=EOS_ID)

    spec = dataclasses.replace(llama3.get_train_spec(),
                               build_tokenizer_fn=eos_only_tokenizer if packed else None,
                               build_dataloader_fn=random_tokens, build_validator_fn=None)
    register_train_spec("llama3_peer", spec)
    cfg = job_config(args, flavor)
    cfg.model.name = "llama3_peer"

    trainer = Trainer(cfg)
    device = trainer.device
    data = trainer.batch_generator(trainer.dataloader)
    model = trainer.model_parts[0]
    n_total = sum(p.numel() for p in model.parameters())
    n_embedding = model.tok_embeddings.weight.numel()
    m = llama3.llama3_args[flavor]
    flops_token = 6 * (n_total - n_embedding) + 12 * m.n_layers * m.dim * args.seq_len

    def step() -> None:
        trainer.step += 1
        trainer.gc_handler.run(trainer.step)
        trainer.train_step(data)

    started = time.perf_counter()
    step()
    torch.cuda.synchronize(device)
    first = time.perf_counter() - started
    for _ in range(args.warmup - 1):
        step()
    torch.cuda.synchronize(device)
    torch.distributed.barrier()
    torch.cuda.reset_peak_memory_stats(device)
    events = [torch.cuda.Event(enable_timing=True)]
    clocks = ClockSampler(device.index or 0)  # the SM clock per step, as training.bench records it
    clocks.start()
    events[0].record()
    stamp = time.perf_counter()
    for _ in range(args.steps):
        step()
        events.append(torch.cuda.Event(enable_timing=True))
        events[-1].record()
    torch.cuda.synchronize(device)
    wall = time.perf_counter() - stamp
    times = [a.elapsed_time(b) / 1e3 for a, b in zip(events, events[1:])]
    samples = clocks.stop()
    if args.profile_steps:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(args.profile_steps):
                step()
            torch.cuda.synchronize(device)
        if rank == 0:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(Path(args.out) / f"{args.tag or flavor}.trace.json.gz"))
    world = torch.distributed.get_world_size()
    tokens = args.batch_size * args.seq_len
    per_gpu = tokens / (wall / args.steps)
    record = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "tag": args.tag, "status": "ok", "runner": "torchtitan",
        "torchtitan": torchtitan.__version__,
        "model": {"shape": args.shape, "params": n_total, "params_without_embedding": n_total - n_embedding,
                  "layers": m.n_layers, "hidden": m.dim, "vocab": m.vocab_size},
        "run/seq_len": args.seq_len, "run/gpus": world,
        "batch": {"per_gpu_sequences": args.batch_size, "per_gpu_tokens": tokens},
        "run/activation_checkpointing": args.ac, "run/compile": args.compile, "fp8": args.float8,
        "packed": ({"doc_lengths": args.doc_lengths, "attn_type": args.attn,
                    "attn_mask_type": "block_causal"} if packed else None),
        "strategy": ("FULL_SHARD (fully_shard)" if trainer.parallel_dims.fsdp_enabled
                     else "none: bf16 autocast over fp32 weights"),
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda},
        "steps": {"warmup": args.warmup, "timed": args.steps, "log_freq": args.log_freq},
        "run/flops_per_token": flops_token,
        "perf/tokens_per_s_per_gpu": per_gpu,
        "perf/mfu_pct": 100.0 * per_gpu * flops_token / 989.5e12,
        "perf/step_time_s": wall / args.steps,
        "step_time_s": {"median": statistics.median(times), "min": min(times), "max": max(times),
                        "max_over_median": max(times) / statistics.median(times)},
        "step_times_s": times,
        "gpu_clock_per_step": per_step(samples, stamp, times) if clocks.available else None,
        "first_step_s": first,
        "memory_gib": {"peak_allocated": torch.cuda.max_memory_allocated(device) / 2**30,
                       "peak_reserved": torch.cuda.max_memory_reserved(device) / 2**30},
        "config": {"optimizer": dataclasses.asdict(cfg.optimizer),
                   "training": dataclasses.asdict(cfg.training),
                   "float8": dataclasses.asdict(cfg.quantize.linear.float8) if args.float8
                   else None},
    }
    if rank == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stamp_s = datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
        path = out / f"{args.tag or flavor}-{stamp_s}.json"
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"{args.tag}: {per_gpu:,.0f} tokens/s/GPU, step {wall / args.steps:.3f} s -> {path}",
              flush=True)
    trainer.close()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
