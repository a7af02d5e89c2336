"""Each timed step's time beside the GPU's mean SM clock during it (the bench's and the torchtitan
harness's `gpu_clock_per_step`, training/gpu_clocks.py), one panel per run, as points in time
order: a step that is slow because the clock was low sits on the same line as the others.

    python docs/benchmarks/clock_plot.py OUT.png DIR TAG [TAG ...]

TAG is a run's tag (`ours-16l-fp8`, `titan-16l-fp8-w10`, ...) in DIR's JSONs."""

import glob
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import records  # noqa: E402


def main(out: str, folder: str, tags: list[str]) -> None:
    runs = {r["tag"]: r for r in map(records.load, sorted(glob.glob(f"{folder}/*.json")))}
    missing = [t for t in tags if t not in runs or not runs[t].get("gpu_clock_per_step")]
    if missing:
        raise SystemExit(f"no run with a sampled clock in {folder}: {', '.join(missing)}")
    fig, axes = plt.subplots(1, len(tags), figsize=(4.2 * len(tags), 3.6), sharey=True,
                             squeeze=False)
    for ax, tag in zip(axes[0], tags):
        r = runs[tag]
        times = [t * 1e3 for t in r["step_times_s"]]
        clocks = [c["sm_clock_mhz"] for c in r["gpu_clock_per_step"]]
        ax.plot(clocks, times, color="0.75", zorder=1)
        ax.scatter(clocks, times, c=range(len(times)), cmap="viridis", zorder=2)
        ax.annotate("first", (clocks[0], times[0]), textcoords="offset points", xytext=(6, 4))
        warm = (r.get("steps") or {}).get("warmup")
        ax.set_title(f"{tag}\n{warm} warm-up steps, max / median "
                     f"{r['step_time_s']['max_over_median']:.3f}", fontsize=9)
        ax.set_xlabel("mean SM clock during the step (MHz)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("step time (ms)")
    fig.suptitle(f"timed steps beside the GPU clock ({r['date'][:10]}, one H200, 700 W limit)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
