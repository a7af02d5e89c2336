"""float8 convergence on real text (docs/performance.md): the same model, seed and data order trained
three times with `training.finetune` on one GPU: bf16, float8, bf16 again (the noise floor).

    python fp8_convergence.py make DIR          # random-init model directory (fixed seed)
    python fp8_convergence.py compare OUT.json BF16.jsonl FP8.jsonl BF16B.jsonl
    python fp8_convergence.py plot SUMMARY.json OUT.png

Model: a Llama of 0.62 B parameters (hidden 2048, 12 layers, 16 heads, FFN 5632; the package's
byte tokenizer, vocabulary 320), initialised N(0, 0.02) by transformers with seed 0. Data: the
Brown corpus as plain text (brown_corpus.py: records of whole paragraphs up to 900
characters), packed into 1,024-token sequences, 8 per step.
Training: 300 optimizer steps, lr 3e-4 after 20 warm-up steps, cosine to 3e-5, AdamW, clipping
at 1.0, compile per block, no AC.

Tolerance, stated before the run: the final loss (mean of steps 281-300) of float8 within 1.0 %
of bf16's. The bf16-bf16 gap is reported beside it as the run-to-run noise, and each float8 run
is judged against both.
"""

import json
import sys

TOLERANCE_PCT = 1.0
LAST = 20
STEPS = 300  # fewer steps in any run: not a result (`complete` false)
SHAPE = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=12,
             num_attention_heads=16, num_key_value_heads=16, vocab_size=320,
             max_position_embeddings=1024, rms_norm_eps=1e-5, tie_word_embeddings=False,
             pad_token_id=0, bos_token_id=1, eos_token_id=2)


def make(out: str) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from training import tiny

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SHAPE))
    model.save_pretrained(out)
    tiny.build_tokenizer().save_pretrained(out)
    print(f"{sum(p.numel() for p in model.parameters()) / 1e9:.3f} B parameters -> {out}")


def losses(path: str) -> list[float]:
    out = []
    for line in open(path):
        r = json.loads(line)
        if "train/loss" in r:
            out.append(r["train/loss"])
    return out


def compare(out: str, bf16: str, bf16_again: str, *float8: str) -> None:
    runs = {"bf16": losses(bf16), "bf16_again": losses(bf16_again)}
    runs.update((name, losses(path)) for name, path in (a.split("=", 1) for a in float8))
    names = [name for name in runs if name not in ("bf16", "bf16_again")]
    final = {k: sum(v[-LAST:]) / LAST for k, v in runs.items()}

    def gap_pct(name: str) -> float:
        return 100 * abs(final[name] - final["bf16"]) / final["bf16"]

    noise = gap_pct("bf16_again")
    summary = {"steps": {k: len(v) for k, v in runs.items()},
               "first_loss": {k: v[0] for k, v in runs.items()},
               "final_loss_mean_last_20": final,
               "gap_pct": {name: gap_pct(name) for name in names}, "bf16_noise_pct": noise,
               "max_stepwise_gap_pct": {name: max(100 * abs(a - b) / b for a, b in
                                                  zip(runs[name], runs["bf16"]))
                                        for name in names},
               "tolerance_pct": TOLERANCE_PCT,
               "complete": min(len(v) for v in runs.values()) >= STEPS,
               "within_tolerance": {name: gap_pct(name) <= TOLERANCE_PCT for name in names},
               "within_noise": {name: gap_pct(name) <= noise for name in names},
               "losses": runs}
    with open(out, "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({k: v for k, v in summary.items() if k != "losses"}))


def plot(summary: str, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = json.load(open(summary))
    fig, (ax, gap) = plt.subplots(2, 1, figsize=(8, 6), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 1]})
    for name, run in r["losses"].items():
        ax.plot(range(1, len(run) + 1), run, "--" if name == "bf16_again" else "-", lw=1,
                label=name)
    ax.set_ylabel("training loss (nats/byte)")
    ax.set_title("float8 recipes vs bf16, 0.62 B Llama, Brown corpus, 300 steps of 8 x 1,024 tokens, 1 x H200")
    ax.legend()
    for name in (name for name in r["losses"] if name != "bf16"):
        rel = [100 * (a - b) / b for a, b in zip(r["losses"][name], r["losses"]["bf16"])]
        gap.plot(range(1, len(rel) + 1), rel, lw=1, label=f"{name} - bf16")
    gap.axhline(0, color="k", lw=0.5)
    gap.set_ylim(-5, 5)
    gap.set_ylabel("% of bf16")
    gap.set_xlabel("optimizer step")
    gap.legend(fontsize=7, loc="lower right", ncol=2, framealpha=0.6)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    elif sys.argv[1] == "plot":
        plot(sys.argv[2], sys.argv[3])
    else:
        compare(*sys.argv[2:])
