"""Ceilings of the GPU we benchmark on, measured the way METHOD.md asks, plus the attention
backends on the 7B shape. Prints one JSON object (and writes it to argv[1] if given).

- bf16 matmul 8192^3 on random data: median of 30 event-timed products after 5 warm-ups, and a
  sustained figure (mean over 1,500 back-to-back products, about 2 s, where the power cap shows).
- device-to-device copy of 4 GiB: bytes read + written over the median time of 20 copies.
- scaled_dot_product_attention forward + backward on Llama-2-7B's attention at seq 4096,
  batch 3 (q, k, v as Hugging Face passes them: [B, S, H, D] transposed to [B, H, S, D]),
  causal, per backend; error of each against an fp32 math reference on a smaller problem.
"""

import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timed(fn, reps, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return times


def matmul():
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    flops = 2 * n**3
    t = timed(lambda: a @ b, 30, warm=5)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(1500):
        a @ b
    end.record()
    end.synchronize()
    sustained = 1500 * flops / (start.elapsed_time(end) / 1e3)
    return {"matmul_bf16_8192_median_tflops": flops / statistics.median(t) / 1e12,
            "matmul_bf16_8192_best_tflops": flops / min(t) / 1e12,
            "matmul_bf16_8192_sustained_tflops": sustained / 1e12}


def copy():
    n = 4 * 2**30 // 4
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), 20)
    return {"d2d_copy_tb_per_s": 2 * 4 * 2**30 / statistics.median(t) / 1e12}


BACKENDS = {"default": None, "flash": SDPBackend.FLASH_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}


def attention():
    out = {}
    b, s, h, d = 3, 4096, 32, 128
    def qkv(b, s, h, d, dtype=torch.bfloat16, gen=None):
        return [torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=gen)
                .transpose(1, 2).requires_grad_() for _ in range(3)]
    q, k, v = qkv(b, s, h, d)
    g = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
    causal_flops = 4 * b * h * s * s * d / 2 * 3.5  # fwd 1x, bwd 2.5x, half the square
    # correctness on a smaller problem against fp32 math
    gen = torch.Generator(device="cuda").manual_seed(1)
    sq, sk, sv = qkv(1, 1024, 8, 128, gen=gen)
    sg = torch.randn(1, 8, 1024, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    ref = [t.detach().float().requires_grad_() for t in (sq, sk, sv)]
    with sdpa_kernel([SDPBackend.MATH]):
        ro = F.scaled_dot_product_attention(*ref, is_causal=True)
    ro.backward(sg.float())
    for name, backend in BACKENDS.items():
        ctx = sdpa_kernel([backend]) if backend is not None else torch.enable_grad()
        try:
            with ctx:
                def step():
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    o.backward(g)
                t = timed(step, 10)
                for x in (sq, sk, sv):
                    x.grad = None
                so = F.scaled_dot_product_attention(sq, sk, sv, is_causal=True)
                so.backward(sg)
            errs = [float((a.float() - r).norm() / r.norm()) for a, r in
                    [(so, ro)] + [(x.grad, y.grad) for x, y in zip((sq, sk, sv), ref)]]
            out[name] = {"fwd_bwd_ms": 1e3 * statistics.median(t),
                         "tflops_causal": causal_flops / statistics.median(t) / 1e12,
                         "rel_err_out_dq_dk_dv": errs}
        except Exception as e:  # a backend that cannot run this case
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        for x in (q, k, v):
            x.grad = None
    return out


if __name__ == "__main__":
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
              "sdp_priority_order": torch._C._get_sdp_priority_order()}
    result.update(matmul())
    result.update(copy())
    result["attention_7b_s4096_b3"] = attention()
    text = json.dumps(result, indent=1)
    print(text)
    if len(sys.argv) > 1:
        open(sys.argv[1], "w").write(text + "\n")
