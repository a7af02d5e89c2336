"""Attention alone on packed rows, one GPU: which kernel the package should use (forward +
backward of one layer's attention at the Llama-2-7B shape: 32 heads of 128, bf16).

    python docs/benchmarks/packed_attention_bench.py --doc-lengths 200:400 --out DIR

The rows are `training.bench.packed_rows` (the fine-tune's packing of random documents).
Variants, each checked against an fp32 reference of the same block-causal attention (dense
mask, math kernel) by ||out - ref|| / ||ref|| and the same for the query gradient:

- sdpa-causal: plain causal SDPA on the same tensors (torch's default kernel: cuDNN on H200);
  not block-causal, the cost of one document per row;
- sdpa-dense-mask: the dense [batch, 1, seq, seq] block-diagonal boolean mask transformers
  builds from restarting position ids (the package's path before FlexAttention);
- flex-document: compiled FlexAttention with `training.attention.document_block_mask`
  (the package's path now); the mask's construction is timed apart (once per micro-batch);
- flex-causal: compiled FlexAttention with a causal-only block mask (one document per row);
- varlen: `torch.nn.attention.varlen.varlen_attn` on the rows flattened, cumulative lengths of
  every document and the padding (where the torch has it).

Times: CUDA events around fwd+bwd, median of --repeats after --warmup; rotating among
--sets input sets so the L2 holds none of them. One JSON to --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from h200_calibrate import timed as calibrate_timed  # same folder: on sys.path when run as a script


def timed(fn, repeats: int, warmup: int) -> float:
    """Median milliseconds of `fn`, event-timed as h200_calibrate.py times."""
    return 1e3 * statistics.median(calibrate_timed(fn, repeats, warmup))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--doc-lengths", default="200:400")
    p.add_argument("--batch-size", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--sets", type=int, default=3)
    p.add_argument("--out", default="/tmp/attn")
    args = p.parse_args(argv)

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from training.attention import document_block_mask, document_ids
    from training.bench import document_lengths, packed_rows

    dev = torch.device("cuda")
    b, s, h, d = args.batch_size, args.seq_len, args.heads, args.head_dim
    gen = torch.Generator().manual_seed(0)
    rows = packed_rows(gen, 32000, b, s, document_lengths(args.doc_lengths))
    positions = rows.positions.to(dev)
    docs = document_ids(positions)
    dense = (torch.ones(s, s, dtype=torch.bool, device=dev).tril()[None]
             & (docs[:, :, None] == docs[:, None, :]))[:, None]  # [b, 1, s, s]
    sets = [[torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
             for _ in range(3)] for _ in range(args.sets)]
    grad_out = torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16)
    flex = torch.compile(flex_attention)
    block_mask = document_block_mask(positions)
    causal_mask = create_block_mask(lambda b_, h_, q, kv: q >= kv, None, None, s, s, device=dev,
                                    _compile=True)

    def varlen_call():
        try:
            from torch.nn.attention.varlen import varlen_attn
        except ImportError:
            return None
        starts = [(rows.positions[r] == 0).nonzero().flatten() + r * s for r in range(b)]
        cu = torch.cat([*starts, torch.tensor([b * s])]).to(dev, torch.int32)
        longest = int((cu[1:] - cu[:-1]).max())

        def call(q, k, v):
            flat = [t.transpose(1, 2).reshape(b * s, h, d) for t in (q, k, v)]
            out = varlen_attn(*flat, cu, cu, longest, longest, window_size=(-1, 0))  # causal
            return out.reshape(b, s, h, d).transpose(1, 2)
        return call

    variants = {
        "sdpa-causal": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "sdpa-dense-mask": lambda q, k, v: F.scaled_dot_product_attention(q, k, v,
                                                                          attn_mask=dense),
        "flex-document": lambda q, k, v: flex(q, k, v, block_mask=block_mask),
        "flex-causal": lambda q, k, v: flex(q, k, v, block_mask=causal_mask),
    }
    varlen = varlen_call()
    if varlen is not None:
        variants["varlen"] = varlen

    q, k, v = (t.detach().float().requires_grad_() for t in sets[0])
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    ref.backward(grad_out.float())
    ref_dq = q.grad
    results: dict = {}
    for name, fn in variants.items():
        try:
            q, k, v = sets[0]
            q.grad = None
            out = fn(q, k, v)
            out.backward(grad_out)
            block_causal = name not in ("sdpa-causal", "flex-causal")
            check = ({"out_rel_err": rel(out, ref), "dq_rel_err": rel(q.grad, ref_dq)}
                     if block_causal else {})
            i = iter(range(10**9))

            def step():
                qq, kk, vv = sets[next(i) % len(sets)]
                fn(qq, kk, vv).backward(grad_out)

            results[name] = {"fwd_bwd_ms": timed(step, args.repeats, args.warmup), **check}
        except Exception as e:  # noqa: BLE001 - a variant the torch cannot run is a result
            results[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
        print(name, json.dumps(results[name]), flush=True)
    results["document_block_mask_ms"] = timed(lambda: document_block_mask(positions),
                                              args.repeats, args.warmup)
    record = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
        "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
        "shape": {"batch": b, "seq": s, "heads": h, "head_dim": d},
        "doc_lengths": args.doc_lengths,
        "documents_per_row": rows.documents.tolist(),
        "block_mask_sparsity_pct": float(block_mask.sparsity()),
        "results": results,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "packed-attention.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
