"""The data path in process: every format's masking token by token, packing against attention,
the validation split, evaluation's row split, and every bad input's message.

The tiny preset's tokenizer is byte-level (token = byte + 3, <s> = 1, </s> = 2), so the
expected tokens and labels are written out by hand from the record's text."""

from __future__ import annotations

import codecs
import json
import logging
import re
import subprocess
from pathlib import Path

import pytest
import torch

from tests.training.conftest import finetune_in_one_process, held_out
from training import config as C
from training import dataset, tiny
from training.errors import UserError

pytestmark = pytest.mark.timeout(120)
IGNORE = dataset.IGNORE_INDEX
BOS, EOS = 1, 2


@pytest.fixture(scope="module")
def tokenizer():
    return tiny.build_tokenizer()


def ids(text: str) -> list[int]:
    """The byte tokenizer by hand."""
    return [b + tiny.BYTE_OFFSET for b in text.encode()]


def expected(prompt: str, response: str, mask_prompt: bool = True) -> tuple[list[int], list[int]]:
    """(inputs, labels) of `<s> prompt response </s>` alone in a row: label j is token j+1 when
    that token is trained, -100 otherwise; the last token has no target."""
    tokens = [BOS] + ids(prompt) + ids(response) + [EOS]
    trained = [False] + [not mask_prompt] * len(ids(prompt)) + [True] * (len(ids(response)) + 1)
    labels = [t if ok else IGNORE for t, ok in zip(tokens[1:], trained[1:])] + [IGNORE]
    return tokens, labels


def packed_row(records: list[dict], tokenizer, seq_len: int = 2048, **data) -> tuple[list, list]:
    """(inputs, labels) of the first packed row of `records`, padding stripped."""
    cfg = C.DataConfig(seq_len=seq_len, **data)
    table = dataset.Table("test", records)
    fmt = dataset.detect_format(table) if cfg.data_format == "auto" else cfg.data_format
    examples = dataset.render_table(table, list(range(len(records))), fmt, cfg)
    packed = dataset.pack_records(examples, tokenizer, cfg, fmt == "chat")
    n = int((packed.positions[0] == 0).nonzero()[-1]) if len(records) == 1 else seq_len
    return packed.inputs[0, :n].tolist(), packed.targets[0, :n].tolist()


# ----------------------------------------------------------------------------- formats
@pytest.mark.parametrize("record, data, prompt, response", [
    ({"instruction": "Add.", "input": "2 and 3", "output": "5"}, {},
     dataset.PROMPT_WITH_INPUT.format(instruction="Add.", input="2 and 3"), "5"),
    ({"instruction": "Say hi.", "output": "hi"}, {},
     dataset.PROMPT_NO_INPUT.format(instruction="Say hi."), "hi"),
    ({"prompt": "Capital of France? ", "completion": "Paris"}, {}, "Capital of France? ", "Paris"),
    ({"dialogue": "A: hi\nB: bye", "summary": "They greet.", "id": 3},
     {"prompt_field": "dialogue", "response_field": "summary",
      "prompt_template": "Summarize this dialog:\n{dialogue}\n---\nSummary:\n"},
     "Summarize this dialog:\nA: hi\nB: bye\n---\nSummary:\n", "They greet."),
    ({"q": "2+2?", "a": "4"}, {"prompt_field": "q", "response_field": "a"}, "2+2?", "4"),
], ids=["alpaca", "alpaca-no-input", "prompt-completion", "fields-template", "fields-plain"])
def test_single_turn_formats_mask_the_prompt_token_by_token(record, data, prompt, response,
                                                           tokenizer):
    """Checked against the byte tokenizer by hand: <s> prompt response </s>, labels -100 on
    the prompt and the token before it, the response's tokens and </s> as labels."""
    got = packed_row([record], tokenizer, **data)
    assert got == expected(prompt, response)


def test_text_format_trains_every_token_and_no_mask_prompt_trains_the_prompt(tokenizer):
    """Checked against the byte tokenizer by hand: a `text` record is all response; with
    --no-mask-prompt an alpaca prompt is trained too."""
    assert packed_row([{"text": "whole doc"}], tokenizer) == expected("", "whole doc")
    record = {"prompt": "Q? ", "completion": "A."}
    assert packed_row([record], tokenizer, mask_prompt=False) == expected("Q? ", "A.", False)


def test_chat_trains_on_both_assistant_turns_and_nothing_else(tokenizer):
    """Checked against the tiny preset's chat template written out by hand
    (<s><|role|>\\ncontent</s> per turn): the labels are exactly the two assistant turns'
    content and </s>; system, user and the assistant headers carry -100."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4"}]
    inputs, labels = packed_row([{"messages": messages}], tokenizer)
    pieces = [("<|system|>\nBe brief.", False), ("</s>", False), ("<|user|>\nHi", False),
              ("</s>", False), ("<|assistant|>\n", False), ("Hello", True), ("</s>", True),
              ("<|user|>\n2+2?", False), ("</s>", False), ("<|assistant|>\n", False),
              ("4", True), ("</s>", True)]
    tokens, trained = [BOS], [False]
    for text, ok in pieces:
        piece = [EOS] if text == "</s>" else ids(text)
        tokens += piece
        trained += [ok] * len(piece)
    assert inputs == tokens
    assert labels == [t if ok else IGNORE for t, ok in zip(tokens[1:], trained[1:])] + [IGNORE]
    assert tokenizer.decode([t for t in labels if t != IGNORE]) == "Hello</s>4</s>"


def test_auto_detection_prefers_structured_fields():
    """Checked against the documented order: messages, then alpaca (tatsu-lab/alpaca also
    carries a rendered `text`), prompt/completion, text."""
    detect = lambda record: dataset.detect_format(dataset.Table("t", [record]))  # noqa: E731
    assert detect({"messages": [], "text": "x"}) == "chat"
    assert detect({"instruction": "i", "output": "o", "text": "rendered"}) == "alpaca"
    assert detect({"prompt": "p", "completion": "c"}) == "prompt-completion"
    assert detect({"text": "t"}) == "text"


def test_prompt_field_implies_the_fields_format():
    """Checked against the documented rule: --prompt-field/--response-field with the default
    auto format mean fields; the command line round-trips."""
    cfg = C.parse_args(["--prompt-field", "dialogue", "--response-field", "summary"])
    assert cfg.data.data_format == "fields"
    assert C.parse_args(C.to_argv(cfg)) == cfg


# ----------------------------------------------------------------------------- packing
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
"""The attention tests run on the GPU where there is one (the FlexAttention kernel the package
trains with is compiled there; the CPU runs its unfused forward)."""


@pytest.mark.parametrize("path", ["sdpa", "flex"])
def test_packed_document_has_the_loss_it_has_alone(path, tokenizer):
    """Checked against the document alone: packed after another one in the same row, a
    document's per-token losses on the tiny model equal its losses alone within 1e-5, because
    its position ids restart and attention is masked per document: by transformers' dense
    block-diagonal mask (sdpa) or by the block mask for FlexAttention, both the package's own
    (training/attention.py; on a GPU through compiled decoder layers, as in training). The
    same row with ordinary positions (0..n-1, one causal block) differs by more than 1e-3: the
    check can see cross-document attention."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from training import attention

    torch.manual_seed(0)
    model = LlamaForCausalLM._from_config(
        LlamaConfig(**tiny.LLAMA_KWARGS), attn_implementation=attention.register()).eval()
    model.to(DEVICE)
    if path == "flex" and DEVICE.type == "cuda":
        for layer in model.model.layers:
            layer.compile()
    first = expected("Below is a long first document. ", "It has many tokens to attend to.")
    second = expected("Second: ", "short answer")
    docs = [(first[0], [False] + [True] * (len(first[0]) - 1)),
            (second[0], [False] + [True] * (len(second[0]) - 1))]
    packed, alone = dataset.pack(docs, 128, 0), dataset.pack(docs[1:], 128, 0)
    assert len(packed) == 1 and packed.positions[0, len(first[0])] == 0
    assert packed.documents.tolist() == [2] and alone.documents.tolist() == [1]

    def token_losses(data, positions):
        positions = positions.to(DEVICE)
        mask = attention.attention_mask(positions, block=path == "flex")
        with torch.no_grad():
            hidden = model.model(input_ids=data.inputs.to(DEVICE), position_ids=positions,
                                 attention_mask=mask, use_cache=False).last_hidden_state
            return torch.nn.functional.cross_entropy(
                model.lm_head(hidden)[0], data.targets[0].to(DEVICE), reduction="none").cpu()

    n0, n1 = len(first[0]), len(second[0])
    ref = token_losses(alone, alone.positions)[:n1]
    torch.testing.assert_close(token_losses(packed, packed.positions)[n0:n0 + n1], ref,
                               rtol=0, atol=1e-5)
    leaky = token_losses(packed, torch.arange(128)[None])[n0:n0 + n1]
    assert (leaky - ref).abs().max() > 1e-3


@pytest.mark.parametrize("seq_len, lengths, full_tiles", [
    (512, (20, 300), True), (640, (128, 129), False), (300, (30, 90), False),
    (384, (400, 500), True), (300, (400, 500), True)],
                         ids=["short-docs", "tile-sized-docs", "ragged-last-tile", "one-per-row", "one-per-ragged-row"])
def test_document_block_mask_is_the_one_create_block_mask_builds(seq_len, lengths, full_tiles):
    """Checked against PyTorch's own construction (`create_block_mask` evaluating the
    block-causal mask function on every element): the same empty, partial and full tiles for
    packings of short documents, documents one tile long, a sequence that ends mid-tile, and
    documents longer than a row."""
    from torch.nn.attention.flex_attention import create_block_mask

    from training import attention

    gen = torch.Generator().manual_seed(seq_len)
    docs = []
    while sum(len(t) for t, _ in docs) < 4 * seq_len:
        n = int(torch.randint(*lengths, (1,), generator=gen))
        docs.append(([5] * n, [True] * n))
    positions = dataset.pack(docs, seq_len, 0).positions[:3]
    ids = attention.document_ids(positions)
    ours = attention.document_block_mask(positions)
    ref = create_block_mask(lambda b, h, q, kv: (q >= kv) & (ids[b, q] == ids[b, kv]), 3, None,
                            seq_len, seq_len, device="cpu")
    for table in ("kv_num_blocks", "full_kv_num_blocks"):
        torch.testing.assert_close(getattr(ours, table), getattr(ref, table))
    assert torch.equal(ours.to_dense(), ref.to_dense())
    assert bool(ours.full_kv_num_blocks.sum() > 0) == full_tiles  # the case tests what it says


def test_rows_of_one_document_take_the_causal_kernel():
    """Checked against the packing rule: a batch passes position ids (and so a document mask)
    only when one of its rows holds two documents; a lone document before padding does not."""
    docs = [([1] + [5] * 60 + [2], [True] * 62), ([1] + [6] * 100 + [2], [True] * 102),
            ([1] + [7] * 10 + [2], [True] * 12)]
    data = dataset.pack(docs, 128, 0)
    assert data.documents.tolist() == [1, 2]
    alone, shared = data.batch(torch.tensor([0])), data.batch(torch.tensor([0, 1]))
    assert len(alone) == 2 and len(shared) == 3
    torch.testing.assert_close(shared[2], data.positions)


def test_the_package_builds_every_mask_and_transformers_none(monkeypatch):
    """Checked against transformers' stock SDPA model with the same weights: the loss forward
    of rows of one document (no position ids, no mask) gives the same loss, so attention is
    still causal; and neither it nor a packed batch's forward reaches transformers' mask
    builder, whose packed-sequence check reads a value back from the GPU every forward (a
    host sync per step). The stock model does reach it: the trap below can fire."""
    from transformers import LlamaConfig, LlamaForCausalLM, masking_utils

    from training import attention, loss

    torch.manual_seed(0)
    ours = LlamaForCausalLM._from_config(LlamaConfig(**tiny.LLAMA_KWARGS),
                                         attn_implementation=attention.register()).eval()
    stock = LlamaForCausalLM._from_config(LlamaConfig(**tiny.LLAMA_KWARGS),
                                          attn_implementation="sdpa").eval()
    stock.load_state_dict(ours.state_dict())
    loss.install_loss_forward(ours, fused=False)
    loss.install_loss_forward(stock, fused=False)
    tokens = torch.randint(3, tiny.LLAMA_KWARGS["vocab_size"], (2, 65),
                           generator=torch.Generator().manual_seed(1))
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    with torch.no_grad():
        expected = stock(inputs, labels)

    def trap(*args, **kwargs):
        raise AssertionError("transformers' packed-sequence check ran")

    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", trap)
    with torch.no_grad():
        torch.testing.assert_close(ours(inputs, labels), expected, rtol=1e-6, atol=0)
        positions = torch.cat([torch.arange(20), torch.arange(44)])[None].expand(2, -1)
        packed = ours(inputs, labels, positions)
        with pytest.raises(AssertionError, match="packed-sequence check"):
            stock(inputs, labels)
    assert abs(float(packed) - float(expected)) > 1e-3  # the packed rows were masked otherwise


def test_rows_hold_whole_documents_and_long_ones_are_cut(tokenizer):
    """Checked against the packing rule: documents are never split across rows; one longer
    than --seq-len is cut to it and counted; padding carries no loss."""
    docs = [([1] + [10] * 5, [False] + [True] * 5), ([1] + [11] * 5, [False] + [True] * 5),
            ([1] + [12] * 20, [False] + [True] * 20)]
    packed = dataset.pack(docs, 10, 0)
    assert packed.inputs.tolist()[:2] == [[1] + [10] * 5 + [0] * 4, [1] + [11] * 5 + [0] * 4]
    assert packed.inputs[2].tolist() == [1] + [12] * 9
    assert packed.stats["examples_truncated"] == 1 and packed.stats["tokens_cropped"] == 11
    assert (packed.targets[:2, 5:] == IGNORE).all()
    assert packed.targets[0].tolist()[:5] == [10] * 5


# ----------------------------------------------------------------------------- validation
def test_validation_split_is_the_content_hash_rule():
    """Checked against the documented rule computed here with hashlib: a record is held out
    when SHA-256 of its canonical JSON is below --val-fraction; duplicates land together and
    reordering the records does not move any."""
    records = [{"text": f"record {i}"} for i in range(400)] + [{"text": "record 7"}]
    train, val = dataset.split_off_validation(dataset.Table("t", records), 0.1)
    assert [records[i] for i in val] == held_out(records, 0.1)
    assert 20 < len(val) < 60 and sorted(train + val) == list(range(401))
    assert (7 in val) == (400 in val)
    shuffled = records[::-1]
    _, val_reversed = dataset.split_off_validation(dataset.Table("t", shuffled), 0.1)
    assert sorted(json.dumps(shuffled[i]) for i in val_reversed) == sorted(
        json.dumps(records[i]) for i in val)


def test_dataset_directory_with_validation_split(tmp_path):
    """Checked against the `datasets` library loading a directory laid out like a Hub dataset
    (train-/validation- parquet files written here): its validation split is the held-out set,
    its train split is trained on, and an unknown --dataset-split names the ones it has."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    data.mkdir()
    for split, n in (("train", 6), ("validation", 2)):
        rows = [{"dialogue": f"{split} {i}", "summary": f"s{i}"} for i in range(n)]
        pq.write_table(pa.Table.from_pylist(rows), data / f"{split}-00000-of-00001.parquet")
    cfg = C.DataConfig(dataset=str(data), prompt_field="dialogue", response_field="summary")
    records = dataset.prepare(cfg, str(tmp_path / "cache"))
    assert [segments[0][0] for segments in records.train] == [f"train {i}" for i in range(6)]
    assert [segments[0][0] for segments in records.val] == ["validation 0", "validation 1"]
    assert "split validation" in records.val_source
    with pytest.raises(UserError, match="--dataset-split dev: .* has no such split; it has "
                                        "train, validation"):
        dataset.prepare(C.DataConfig(dataset=str(data), dataset_split="dev",
                                     prompt_field="dialogue", response_field="summary"),
                        str(tmp_path / "cache"))


ALPACA_LINES = ['{"instruction": "i%d", "output": "o"}' % i for i in range(4)]


@pytest.mark.parametrize("files, message", [
    ({}, r"--dataset {d}: The directory at {d} doesn't contain any data files; a dataset "
         r"directory holds data files such as train.jsonl"),
    ({"README.md": "# my data\n"}, r"--dataset {d}: The directory at {d} doesn't contain any "
                                   r"data files"),
    ({"train.jsonl": "\n".join(ALPACA_LINES[:2] + ['{"instruction": "i'] + ALPACA_LINES[2:])},
     r"--dataset {d}/train.jsonl: line 3 is not valid JSON"),
    ({"train.jsonl": "\n".join(ALPACA_LINES), "validation.jsonl": ""},
     r"--dataset {d}: validation.jsonl holds no records"),
], ids=["empty", "no-data-files", "broken-line", "empty-validation-file"])
def test_a_dataset_directory_that_does_not_load_names_the_file(files, message, tmp_path):
    """Checked against the files written here into a dataset directory, which `datasets`
    loads: a directory without data files, one whose train.jsonl has a broken line 3, one
    whose validation.jsonl is empty. Each is one error naming the directory or the file (and
    line) (before: an EmptyDatasetError or DatasetGenerationError traceback, or `datasets`'
    'Instruction "validation" corresponds to no data!')."""
    directory = tmp_path / "data"
    directory.mkdir()
    for name, text in files.items():
        (directory / name).write_text(text)
    with pytest.raises(UserError, match=message.format(d=re.escape(str(directory)))):
        dataset.prepare(C.DataConfig(dataset=str(directory), val_fraction=0),
                        str(tmp_path / "cache"))


def test_a_damaged_prepared_copy_of_a_dataset_directory_names_what_to_delete(tmp_path):
    """Checked against `datasets`' own cache: a dataset directory loaded once, then the Arrow
    files it prepared in --cache-dir cut to 100 bytes (a full disk, a copy that did not
    finish). The error names a folder that holds those files; once it is deleted, the same
    call loads every record (before: ArrowInvalid, or a traceback)."""
    import shutil

    directory, cache = tmp_path / "data", tmp_path / "cache"
    directory.mkdir()
    (directory / "train.jsonl").write_text("\n".join(ALPACA_LINES) + "\n")
    cfg = C.DataConfig(dataset=str(directory), val_fraction=0)
    assert len(dataset.prepare(cfg, str(cache)).train) == len(ALPACA_LINES)
    arrows = list(cache.rglob("*.arrow"))
    for arrow in arrows:
        arrow.write_bytes(arrow.read_bytes()[:100])
    with pytest.raises(UserError) as e:
        dataset.prepare(cfg, str(cache))
    [named] = re.findall(r"may be damaged: delete (\S+) to have it prepared again", str(e.value))
    assert arrows and all(Path(named) in arrow.parents for arrow in arrows), (named, arrows)
    shutil.rmtree(named)
    assert len(dataset.prepare(cfg, str(cache)).train) == len(ALPACA_LINES)


def test_dataset_without_held_out_split_uses_the_fraction():
    """Checked against split_tables' contract: a DatasetDict with only `train` has no held-out
    split (the fraction applies); one with `test` uses it."""
    rows = [{"text": "a"}]
    assert dataset.split_tables("d", {"train": rows}, "train")[1] is None
    assert dataset.split_tables("d", {"train": rows, "test": rows}, "train")[1].name.endswith(
        "split test")


def test_a_held_out_split_without_records_is_passed_over(caplog):
    """Checked against split_tables' contract: a Hub dataset whose `validation` split has zero
    rows uses its `test` split, and with both empty the fraction applies (prepare then holds
    out by content hash); each time a warning names the empty split (before: zero validation
    records and no validation loss, with only an info line)."""
    rows = [{"text": "a"}]
    with caplog.at_level(logging.WARNING, logger="training.dataset"):
        _, held_out = dataset.split_tables("d", {"train": rows, "validation": [], "test": rows},
                                           "train")
        assert held_out.name.endswith("split test")
        assert dataset.split_tables("d", {"train": rows, "validation": [], "test": []},
                                    "train")[1] is None
    assert "--dataset d: its validation split has no records; validation uses its test split" \
        in caplog.text
    assert "its validation and test splits have no records; validation uses --val-fraction" \
        in caplog.text


def test_evaluation_rows_cover_the_set_once_in_equal_batches():
    """Checked against the definition: over the ranks every validation row is evaluated
    exactly once, and every rank runs the same number of batches (FSDP's forward is
    collective), padding with -1."""
    for rows, world, batch in [(12, 2, 4), (5, 2, 4), (1, 4, 2), (9, 3, 1)]:
        per_rank = [dataset.eval_rows(rows, world, r, batch) for r in range(world)]
        assert len({len(b) for b in per_rank}) == 1
        seen = [i for batches in per_rank for b in batches for i in b if i >= 0]
        assert sorted(seen) == list(range(rows))
        assert all(len(b) == batch for batches in per_rank for b in batches)


# ----------------------------------------------------------------------------- bad inputs
def _prepare(path, **data):
    return dataset.prepare(C.DataConfig(dataset=str(path), **data), None)


def test_broken_jsonl_line_names_file_and_line(tmp_path):
    """Checked against the file written here: line 3 is cut short; the error names the file
    and line 3 (not json's 'line 1 column ...')."""
    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "a"}\n\n{"text": "b\n{"text": "c"}\n')
    with pytest.raises(UserError) as e:
        _prepare(path)
    assert f"--dataset {path}: line 3 is not valid JSON" in str(e.value)


def test_broken_json_array_names_the_line(tmp_path):
    path = tmp_path / "train.json"
    path.write_text('[\n  {"text": "a"},\n  {"text": "b",}\n]\n')
    with pytest.raises(UserError, match=rf"--dataset {path}: line 3 is not valid JSON"):
        _prepare(path)


def test_an_indented_json_object_is_one_record(tmp_path):
    """Checked against the record written here with json.dump(indent=2), as editors and
    `json.dump` write one: a .json file that is one object over many lines is that one record
    (before: "line 1 is not valid JSON: Expecting property name", about a valid file)."""
    path = tmp_path / "train.json"
    record = {"instruction": "Say hi", "output": "hi"}
    path.write_text(json.dumps(record, indent=2) + "\n")
    records = _prepare(path, val_fraction=0)
    assert records.fmt == "alpaca" and len(records.train) == 1
    assert records.train[0][1] == ("hi", True)


@pytest.mark.parametrize("text, message", [
    ('{\n  "instruction": "i",\n  "output": "o",\n}\n',
     r"line 4 is not valid JSON: Expecting property name enclosed in double quotes"),
    (json.dumps({"data": [{"instruction": "i", "output": "o"}] * 3}, indent=2),
     r"record 1: its fields \(data\) match no known format .*; its field 'data' holds a list "
     r"of 3 objects: if those are the records, give them as a JSON array or one per line"),
], ids=["syntax-error-on-line-4", "records-under-a-key"])
def test_a_json_object_file_names_what_is_wrong(text, message, tmp_path):
    """Checked against the files written here: an indented object with a trailing comma is
    named at the line json reports (4), not at line 1; an object that wraps the records in a
    list under one key says so and how to give them."""
    path = tmp_path / "train.json"
    path.write_text(text)
    with pytest.raises(UserError, match=rf"--dataset {path}: {message}"):
        _prepare(path, val_fraction=0)


@pytest.mark.parametrize("byte_order", ["little", "big"])
def test_a_utf16_file_with_its_byte_order_mark_is_read(byte_order, tmp_path):
    """Checked against records written here in UTF-16 after its byte-order mark (what Windows
    PowerShell 5's `>` and Notepad's "Unicode" save, little-endian): the same records as the
    UTF-8 text (before: "line 1 is not UTF-8 text (invalid start byte at byte 0)")."""
    records = [{"text": "caf\u00e9"}, {"text": "\u65e5\u672c"}]
    text = "".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in records)
    mark, codec = ((codecs.BOM_UTF16_LE, "utf-16-le") if byte_order == "little"
                   else (codecs.BOM_UTF16_BE, "utf-16-be"))
    path = tmp_path / "train.jsonl"
    path.write_bytes(mark + text.encode(codec))
    assert [segments[0][0] for segments in _prepare(path, val_fraction=0).train] == [
        r["text"] for r in records]


def test_bytes_that_are_not_utf8_name_their_line(tmp_path):
    """Checked against the file written here: line 3 holds "caf\\xe9" (Latin-1, as an old
    export writes it); the error names line 3 and the conversion, not only a byte offset."""
    path = tmp_path / "train.jsonl"
    data = b'{"text": "a"}\n{"text": "b"}\n{"text": "caf\xe9"}\n'
    path.write_bytes(data)
    offset = data.index(b"\xe9")
    with pytest.raises(UserError, match=rf"--dataset {path}: line 3 is not UTF-8 text "
                                        rf"\(invalid continuation byte at byte {offset}\); "
                                        r"convert the file to UTF-8"):
        _prepare(path, val_fraction=0)


@pytest.mark.parametrize("lines, data, message", [
    (['{"instruction": "i", "output": "o"}', '{"instruction": "i2"}'], {},
     r"record 2 \(line 2\): field 'output' is missing \(needed by the alpaca format\); the "
     r"record has instruction"),
    (['{"prompt": "p", "completion": "c"}', '', '{"prompt": "p", "completion": null}'], {},
     r"record 2 \(line 3\): field 'completion' is null"),
    (['{"dialogue": "d", "summary": "s"}', '{"dialog": "d", "summary": "s"}'],
     {"prompt_field": "dialogue", "response_field": "summary"},
     r"record 2 \(line 2\): field 'dialogue' is missing"),
    (['{"messages": [{"role": "user", "content": "hi"}]}'], {},
     r"record 1 \(line 1\): no message has role 'assistant'"),
    (['{"messages": [{"role": "user"}]}'], {"data_format": "chat"},
     r"record 1 \(line 1\): messages\[0\]: field 'content' is missing"),
    (['{"question": "q", "answer": "a"}'], {}, r"record 1 \(line 1\): its fields \(answer, "
     r"question\) match no known format"),
    (['{"text": 5}'], {}, r"record 1 \(line 1\): field 'text' must be a string, got int 5"),
    (['["a list"]'], {}, r"line 1 is a JSON list, not an object"),
    (['{"a": "x", "b": "y"}'],
     {"prompt_field": "a", "response_field": "b", "prompt_template": "{a} {c}"},
     r"record 1 \(line 1\): --prompt-template names \{c\}, which the record lacks"),
    (['{"a": "x", "b": "y"}'],
     {"prompt_field": "a", "response_field": "b", "prompt_template": 'As JSON {"v": {a}}'},
     r'record 1 \(line 1\): --prompt-template names \{"v"\}, which the record lacks; it has '
     r"a, b \(a literal brace in the template is written \{\{ or \}\}\)"),
], ids=["alpaca-missing-output", "null-completion", "fields-typo", "chat-no-assistant",
        "chat-no-content", "unknown-format", "wrong-type", "not-an-object", "template-field",
        "template-literal-brace"])
def test_bad_record_names_record_and_field(lines, data, message, tmp_path):
    """Checked against the records written here: the error names the file, the record's
    number and line, and what is missing or wrong."""
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=rf"--dataset {path}: {message}"):
        _prepare(path, val_fraction=0, **data)


def test_chat_needs_a_tokenizer_with_a_template(tokenizer):
    """Checked against a tokenizer whose chat template is removed (Llama-2-7b-hf's is absent):
    one message saying to use a chat model or another format."""
    import copy

    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    messages = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]]
    with pytest.raises(UserError, match="--data-format chat: the model's tokenizer has no chat "
                                        "template"):
        dataset.tokenize(messages, plain, True, chat=True)


def _cli(tmp_path, *flags: str) -> subprocess.CompletedProcess:
    return finetune_in_one_process(tmp_path / "cache", *flags)


@pytest.mark.parametrize("flag", ["--output-dir", "--checkpoint-dir"])
def test_output_paths_that_are_files_are_refused_first(flag, tmp_path):
    """Checked against the real entry point (one process): an --output-dir or
    --checkpoint-dir that is a regular file ends the run with one error naming the flag,
    before the data is read (the dataset named here does not exist, and that is not what is
    reported) and before the model is fetched (the cache stays empty); the file is
    untouched."""
    existing = tmp_path / "model.bin"
    existing.write_text("the user's file")
    out = _cli(tmp_path, flag, str(existing), "--dataset", str(tmp_path / "missing.jsonl"))
    assert out.returncode == 1, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and f"{flag} {existing}: exists and is not a directory" in errors[0]
    assert existing.read_text() == "the user's file"
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.json"))
    nested = _cli(tmp_path, flag, str(existing / "run1"))
    assert f"{existing} is a file" in nested.stderr


@pytest.mark.parametrize("flag, inside", [("--checkpoint-dir", "ckpt"),
                                          ("--metrics-file", "logs/metrics.jsonl")])
def test_what_the_export_would_delete_is_refused_first(flag, inside, tmp_path):
    """Checked against the export's contract (training/export.py: --output-dir is renamed aside
    and deleted when the new export is in place): a --checkpoint-dir or --metrics-file inside
    --output-dir ends the run with one error naming both, before the data is read (before: the
    run trained, and the export deleted its checkpoints and metrics)."""
    run = tmp_path / "run"
    out = _cli(tmp_path, "--output-dir", str(run), flag, str(run / inside),
               "--dataset", str(tmp_path / "missing.jsonl"))
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    [error] = [line for line in out.stderr.splitlines() if " ERROR " in line]
    assert (f"{flag} {run / inside}: is inside --output-dir {run}, which the export replaces "
            "as a whole") in error
    assert not run.exists()


def test_an_output_dir_holding_other_files_is_refused_first(tmp_path):
    """Checked against the real entry point: an existing --output-dir with a file of the
    user's ends the run before the data is read, naming the file, and the file stays (before:
    the export deleted it)."""
    existing = tmp_path / "home"
    existing.mkdir()
    (existing / "notes.txt").write_text("the user's file")
    out = _cli(tmp_path, "--output-dir", str(existing), "--dataset", str(tmp_path / "m.jsonl"))
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert (f"--output-dir {existing}: exists and is not a model export (it holds notes.txt)"
            in out.stderr)
    assert (existing / "notes.txt").read_text() == "the user's file"


def test_only_a_previous_export_or_an_empty_directory_is_replaced(tmp_path):
    """Checked against a directory the export's writer fills (the tiny preset: config.json,
    sharded safetensors with their index, the tokenizer; training/tiny.py writes it through
    export.Shards): replaceable, as is an empty one; the same with a subdirectory or a file
    of the user's beside it is not."""
    from training.export import replace_problem

    model = tiny.materialize(tmp_path / "model", seed=7)
    (tmp_path / "empty").mkdir()
    assert replace_problem(model) is None and replace_problem(tmp_path / "empty") is None
    assert replace_problem(tmp_path / "missing") is None
    (model / "runs").mkdir()
    assert replace_problem(model).startswith("exists and is not a model export (it holds ")
    (model / "runs").rmdir()
    (model.parent / "lone").mkdir()
    (model.parent / "lone" / "config.json").write_text("{}")
    assert "(it holds config.json)" in replace_problem(model.parent / "lone")


def test_metrics_file_under_a_file_is_refused_first(tmp_path):
    """Checked against the real entry point: a --metrics-file whose directory is a regular file
    ends the run with one error naming the flag and that file, before the data is read (before:
    a FileExistsError traceback from rank 0 after the model was loaded)."""
    existing = tmp_path / "notes.txt"
    existing.write_text("the user's file")
    out = _cli(tmp_path, "--metrics-file", str(existing / "m.jsonl"),
               "--dataset", str(tmp_path / "missing.jsonl"))
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert f"--metrics-file {existing / 'm.jsonl'}: {existing} is a file" in out.stderr


def test_keep_best_without_checkpoints_is_refused_first(tmp_path):
    out = _cli(tmp_path, "--keep-best", "--dataset", str(tmp_path / "missing.jsonl"))
    assert out.returncode == 1 and "--keep-best: needs --checkpoint-dir" in out.stderr


def test_bad_record_fails_before_the_model_is_fetched(tmp_path):
    """Checked against the real entry point: a record without its output field ends the run
    with its record and line number, and the tiny model was never written to the cache."""
    path = tmp_path / "train.jsonl"
    path.write_text('{"instruction": "i", "output": "o"}\n{"instruction": "j"}\n')
    out = _cli(tmp_path, "--dataset", str(path))
    assert out.returncode == 1
    assert "record 2 (line 2): field 'output' is missing" in out.stderr
    assert "Traceback" not in out.stderr
    assert not any((tmp_path / "cache").rglob("config.json"))
