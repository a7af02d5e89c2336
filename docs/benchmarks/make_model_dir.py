"""Write a random-weight Hugging Face model directory of a benchmark shape, like a downloaded
checkpoint: config.json, fp16 safetensors shards of at most 5 GB with an index, and the package's
byte tokenizer (the loader needs a tokenizer beside the weights; its vocabulary does not matter
for random token ids).  python docs/benchmarks/make_model_dir.py llama2-7b DIR

Weights are initialised on the GPU (seconds for 7B) and saved with save_pretrained."""

import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from training import tiny
from training.bench import SHAPES


def main(shape: str, out: str) -> None:
    started = time.perf_counter()
    config = LlamaConfig(**SHAPES[shape], max_position_embeddings=4096, rms_norm_eps=1e-5,
                         tie_word_embeddings=False)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.float16)
    built = time.perf_counter() - started
    model.save_pretrained(out, max_shard_size="5GB")
    tiny.build_tokenizer().save_pretrained(out)
    print(f"{shape}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters, "
          f"built in {built:.1f} s, saved to {out} in {time.perf_counter() - started - built:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
