"""Data: load records, split off validation, render each record's format, tokenize, pack.

Formats (--data-format; `auto` detects from the first record, in this order): chat
(`messages`), alpaca (`instruction`/`output`, `input` optional), prompt-completion
(`prompt`/`completion`), text (`text`), and fields (--prompt-field/--response-field with an
optional --prompt-template). Every record must then have its format's fields; the first that
does not ends the run with its record number (and line, for JSON lines) and the missing field.
A record becomes segments of text, each trained on or not: `<bos> prompt | response <eos>` for
the single-turn formats (the prompt untrained under --mask-prompt), and for chat the tokenizer's
chat template, cut where each assistant turn starts and ends (what an assistant turn adds to
the conversation, after the generation prompt, is trained; everything else is not). Segments
are tokenized separately, so a response's tokens are exactly what the model produces after the
prompt at inference.

Validation: a Hugging Face dataset's (or a dataset directory's) `validation` split, else its
`test` split (a split without records is passed over, with a warning); otherwise the records
whose content hash (SHA-256 of the canonical JSON) falls below --val-fraction (at least one). The split depends on nothing but the records: the same at
every world size and --seed, duplicates never straddle it, and appending records does not move
old ones.

Packing: documents (tokenized records) are placed whole, in order, into rows of --seq-len
tokens; a document that does not fit in the current row's remaining space starts the next row,
and the rest of the row is padding (no loss). A document longer than a row is cut to --seq-len
tokens (counted in `examples_truncated` / `tokens_cropped`, and a warning). Inside a row, each
document's position ids restart at 0, and the target of each document's last token is -100.

How packing and attention interact: position ids that restart mark the documents. On CUDA
the loss forward builds a block-causal FlexAttention mask from them (training/attention.py);
otherwise (`--packed-attention sdpa`, or the CPU) a dense block-diagonal causal mask for a
masked SDPA kernel (`attention.dense_document_mask`). Either way a document attends only to its own earlier tokens, at the positions it
would have alone, and no target crosses a boundary: its logits and loss are those of the
document alone (tests/training/test_data.py checks it to 1e-5 on the tiny model for both paths,
and that the test fails when the positions do not restart). A batch whose rows each hold one
document (and padding) passes no position ids (`PackedData.batch`): the plain causal kernel.
The dense path costs a kernel over the whole row and a mask per layer; FlexAttention skips the
tiles between documents (docs/performance.md, "Packed rows"). Both pay for the padding. Measured on the shipped dataset's 381 training examples (195..285
tokens each with the tiny preset's byte tokenizer): at --seq-len 512, 228 rows (most holding two
examples), 17.9 % padding, nothing truncated; at 256, 305 rows, 3.8 % padding, 88 examples
truncated, 76 of which lose their whole response (dropped under --mask-prompt). At Llama 2's
4096 and samsum's few hundred tokens per example, the padding is at most one example per row.

Order: a global permutation of the rows per epoch, seeded by (--seed, epoch) and independent of
the world size; each optimizer step takes the next ``world x batch x grad_accum`` rows of it,
micro-step m of rank r taking the slice ``[(m * world + r) * batch, ... + batch)``. The position
(epoch, rows consumed in the epoch) is saved in checkpoints, so a resume continues the same
order, also with another world size.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from training import hub
from training.config import DataConfig, JobConfig
from training.dist import DistEnv
from training.errors import UserError

log = logging.getLogger(__name__)

IGNORE_INDEX = -100
LOCAL_SUFFIXES = (".json", ".jsonl", ".parquet")
VALIDATION_SPLITS = ("validation", "test")
"""A dataset's own held-out splits, in order of preference."""

PROMPT_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")
"""The Stanford Alpaca template."""

FORMAT_FIELDS = {
    "chat": ("messages",),
    "alpaca": ("instruction", "output"),
    "prompt-completion": ("prompt", "completion"),
    "text": ("text",),
}
"""The fields each format needs, in auto-detection order (alpaca datasets such as
tatsu-lab/alpaca also carry a rendered `text`: the structured fields win)."""

LITERAL_BRACES = " (a literal brace in the template is written {{ or }})"
"""What a template with JSON or code in it needs: str.format reads every single brace as a
field."""

Segments = list[tuple[str, bool]]
"""A rendered record: (text, trained) pieces in order."""


# ----------------------------------------------------------------------------- loading
@dataclass(frozen=True)
class Table:
    """The records of one file or split, and where each came from (for error messages)."""

    name: str
    records: list[dict]
    lines: list[int] | None = None
    """Line number of each record in a JSON-lines file."""

    def where(self, i: int) -> str:
        line = f" (line {self.lines[i]})" if self.lines else ""
        return f"{self.name}: record {i + 1}{line}"


def _json_error(path: Path, e: json.JSONDecodeError, line: int | None = None) -> UserError:
    return UserError(f"--dataset {path}: line {line or e.lineno} is not valid JSON: {e.msg} "
                     f"(column {e.colno})")


def _suffix(path: Path) -> str:
    """A file's type, as LOCAL_SUFFIXES names it (TRAIN.JSONL is JSON lines too)."""
    return path.suffix.lower()


def _read_local(path: Path) -> Table:
    name = f"--dataset {path}"
    if _suffix(path) == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return Table(name, pq.read_table(path).to_pylist())
        except (pa.ArrowException, OSError) as e:
            raise UserError(f"{name}: not a readable parquet file: {e}") from None
    raw = path.read_bytes()
    # utf-8-sig: with or without the byte-order mark editors and spreadsheet exports write;
    # UTF-16 with its mark: what Windows PowerShell 5's `>` and Notepad's "Unicode" write
    utf16 = raw[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
    try:
        text = raw.decode("utf-16" if utf16 else "utf-8-sig")
    except UnicodeDecodeError as e:
        line = e.object[:e.start].count(b"\n") + 1
        raise UserError(f"{name}: line {line} is not {'UTF-16' if utf16 else 'UTF-8'} text "
                        f"({e.reason} at byte {e.start}); convert the file to UTF-8 (e.g. iconv "
                        "-f latin1 -t utf-8)") from None
    document = text.lstrip()[:1]
    if _suffix(path) == ".json" and document == "[":
        try:
            records = json.loads(text)
        except json.JSONDecodeError as e:
            raise _json_error(path, e) from None
        table = Table(name, records)
        for i, record in enumerate(records):
            if not isinstance(record, dict):
                raise UserError(f"{table.where(i)}: is a JSON {type(record).__name__}, not an "
                                "object")
        return table
    if _suffix(path) == ".json" and document == "{":
        record = _one_object(path, text)
        if record is not None:
            return Table(name, [record])
    return _json_lines(path, text)


def _one_object(path: Path, text: str) -> dict | None:
    """The record of a .json file that is one JSON object (one record, on one line or
    indented over many); None where the text is JSON lines (more than one value). An object
    with a syntax error, whose first line is not JSON on its own, is that error."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":
            return None
        try:
            json.loads(next(line for line in text.splitlines() if line.strip()))
        except json.JSONDecodeError:
            raise _json_error(path, e) from None
        return None


def _json_lines(path: Path, text: str) -> Table:
    """One JSON object per line; blank lines skipped."""
    name = f"--dataset {path}"
    records, lines = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise _json_error(path, e, number) from None
        if not isinstance(record, dict):
            raise UserError(f"{name}: line {number} is a JSON {type(record).__name__}, not an "
                            "object (one record per line)")
        records.append(record)
        lines.append(number)
    return Table(name, records, lines)


def check_local_dataset(cfg: DataConfig) -> Path | None:
    """The dataset as a local path (file or dataset directory), None for a Hub name; UserError
    for a path that does not exist or a file type we cannot read."""
    name = cfg.dataset
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if _suffix(path) in LOCAL_SUFFIXES or hub.looks_local(name) or path.exists():
        if not path.is_file():
            raise UserError(f"--dataset {name}: no such file; pass a .json/.jsonl/.parquet "
                            "file, a dataset directory or a Hugging Face dataset name")
        if _suffix(path) not in LOCAL_SUFFIXES:
            raise UserError(f"--dataset {name}: unsupported file type; use .json, .jsonl or "
                            ".parquet")
        return path
    return None


def load_tables(cfg: DataConfig, cache_dir: str | None) -> tuple[Table, Table | None]:
    """The training records and the dataset's own held-out split (None if it has none)."""
    path = check_local_dataset(cfg)
    if path is not None and path.is_file():
        return _read_local(path), None
    return _load_dataset_dict(cfg.dataset, str(path) if path else cfg.dataset,
                              cfg.dataset_split, cache_dir)


def _load_dataset_dict(name: str, source: str, split: str,
                       cache_dir: str | None) -> tuple[Table, Table | None]:
    """A Hub dataset (or a local directory laid out like one) through `datasets.load_dataset`:
    every split, so that its validation split is found."""
    import datasets
    from datasets.exceptions import DatasetGenerationError, DatasetNotFoundError

    token = hub.hf_token()
    try:
        splits = datasets.load_dataset(source, cache_dir=cache_dir, token=token)
    except DatasetNotFoundError:
        hint = "" if token else " (a gated or private one also needs HF_TOKEN)"
        raise UserError(f"--dataset {name}: no such dataset on the Hugging Face Hub{hint}, and "
                        "no such local file") from None
    except ConnectionError as e:
        raise UserError(f"--dataset {name}: cannot download it: {e}") from None
    except FileNotFoundError as e:  # a directory without data files
        raise UserError(f"--dataset {name}: {e}; a dataset directory holds data files such as "
                        "train.jsonl (and validation.jsonl) or data/train-*.parquet") from None
    except (DatasetGenerationError, ValueError) as e:  # a file that does not parse, a split
        raise _data_file_error(name, Path(source), cache_dir, e) from None  # no records, ...
    return split_tables(name, dict(splits.items()), split)


def _data_file_error(name: str, directory: Path, cache_dir: str | None,
                     e: Exception) -> UserError:
    """What `datasets` could not load in a dataset directory: the first of its
    .json/.jsonl/.parquet files that our own reader refuses (its file and line) or that holds
    no records; else what `datasets` said (for a directory whose files all read: about the
    copy it prepared in its cache)."""
    cause = e.__cause__ or e
    said = f"{type(cause).__name__}: {str(cause).splitlines()[0]}"
    if not directory.is_dir():
        return UserError(f"--dataset {name}: {said}")
    for path in sorted(directory.rglob("*")):
        hidden = any(part.startswith(".") for part in path.relative_to(directory).parts)
        if _suffix(path) in LOCAL_SUFFIXES and not hidden and not _read_local(path).records:
            return UserError(f"--dataset {name}: {path.relative_to(directory)} holds no records")
    import datasets

    try:
        cache = datasets.load_dataset_builder(str(directory), cache_dir=cache_dir).cache_dir
    except Exception:  # noqa: BLE001 (only the hint's path is lost)
        cache = "its folder in the datasets cache"
    return UserError(f"--dataset {name}: {said}; its files read, so the copy `datasets` "
                     f"prepared from them may be damaged: delete {cache} to have it prepared "
                     "again")


def split_tables(name: str, splits: dict, split: str) -> tuple[Table, Table | None]:
    """(training split, held-out split or None) of a dataset's splits (`datasets.Dataset`s or
    lists of records), by name."""
    if split not in splits:
        raise UserError(f"--dataset-split {split}: {name} has no such split; it has "
                        f"{', '.join(sorted(splits))}")

    def table(key: str) -> Table:
        rows = splits[key]
        return Table(f"--dataset {name} split {key}",
                     rows if isinstance(rows, list) else rows.to_list())

    named = [s for s in VALIDATION_SPLITS if s in splits and s != split]
    empty = [s for s in named if not len(splits[s])]  # a Hub split can have zero rows
    held_out = next((s for s in named if s not in empty), None)
    if empty:
        log.warning("--dataset %s: its %s %s no records; validation uses %s", name,
                    " and ".join(empty), "split has" if len(empty) == 1 else "splits have",
                    f"its {held_out} split" if held_out else
                    "--val-fraction of the training records, held out by content hash")
    return table(split), table(held_out) if held_out else None


def content_hash(record: dict) -> float:
    """A record's place in [0, 1): SHA-256 of its canonical JSON."""
    canonical = json.dumps(record, sort_keys=True, ensure_ascii=False, default=str)
    return int.from_bytes(hashlib.sha256(canonical.encode()).digest()[:8], "big") / 2**64


def split_off_validation(table: Table, fraction: float) -> tuple[list[int], list[int]]:
    """(training, validation) record indices: validation = the records whose content hash is
    below `fraction` (at least the lowest one); see the module docstring."""
    if fraction <= 0:
        return list(range(len(table.records))), []
    hashes = [content_hash(r) for r in table.records]
    val = {i for i, h in enumerate(hashes) if h < fraction}
    if not val and hashes:
        val = {min(range(len(hashes)), key=hashes.__getitem__)}
    train = [i for i in range(len(hashes)) if i not in val]
    if not train:
        raise UserError(f"{table.name}: {len(hashes)} record(s) is too few to hold out a "
                        "validation set; add data or pass --val-fraction 0")
    return train, sorted(val)


# ----------------------------------------------------------------------------- formats
def detect_format(table: Table) -> str:
    """The format of the table's first record (--data-format auto)."""
    first = table.records[0]
    for fmt, needed in FORMAT_FIELDS.items():
        if all(first.get(f) is not None for f in needed):
            return fmt
    nested = [k for k, v in first.items()
              if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)]
    wrapped = (f"; its field '{nested[0]}' holds a list of {len(first[nested[0]])} objects: if "
               "those are the records, give them as a JSON array or one per line (JSON lines)"
               if nested else "")
    raise UserError(
        f"{table.where(0)}: its fields ({', '.join(sorted(first)) or 'none'}) match no known "
        f"format (messages; instruction/output; prompt/completion; text){wrapped}; pass "
        "--prompt-field and --response-field (with --prompt-template) to map your fields")


def _field(record: dict, name: str, where: str, fmt: str, *, optional: bool = False) -> str:
    value = record.get(name)
    if value is None:
        if optional:
            return ""
        state = "is null" if name in record else "is missing"
        raise UserError(f"{where}: field '{name}' {state} (needed by the {fmt} format); the "
                        f"record has {', '.join(sorted(record)) or 'no fields'}")
    if not isinstance(value, str):
        raise UserError(f"{where}: field '{name}' must be a string, got "
                        f"{type(value).__name__} {json.dumps(value, default=str)[:60]}")
    return value


class Conversation(list):
    """A chat record's validated messages, and where the record came from (for the chat
    template's errors, which come later, with the tokenizer)."""

    def __init__(self, messages: list[dict], where: str):
        super().__init__(messages)
        self.where = where


def _messages(record: dict, where: str) -> Conversation:
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        state = "is missing" if "messages" not in record else "must be a non-empty list"
        raise UserError(f"{where}: field 'messages' {state} (format chat: a list of "
                        "{role, content}); the record has "
                        f"{', '.join(sorted(record)) or 'no fields'}")
    for j, m in enumerate(messages):
        if not isinstance(m, dict):
            raise UserError(f"{where}: messages[{j}] must be an object with role and content")
        for key in ("role", "content"):
            _field(m, key, f"{where}: messages[{j}]", "chat message")
    if not any(m["role"] == "assistant" for m in messages):
        raise UserError(f"{where}: no message has role 'assistant', so nothing would be "
                        "trained; chat records need at least one assistant turn")
    return Conversation([{"role": m["role"], "content": m["content"]} for m in messages], where)


def render(record: dict, fmt: str, cfg: DataConfig, where: str) -> Segments | list[dict]:
    """A record as (text, trained) segments; for chat, its validated messages (the template
    is applied in `chat_segments`, which needs the tokenizer)."""
    if fmt == "chat":
        return _messages(record, where)
    if fmt == "text":
        return [(_field(record, "text", where, fmt), True)]
    if fmt == "prompt-completion":
        return [(_field(record, "prompt", where, fmt), False),
                (_field(record, "completion", where, fmt), True)]
    if fmt == "alpaca":
        instruction = _field(record, "instruction", where, fmt)
        output = _field(record, "output", where, fmt)
        extra = _field(record, "input", where, fmt, optional=True)
        template = PROMPT_WITH_INPUT if extra else PROMPT_NO_INPUT
        return [(template.format(instruction=instruction, input=extra), False), (output, True)]
    assert fmt == "fields", fmt
    prompt = _field(record, cfg.prompt_field, where, fmt)
    response = _field(record, cfg.response_field, where, fmt)
    if cfg.prompt_template is not None:
        try:
            prompt = cfg.prompt_template.format_map(record)
        except KeyError as e:
            raise UserError(f"{where}: --prompt-template names {{{e.args[0]}}}, which the "
                            f"record lacks; it has {', '.join(sorted(record))}{LITERAL_BRACES}"
                            ) from None
        except (IndexError, AttributeError, TypeError, ValueError) as e:
            raise UserError(f"{where}: --prompt-template cannot render it: {e}{LITERAL_BRACES}"
                            ) from None
    return [(prompt, False), (response, True)]


def render_table(table: Table, indices: list[int], fmt: str, cfg: DataConfig) -> list:
    return [render(table.records[i], fmt, cfg, table.where(i)) for i in indices]


STANDARD_ROLES = ("system", "user", "assistant", "tool")
"""The roles chat datasets use (OpenAI's and transformers' message format), offered to the user
when the template refuses one."""
_PROBE = "fsdp-eks-role-probe"


def _renders(tokenizer, role: str) -> bool:
    """Whether the chat template renders a turn of ``role``: some conversation around it
    renders without an error and shows its text. (Llama 2's template raises on a `tool` turn
    where a user turn is due, and silently drops it where an assistant turn is due.)"""
    import jinja2

    turn = {"role": role, "content": _PROBE}
    for conversation in ([turn], [turn, {"role": "user", "content": "u"}],
                         [{"role": "user", "content": "u"}, turn],
                         [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
                          turn]):
        try:
            if _PROBE in tokenizer.apply_chat_template(conversation, tokenize=False):
                return True
        except jinja2.TemplateError:
            continue
    return False


def check_roles(conversations: list[list[dict]], tokenizer) -> None:
    """Every role of the data must be one the chat template renders; the first record with one
    that it does not is named, with the role and the roles it renders."""
    roles = {m["role"] for messages in conversations for m in messages}
    refused = {role for role in roles if not _renders(tokenizer, role)}
    if not refused:
        return
    rendered = [r for r in dict.fromkeys([*STANDARD_ROLES, *sorted(roles)]) if r not in refused
                and _renders(tokenizer, r)]
    for messages in conversations:
        for j, m in enumerate(messages):
            if m["role"] in refused:
                known = ", ".join(rendered) or "none of " + ", ".join(STANDARD_ROLES)
                raise UserError(
                    f"{getattr(messages, 'where', 'a chat record')}: messages[{j}] has role "
                    f"'{m['role']}', which the model's chat template does not render (it raises "
                    f"an error or drops the turn); it renders {known}. Map that role to one of "
                    "those, or drop those turns")


def chat_segments(messages: list[dict], tokenizer) -> Segments:
    """`template_segments` of a conversation; an error of the chat template (e.g. roles that
    do not alternate as it requires) names the record."""
    import jinja2

    try:
        return template_segments(messages, tokenizer)
    except jinja2.TemplateError as e:
        raise UserError(f"{getattr(messages, 'where', 'a chat record')}: the model's chat "
                        f"template refuses this conversation (roles "
                        f"{', '.join(m['role'] for m in messages)}): {e}") from None


def template_segments(messages: list[dict], tokenizer) -> Segments:
    """The chat template's text of a conversation, cut into segments: each assistant turn's
    text (after the generation prompt, up to and including its end-of-turn marker) trained,
    the rest not.

    Works for templates that render a conversation's prefix as a prefix of the whole (Llama 2/3,
    Mistral, Zephyr, ChatML); a template that rewrites earlier turns (e.g. one that strips
    earlier reasoning) is refused, since the trained tokens could not be located exactly."""
    def text(upto: int, generation_prompt: bool) -> str:
        if upto == 0 and not generation_prompt:
            return ""
        return tokenizer.apply_chat_template(messages[:upto], tokenize=False,
                                             add_generation_prompt=generation_prompt)

    segments: Segments = []
    done = ""
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before, after = text(i, True), text(i + 1, False)
        if not (before.startswith(done) and after.startswith(before)):
            raise UserError("the tokenizer's chat template does not render a conversation's "
                            "first turns as a prefix of the whole, so the assistant tokens "
                            "cannot be located exactly; use a template that does (Llama, "
                            "Mistral, ChatML) or --data-format fields")
        segments += [(before[len(done):], False), (after[len(before):], True)]
        done = after
    whole = text(len(messages), False)
    if not whole.startswith(done):
        raise UserError("the tokenizer's chat template renders the whole conversation "
                        "differently from its turns; use --data-format fields")
    return segments + [(whole[len(done):], False)]


# ----------------------------------------------------------------------------- tokenizing
def tokenize(examples: list, tokenizer, mask_prompt: bool, chat: bool) -> list[tuple[list[int],
                                                                                      list[bool]]]:
    """Documents: token ids and, per token, whether it is trained as a target.

    Single-turn formats get `<bos>` before and `<eos>` after; a chat template writes its own
    special tokens. Without --mask-prompt every token is trained."""
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise UserError("--data-format chat: the model's tokenizer has no chat template; use "
                            "a chat/instruct model (e.g. meta-llama/Llama-2-7b-chat-hf) or "
                            "another format")
        check_roles(examples, tokenizer)
        examples = [chat_segments(m, tokenizer) for m in examples]
    texts = [t for segments in examples for t, _ in segments]
    ids = iter(tokenizer(texts, add_special_tokens=False)["input_ids"]) if texts else iter(())
    bos = [] if chat or tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
    eos = [] if chat or tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    docs = []
    for segments in examples:
        tokens, trained = list(bos), [False] * len(bos)
        for _, is_response in segments:
            piece = next(ids)
            tokens += piece
            trained += [is_response or not mask_prompt] * len(piece)
        docs.append((tokens + eos, trained + [True] * len(eos)))
    return docs


# ----------------------------------------------------------------------------- packing
@dataclass(frozen=True)
class PackedData:
    """Packed rows: inputs, targets and position ids, each [num_rows, seq_len] int64, and
    the number of documents in each row ([num_rows], padding not counted)."""

    inputs: torch.Tensor
    targets: torch.Tensor
    positions: torch.Tensor
    documents: torch.Tensor
    stats: dict

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def batch(self, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(inputs, targets[, positions]) of these rows. Without position ids when no row
        holds two documents: a lone document followed by padding needs no document mask
        (nothing attends forward, and the padding has no targets), so the model takes the
        plain causal kernel and positions 0..n-1, which are the document's own."""
        batch = (self.inputs[rows], self.targets[rows])
        if bool((self.documents[rows] > 1).any()):
            batch += (self.positions[rows],)
        return batch


def pack(docs: list[tuple[list[int], list[bool]]], seq_len: int, pad_id: int) -> PackedData:
    """Pack documents whole into rows with per-document positions (see the module docstring)."""
    rows: list[list[tuple[list[int], list[bool]]]] = [[]]
    used = truncated = cropped = skipped = 0
    for tokens, trained in docs:
        if len(tokens) > seq_len:
            truncated += 1
            cropped += len(tokens) - seq_len
            tokens, trained = tokens[:seq_len], trained[:seq_len]
        if not any(trained[1:]):
            skipped += 1  # nothing left to learn from (e.g. the response was cut off)
            continue
        if used + len(tokens) > seq_len:
            rows.append([])
            used = 0
        rows[-1].append((tokens, trained))
        used += len(tokens)
    rows = [r for r in rows if r]
    inputs = torch.full((len(rows), seq_len), pad_id, dtype=torch.long)
    targets = torch.full((len(rows), seq_len), IGNORE_INDEX, dtype=torch.long)
    positions = torch.zeros((len(rows), seq_len), dtype=torch.long)
    documents = torch.tensor([len(row) for row in rows], dtype=torch.long)
    for r, row in enumerate(rows):
        start = 0
        for tokens, trained in row:
            n = len(tokens)
            t = torch.tensor(tokens)
            inputs[r, start:start + n] = t
            positions[r, start:start + n] = torch.arange(n)
            targets[r, start:start + n - 1] = torch.where(torch.tensor(trained[1:]), t[1:],
                                                          IGNORE_INDEX)
            start += n
        positions[r, start:] = torch.arange(seq_len - start)  # padding: its own block
    cells = max(1, len(rows) * seq_len)
    stats = {"examples": len(docs), "tokens": sum(len(t) for t, _ in docs), "sequences": len(rows),
             "examples_truncated": truncated, "tokens_cropped": cropped,
             "examples_without_targets": skipped,
             "padding_fraction": round(1 - sum(len(t) for row in rows for t, _ in row) / cells, 4),
             "target_fraction": round(float((targets != IGNORE_INDEX).sum()) / cells, 4)}
    return PackedData(inputs=inputs, targets=targets, positions=positions, documents=documents,
                      stats=stats)


# ----------------------------------------------------------------------------- the whole path
@dataclass(frozen=True)
class Records:
    """The rendered training and validation examples (before tokenization) and their origin."""

    fmt: str
    train: list
    val: list
    val_source: str


def prepare(cfg: DataConfig, cache_dir: str | None) -> Records:
    """Load, split and render every record (no tokenizer yet): every format error is raised
    here, before the model is fetched."""
    table, held_out = load_tables(cfg, cache_dir)
    if not table.records:
        raise UserError(f"{table.name}: the dataset is empty")
    fmt = detect_format(table) if cfg.data_format == "auto" else cfg.data_format
    if cfg.val_fraction == 0:
        train_idx, val_idx, val_table, source = list(range(len(table.records))), [], table, "off"
    elif held_out is not None:
        train_idx, val_table = list(range(len(table.records))), held_out
        val_idx, source = list(range(len(held_out.records))), held_out.name
    else:
        (train_idx, val_idx), val_table = split_off_validation(table, cfg.val_fraction), table
        source = f"{len(val_idx)} records held out of {table.name} by content hash"
    return Records(fmt=fmt, train=render_table(table, train_idx, fmt, cfg),
                   val=render_table(val_table, val_idx, fmt, cfg), val_source=source)


def pack_records(examples: list, tokenizer, cfg: DataConfig, chat: bool) -> PackedData:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return pack(tokenize(examples, tokenizer, cfg.mask_prompt, chat), cfg.seq_len, pad)


def load_records(cfg: JobConfig, env: DistEnv) -> Records:
    """Load, split and check every record, before the model is fetched: a bad record or file
    fails the run in seconds, with the same message on every rank."""
    loaded: dict[str, Records] = {}

    def load() -> str:
        loaded["records"] = prepare(cfg.data, cfg.model.cache_dir)
        return ""

    hub.on_node_leader_first(env, load)  # one process per node fills the datasets cache first
    records = loaded.get("records") or prepare(cfg.data, cfg.model.cache_dir)
    log.info("data: %s format, %d training and %d validation records (validation: %s)",
             records.fmt, len(records.train), len(records.val), records.val_source)
    return records


def pack_training_data(cfg: JobConfig, records: Records, tokenizer,
                       env: DistEnv) -> tuple[PackedData, PackedData | None, StepSampler]:
    """Tokenize and pack the training and validation examples; the order of the training
    rows."""
    chat = records.fmt == "chat"
    data = pack_records(records.train, tokenizer, cfg.data, chat)
    if not len(data):
        raise UserError(f"--dataset: no training example keeps a trained token within --seq-len "
                        f"{cfg.data.seq_len} ({json.dumps(data.stats)}); raise --seq-len")
    log.info("training data: %s", json.dumps(data.stats))
    if data.stats["examples_truncated"]:
        log.warning("%d of %d training examples are longer than --seq-len %d and lose their "
                    "end (%d tokens)", data.stats["examples_truncated"], data.stats["examples"],
                    cfg.data.seq_len, data.stats["tokens_cropped"])
    val = pack_records(records.val, tokenizer, cfg.data, chat) if records.val else None
    if val is not None:
        log.info("validation data: %s", json.dumps(val.stats))
    if val is not None and not len(val):
        log.warning("no validation example keeps a trained token within --seq-len: no "
                    "evaluation")
        val = None
    sampler = StepSampler(len(data), env.world_size, env.rank, cfg.train.batch_size,
                          cfg.train.grad_accum, cfg.train.seed)
    return data, val, sampler


class StepSampler:
    """Deterministic, world-size-independent order of rows; see the module docstring."""

    def __init__(self, num_blocks: int, world_size: int, rank: int, batch_size: int,
                 grad_accum: int, seed: int):
        self.num_blocks, self.world, self.rank = num_blocks, world_size, rank
        self.batch, self.accum, self.seed = batch_size, grad_accum, seed
        self.global_batch = world_size * batch_size * grad_accum
        if num_blocks < self.global_batch:
            raise UserError(
                f"--dataset has {num_blocks} packed sequences, fewer than one global batch of "
                f"{self.global_batch} (world {world_size} x --batch-size {batch_size} x "
                f"--grad-accum {grad_accum}); lower --seq-len, --batch-size or --grad-accum, or "
                "use more data")
        self._perm_epoch, self._perm = -1, torch.empty(0, dtype=torch.long)

    @property
    def steps_per_epoch(self) -> int:
        return self.num_blocks // self.global_batch

    def remaining_steps(self, epoch: int, offset: int, epochs: int) -> int:
        """Optimizer steps left from position (epoch, offset) to the end of `epochs` epochs."""
        if epoch >= epochs:
            return 0
        this_epoch = (self.num_blocks - offset) // self.global_batch
        return this_epoch + (epochs - epoch - 1) * self.steps_per_epoch

    def epoch_done(self, offset: int) -> bool:
        """True when position `offset` leaves less than a global batch in the epoch: the step
        that reached it was the epoch's last."""
        return offset + self.global_batch > self.num_blocks

    def next_step(self, epoch: int, offset: int) -> tuple[list[torch.Tensor], int, int]:
        """This rank's micro-batch row indices for the step at (epoch, offset), and the
        position after it. Moves to the next epoch when fewer than a global batch remain."""
        if self.epoch_done(offset):
            epoch, offset = epoch + 1, 0
        if self._perm_epoch != epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm, self._perm_epoch = torch.randperm(self.num_blocks, generator=g), epoch
        chunk = self._perm[offset:offset + self.global_batch]
        micro = [chunk[(m * self.world + self.rank) * self.batch:
                       (m * self.world + self.rank + 1) * self.batch] for m in range(self.accum)]
        return micro, epoch, offset + self.global_batch


def eval_rows(num_rows: int, world_size: int, rank: int, batch_size: int) -> list[list[int]]:
    """This rank's validation rows, in batches; every rank gets the same number of batches
    (FSDP's forward is collective), so a batch index of -1 stands for a row without targets."""
    mine = list(range(rank, num_rows, world_size))
    batches = -(-num_rows // (world_size * batch_size))
    mine += [-1] * (batches * batch_size - len(mine))
    return [mine[b * batch_size:(b + 1) * batch_size] for b in range(batches)]
