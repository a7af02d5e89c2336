"""Tables and charts for docs/performance.md from the JSONs in docs/benchmarks/h200/:
python docs/benchmarks/report.py  (writes docs/perf_tokens_by_config.png and
docs/perf_scaling_prediction.png, prints the markdown tables)."""

import glob
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from components.planning.hardware import PROFILES  # noqa: E402
from components.planning.scaling_model import Cluster, predict  # noqa: E402
from training.bench import SHAPES  # noqa: E402
from training.shapes import flops_per_token  # noqa: E402

from records import load  # noqa: E402

RUNS = ROOT / "docs" / "benchmarks" / "h200"
PEAK_H100 = PROFILES["p5"].gpu.peak_bf16_flops
ANCHORS = [  # the anchors of docs/performance.md: 2 x H200, Llama-2-7B, seq 4096, batch 3/GPU
    ("plain HF + FSDP2, full AC", 7896), ("llama-cookbook, full AC", 8234),
    ("torchtitan, full AC, compile", 9855), ("torchtitan, selective AC, compile", 10776),
    ("torchtitan, no AC, compile", 12028), ("plain HF + FSDP2 + compile/layer, no AC", 12307)]
OURS = [  # (tag, label), in the order of the chart
    ("7b-b3-full-eager-plain-sync", "A: full AC, eager, plain loss, sync/step"),
    ("7b-b3-full-eager", "B: A + fused loss, no host sync"),
    ("7b-b3-full-compile", "C: B + compile per block"),
    ("7b-b2-none-compile", "no AC, compile, batch 2"),
    ("7b-b3-none-compile", "D: no AC, compile (measured pick for the job)"),
    ("7b-b3-none-compile-sgo", "no AC, compile, SHARD_GRAD_OP"),
    ("7b-b4-none-compile", "no AC, compile, batch 4"),
    ("7b-b3-none-compile-fp8", "float8, no AC, compile"),
    ("7b-b3-none-compile-sgo-fp8", "float8, no AC, compile, SHARD_GRAD_OP"),
]


def runs(tag: str) -> list[dict]:
    return [load(f) for f in sorted(glob.glob(f"{RUNS}/{tag}-2*.json"))]


def best(tag: str) -> dict:
    return max(runs(tag), key=lambda r: r["perf/tokens_per_s_per_gpu"])


def params_of(shape: dict) -> tuple[float, float]:
    h, i, L, v = (shape[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                     "vocab_size"))
    kv = shape["num_key_value_heads"] * h // shape["num_attention_heads"]
    total = 2 * v * h + L * (2 * h * h + 2 * h * kv + 3 * h * i + 2 * h) + h
    return total, total - v * h


def config_chart() -> None:
    labels = [f"{a} (anchor)" for a, _ in ANCHORS] + [label for _, label in OURS]
    values = [v for _, v in ANCHORS] + [best(t)["perf/tokens_per_s_per_gpu"] for t, _ in OURS]
    colors = ["#bbbbbb"] * len(ANCHORS) + ["#1f77b4"] * (len(OURS) - 2) + ["#ff7f0e"] * 2
    fig, ax = plt.subplots(figsize=(10, 6.5))
    ax.barh(range(len(values)), values, color=colors)
    ax.set_yticks(range(len(values)), labels, fontsize=8)
    ax.invert_yaxis()
    for y, v in enumerate(values):
        ax.text(v + 100, y, f"{v:,.0f} ({100 * v * 46.09e9 / PEAK_H100:.1f} %)", va="center",
                fontsize=7)
    ax.axvline(12900, color="red", ls="--", lw=1)
    ax.text(12950, -0.6, "60 % MFU (bf16 goal)", color="red", fontsize=8)
    ax.text(15550, 0.3, "float8 goal", color="#ff7f0e", fontsize=8)
    ax.axvline(15500, color="#ff7f0e", ls=":", lw=1)
    ax.set_xlabel("tokens/s/GPU (MFU = x 46.09 GFLOP / 989.5 TFLOP/s)")
    ax.set_title("Llama-2-7B shape, seq 4096, 2 x H200, FSDP2, fp32 master weights/reductions/"
                 "AdamW\nbatch 3/GPU unless noted; grey: the anchors; orange: float8",
                 fontsize=9)
    ax.set_xlim(0, 19500)
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / "perf_tokens_by_config.png", dpi=110)


CLUSTERS = {
    name: dict(gpus_per_node=PROFILES[name].gpus, network_gbps=float(PROFILES[name].network_gbps),
               nvlink_busbw_gbs=PROFILES[name].gpu.nvlink_busbw_gbs, peak=PROFILES[name].gpu.peak_bf16_flops)
    for name in ("p5", "p4de")  # the charts' order
}
"""The instance profiles (components/planning/hardware.py) as the scaling model sees them."""


def one_node_steps() -> dict[str, tuple[float, str]]:
    """Step time on one node (H100/H200 compute) per model, with where it comes from."""
    seven = best("7b-b3-none-compile")
    thirteen = best("13b-b2-selective-compile")
    total70, body70 = params_of(SHAPES["llama2-70b"])
    f70 = flops_per_token(body70, 80, 8192, 4096)
    mfu_full_ac = best("7b-b3-full-compile")["perf/mfu_pct"] / 100
    return {
        "7B": (seven["step_time_s"]["median"], "measured: batch 3, no AC, compile, 2 x H200"),
        "13B": (thirteen["step_time_s"]["median"],
                "measured: batch 2, selective AC, compile, 2 x H200"),
        "70B": (2 * 4096 * f70 / (mfu_full_ac * PEAK_H100),
                f"extrapolated: batch 2, full AC, at the 7B full-AC compile MFU "
                f"({100 * mfu_full_ac:.1f} %)"),
    }


def scaling() -> list[dict]:
    steps = one_node_steps()
    shapes = {"7B": "llama2-7b", "13B": "llama2-13b", "70B": "llama2-70b"}
    rows = []
    for model, (step_h100, source) in steps.items():
        params, _ = params_of(SHAPES[shapes[model]])
        for prof, c in CLUSTERS.items():
            step = step_h100 * PEAK_H100 / c["peak"]  # A100: same MFU assumed
            for strategy in ("FULL_SHARD", "HYBRID_SHARD"):
                fits = not (strategy == "HYBRID_SHARD" and 16 * params / 8 > 70e9)
                curves = {}
                for per in ("seconds", "bytes"):
                    curves[per] = [predict(
                        params=params, measured_step_s=step, measured_gpus=2,
                        strategy=strategy, contention_per=per,
                        cluster=Cluster(name=prof, nodes=nodes, gpus_per_node=8,
                                        network_gbps=c["network_gbps"],
                                        nvlink_busbw_gbs=c["nvlink_busbw_gbs"]))
                        for nodes in (1, 2, 4, 8, 16)]
                rows.append(dict(model=model, profile=prof, strategy=strategy, fits=fits,
                                 step1=step, source=source, curve=curves["seconds"],
                                 optimistic=curves["bytes"]))
    return rows


def scaling_chart(rows) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    nodes = [1, 2, 4, 8, 16]
    for ax, prof in zip(axes, CLUSTERS):
        for r in rows:
            if r["profile"] != prof or not r["fits"]:
                continue
            style = "-" if r["strategy"] == "FULL_SHARD" else "--"
            lo = [100 * p.efficiency for p in r["curve"]]
            hi = [100 * p.efficiency for p in r["optimistic"]]
            line, = ax.plot(nodes, lo, style, marker="o", label=f"{r['model']} {r['strategy']}")
            ax.fill_between(nodes, lo, hi, color=line.get_color(), alpha=0.12)
        if prof == "p5":
            ax.plot([16], [87], "k*", ms=12, label="blog, 1 -> 16 p5 nodes: 87 %")
        ax.axhline(100, color="grey", lw=0.5)
        ax.set_xscale("log", base=2)
        ax.set_xticks(nodes, [str(n) for n in nodes])
        ax.set_xlabel("nodes (8 GPUs each)")
        ax.set_title(f"{prof}: {CLUSTERS[prof]['network_gbps']:.0f} Gbps EFA per node")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("predicted per-GPU throughput vs 1 node (%)")
    axes[0].set_ylim(0, 105)
    fig.suptitle("FSDP scaling on paper (components/planning/scaling_model.py): 80 % of line rate, 90 % "
                 "overlap, contention 0.6 per hidden second (lines; shaded up to: per "
                 "NVLink-equivalent second)", fontsize=9)
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / "perf_scaling_prediction.png", dpi=110)


def main() -> None:
    config_chart()
    rows = scaling()
    scaling_chart(rows)
    print("| model | profile | strategy | 1-node step (s) | 16-node step (s) | collectives (s, "
          "none hidden) | exposed (s) | contention (s) | efficiency 1 -> 2 nodes | efficiency 1 -> 16 nodes |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        p, q = r["curve"][-1], r["optimistic"][-1]
        two, two_q = r["curve"][1], r["optimistic"][1]
        eff = (f"{100 * p.efficiency:.0f} % ({100 * q.efficiency:.0f} %)" if r["fits"]
               else "does not fit (16 B x P / 8 GPUs > 80 GB)")
        eff2 = (f"{100 * two.efficiency:.0f} % ({100 * two_q.efficiency:.0f} %)" if r["fits"]
                else "-")
        print(f"| {r['model']} | {r['profile']} | {r['strategy']} | {p.one_node_step_s:.2f} | "
              f"{p.step_s:.2f} | {p.comm_s:.2f} | {p.exposed_s:.2f} | {p.contention_s:.2f} | "
              f"{eff2} | {eff} |")
    for model, (s, src) in one_node_steps().items():
        print(f"- {model}: {s:.3f} s per step on one node ({src})")


if __name__ == "__main__":
    main()
