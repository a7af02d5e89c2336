"""The user's job on one GPU: `training.finetune` itself (its loader, packing, loop and metrics) on
samsum-shaped records (4,000 text records of 200-400 tokens of the byte tokenizer, packed into
4,096-token rows, 12-13 documents a row), the 16-layer Llama-2-7B shape with random bf16 weights,
batch 3, no AC, compile, 25 steps, once per --packed-attention path in the same machine session.

    PYTHONPATH=. python docs/benchmarks/finetune_packed.py WORK OUT [LAYERS [HIDDEN]]

Environment: SHAPE (llama2-7b; llama3-8b: 8 KV heads and a 128,256-row embedding and head, the
byte tokenizer standing in for Llama 3's, whose ids the records do not need), PATHS (default
"flex sdpa"), PRECISION (bf16), STEPS (25), SEQ (4096), BATCH (3), COMPILE (1). Prints the mean tokens/s/GPU of steps 6-25 and the slowest step over the median;
the metrics JSON lines and logs land in OUT. LAYERS/HIDDEN shrink the model for a CPU try-out."""
import json, os, random, subprocess, sys, time

work, out = sys.argv[1], sys.argv[2]
layers = int(sys.argv[3]) if len(sys.argv) > 3 else 16
os.makedirs(work, exist_ok=True); os.makedirs(out, exist_ok=True)
words = "the a to and of in is it you that he was for on are with as I his they be at one have this".split()
rng = random.Random(0)
data = os.path.join(work, "records.jsonl")
with open(data, "w") as f:
    for _ in range(4000):  # byte tokenizer: one token a byte
        n = rng.randint(200, 400)
        text = ""
        while len(text) < n:
            text += rng.choice(words) + " "
        f.write(json.dumps({"text": text[:n]}) + "\n")
model = os.path.join(work, "model")
if not os.path.exists(os.path.join(model, "config.json")):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from training import tiny
    from training.bench import SHAPES
    shape = dict(SHAPES[os.environ.get("SHAPE", "llama2-7b")])
    if len(sys.argv) > 4:
        shape.update(hidden_size=int(sys.argv[4]), intermediate_size=int(sys.argv[4]) * 2, num_attention_heads=4, num_key_value_heads=4)
    shape["num_hidden_layers"] = layers
    config = LlamaConfig(**shape, max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        m = LlamaForCausalLM(config).to(torch.bfloat16)
    m.save_pretrained(model, max_shard_size="5GB")
    tiny.build_tokenizer().save_pretrained(model)
    del m
seq = os.environ.get("SEQ", "4096"); steps = os.environ.get("STEPS", "25")
for attention in os.environ.get("PATHS", "flex sdpa").split():
    precision = os.environ.get("PRECISION", "bf16")
    metrics = os.path.join(out, f"finetune-{attention}-{precision}.jsonl")
    cmd = [sys.executable, "-m", "training.finetune", "--model", model, "--dataset", data,
           "--data-format", "text", "--seq-len", seq, "--batch-size", os.environ.get("BATCH", "3"),
           "--max-steps", steps, "--warmup-steps", "2", "--log-every", "1", "--val-fraction", "0",
           "--activation-checkpointing", "none", "--packed-attention", attention,
           "--checkpoint-every", "0", "--no-node-check", "--precision", precision, "--metrics-file", metrics]
    cmd += ["--compile"] if os.environ.get("COMPILE", "1") == "1" else ["--no-compile"]
    started = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    open(os.path.join(out, f"finetune-{attention}-{precision}.log"), "w").write(proc.stdout + proc.stderr)
    print(attention, "rc", proc.returncode, f"{time.time() - started:.0f} s", proc.stderr[-1500:] if proc.returncode else "")
    rows = [json.loads(l) for l in open(metrics)] if os.path.exists(metrics) else []
    tps = [r["perf/tokens_per_s_per_gpu"] for r in rows if "perf/tokens_per_s_per_gpu" in r]
    st = [r["perf/step_time_s"] for r in rows if "perf/step_time_s" in r]
    if len(tps) > 5:
        steady, times = tps[5:], sorted(st[5:])
        print(f"{attention}: {len(tps)} steps, steady mean {sum(steady)/len(steady):,.0f} tok/s/GPU, "
              f"max/median step {max(times)/times[len(times)//2]:.3f}")
