"""Write training/data/instructions.jsonl: the small instruction set this package ships.

Every example is generated here from a fixed seed (no third-party data, no licence question):
short alpaca-style records (instruction, input, output) over simple, checkable tasks such as
arithmetic, word reversal and sorting, so that a tiny model visibly learns the template and the
tasks in a few hundred steps. Run `python -m training.data.make_dataset` to regenerate; the
output is byte-for-byte reproducible.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent / "instructions.jsonl"
SEED = 20240601
PER_TASK = 40

WORDS = [
    "cluster", "gradient", "kernel", "tensor", "shard", "node", "socket", "matrix", "vector",
    "python", "token", "packet", "router", "batch", "epoch", "model", "layer", "cache", "queue",
    "thread", "memory", "buffer", "signal", "schema", "stack", "volume", "bucket", "driver",
    "tunnel", "lambda", "switch", "binary", "format", "window", "garden", "river", "planet",
    "forest", "candle", "violin", "pepper", "castle", "rocket", "silver", "orange", "marble",
]
PLURALS = {
    "node": "nodes", "matrix": "matrices", "index": "indices", "child": "children",
    "mouse": "mice", "box": "boxes", "city": "cities", "leaf": "leaves", "person": "people",
    "tooth": "teeth", "analysis": "analyses", "bus": "buses", "day": "days", "knife": "knives",
    "goose": "geese", "axis": "axes", "cactus": "cacti", "story": "stories", "wolf": "wolves",
    "hero": "heroes",
}
UNITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
TEENS = ["ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
         "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
FACTS = [
    ("What does FSDP stand for?", "Fully Sharded Data Parallel."),
    ("What does a learning-rate warm-up do?",
     "It raises the learning rate gradually over the first steps so early updates stay small."),
    ("Why pack sequences?", "Packing fills every sequence with tokens, so no compute is spent "
                            "on padding."),
    ("What is gradient accumulation?", "Summing gradients over several micro-batches before "
                                       "one optimizer step, to reach a larger batch."),
    ("What does activation checkpointing trade?", "Compute for memory: activations are "
                                                  "recomputed in the backward pass."),
    ("What is a checkpoint?", "A saved copy of the model, optimizer and progress, so training "
                              "can resume after a failure."),
    ("What does bf16 mean?", "Brain floating point: 16 bits with the exponent range of fp32."),
    ("What does MFU measure?", "Model FLOPs utilisation: useful FLOPs per second divided by "
                               "the hardware peak."),
]


def number_words(n: int) -> str:
    if n < 10:
        return UNITS[n]
    if n < 20:
        return TEENS[n - 10]
    tens, unit = divmod(n, 10)
    return TENS[tens] + ("" if unit == 0 else "-" + UNITS[unit])


def tasks(rng: random.Random):
    """Yield (instruction, input, output) triples, PER_TASK of each kind."""
    for _ in range(PER_TASK):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        yield "Add the two numbers.", f"{a} and {b}", str(a + b)
    for _ in range(PER_TASK):
        a, b = rng.randint(20, 99), rng.randint(1, 19)
        yield "Subtract the second number from the first.", f"{a} and {b}", str(a - b)
    for _ in range(PER_TASK):
        w = rng.choice(WORDS)
        yield "Reverse the letters of the word.", w, w[::-1]
    for _ in range(PER_TASK):
        w = rng.choice(WORDS)
        yield "Write the word in capital letters.", w, w.upper()
    for _ in range(PER_TASK):
        w = rng.choice(WORDS)
        yield "How many letters does the word have?", w, str(len(w))
    for _ in range(PER_TASK):
        xs = rng.sample(range(1, 60), 5)
        yield ("Sort the numbers from smallest to largest.", ", ".join(map(str, xs)),
               ", ".join(map(str, sorted(xs))))
    for _ in range(PER_TASK):
        n = rng.randint(0, 99)
        yield "Write the number in words.", str(n), number_words(n)
    for _ in range(PER_TASK):
        singular = rng.choice(sorted(PLURALS))
        yield "Give the plural of the noun.", singular, PLURALS[singular]
    for _ in range(PER_TASK):
        w = rng.choice(WORDS)
        yield "What is the first letter of the word?", w, w[0]
    for _ in range(PER_TASK):
        question, answer = rng.choice(FACTS)
        yield question, "", answer


def main() -> None:
    rng = random.Random(SEED)
    records = [{"instruction": i, "input": x, "output": y} for i, x, y in tasks(rng)]
    rng.shuffle(records)
    with OUT.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {len(records)} examples to {OUT}")


if __name__ == "__main__":
    main()
