"""Print a short table of benchmark JSONs: python docs/benchmarks/table.py DIR_OR_FILES..."""

import sys
from pathlib import Path

from records import load


def rows(paths):
    for p in paths:
        p = Path(p)
        for f in sorted(p.glob("*.json")) if p.is_dir() else [p]:
            r = load(f)
            if "tag" not in r or "status" not in r:
                continue
            yield r


def main(args):
    print(f"{'tag':44} {'gpus':>4} {'tok/s/gpu':>9} {'MFU%':>5} {'med s':>6} {'spread':>6} "
          f"{'alloc':>6} {'resv':>6} {'state':>6} {'proj16':>6} {'ttfs':>6}")
    for r in rows(args):
        if r["status"] != "ok":
            print(f"{r['tag'][:44]:44} {r['status']}: {r.get('error', '')[:80]}")
            continue
        m, t = r["memory_gib"] or {}, r["step_time_s"]
        g = lambda k: f"{m[k]:6.1f}" if m.get(k) is not None else "     -"  # noqa: E731
        print(f"{r['tag'][:44]:44} {r['run/gpus']:4d} {r['perf/tokens_per_s_per_gpu']:9.0f} "
              f"{(r['perf/mfu_pct'] or 0):5.1f} {t['median']:6.3f} {t['max'] - t['min']:6.3f} "
              f"{g('peak_allocated')} {g('peak_reserved')} {g('model_state_measured')} "
              f"{g('projected_peak_reserved')} {r['time_to_first_step_s']:6.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
