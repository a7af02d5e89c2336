"""The pair table as a picture: per setup, ours over torchtitan in each harness (the team's,
and torchtitan logging every 5 steps), with the goals drawn, and each side's peak memory in the
team's harness (torchtitan's logging resets its peak statistics, so the second harness has no
memory figure). Pairs are only ever taken inside one call's folder (peer_table.py).

    python docs/benchmarks/peer_plot.py OUT.png DIR [DIR ...]
"""

import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from peer_table import PEERS, load, paired  # noqa: E402

GOALS = ((1.06, "1.06: team harness goal"), (1.05, "1.05: second harness goal"))


def rows(folders: list[str]) -> list[tuple[str, dict[str, float], float, float | None]]:
    """(setup and call, {harness label: ratio}, ours' peak GiB, torchtitan's peak GiB or None)
    for every run of ours that has a torchtitan run beside it."""
    out = []
    for folder in folders:
        call = folder.rstrip("/").rsplit("/", 1)[-1]
        for name, ours, peers in paired(load(folder)):
            if not peers:
                continue
            ratios = {label: ours["perf/tokens_per_s_per_gpu"] / peer["perf/tokens_per_s_per_gpu"]
                      for label, peer in peers}
            team = dict(peers).get("")
            out.append((f"{name}\n{call}", ratios, ours["memory_gib"]["peak_allocated"],
                        None if team is None else team["memory_gib"]["peak_allocated"]))
    return out


def main(out: str, folders: list[str]) -> None:
    data = rows(folders)
    if not data:
        raise SystemExit(f"no pair of ours and torchtitan in {', '.join(folders)}")
    x = range(len(data))
    fig, (speed, memory) = plt.subplots(2, 1, figsize=(max(6.0, 1.3 * len(data)), 7.5),
                                        sharex=True)
    width = 0.8 / len(PEERS)
    for i, (_, label) in enumerate(PEERS):
        values = [ratios.get(label) for _, ratios, _, _ in data]
        xs = [j + (i - (len(PEERS) - 1) / 2) * width for j in x]
        bars = speed.bar([a for a, v in zip(xs, values) if v is not None],
                         [v for v in values if v is not None], width,
                         label=label.strip(" ()") or "team harness")
        speed.bar_label(bars, fmt="%.3f", fontsize=7)
    for level, text in GOALS:
        speed.axhline(level, linestyle="--", linewidth=1, color="0.3")
        speed.annotate(text, (-0.5, level), fontsize=7, ha="left", va="bottom")
    speed.set_xlim(-0.5, len(data) - 0.5)
    speed.set_ylim(0.95, max(max(r.values()) for _, r, _, _ in data) + 0.03)
    speed.set_ylabel("ours / torchtitan, tokens/s")
    speed.legend(fontsize=7, loc="lower right", title="torchtitan in", title_fontsize=7)
    memory.bar([j - 0.2 for j in x], [m for _, _, m, _ in data], 0.4, label="ours")
    memory.bar([j + 0.2 for j, row in zip(x, data) if row[3] is not None],
               [row[3] for row in data if row[3] is not None], 0.4, label="torchtitan")
    memory.set_ylabel("peak allocated (GiB)")
    memory.legend(fontsize=7)
    memory.set_xticks(list(x), [name for name, _, _, _ in data], fontsize=7)
    fig.suptitle("beside torchtitan on one H200, same-call pairs", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
