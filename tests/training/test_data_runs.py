"""Real torchrun runs on CPU over data the tests write: every format trains, the validation
loss is the one computed by hand, it does not depend on the world size, and --keep-best
exports the best checkpoint."""

from __future__ import annotations

import json
import random

import pytest
import torch

from tests.training.conftest import (
    STEPS,
    Run,
    evals_of,
    held_out,
    summary_of,
    train,
)
from training import config as C
from training import dataset

pytestmark = pytest.mark.timeout(300)

SAME_MATH_RTOL = 1e-5
"""As in test_training_runs: the same arithmetic in another reduction order."""


def _write_jsonl(path, records: list[dict]):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _records(fmt: str, n: int = 48) -> tuple[list[dict], list[str]]:
    """`n` arithmetic records in format `fmt`, and the extra flags it needs."""
    rng = random.Random(fmt)
    pairs = [(rng.randint(0, 99), rng.randint(0, 99)) for _ in range(n)]
    if fmt == "alpaca":
        return [{"instruction": "Add the numbers.", "input": f"{a} and {b}", "output": str(a + b)}
                for a, b in pairs], []
    if fmt == "prompt-completion":
        return [{"prompt": f"{a}+{b}=", "completion": str(a + b)} for a, b in pairs], []
    if fmt == "text":
        return [{"text": f"{a} plus {b} is {a + b}."} for a, b in pairs], []
    if fmt == "chat":
        return [{"messages": [{"role": "user", "content": f"{a}+{b}?"},
                              {"role": "assistant", "content": str(a + b)},
                              {"role": "user", "content": "Times two?"},
                              {"role": "assistant", "content": str(2 * (a + b))}]}
                for a, b in pairs], []
    return ([{"question": f"{a}+{b}", "answer": str(a + b), "id": i}
             for i, (a, b) in enumerate(pairs)],
            ["--prompt-field", "question", "--response-field", "answer",
             "--prompt-template", "Q: {question} (id {id})\nA: "])


@pytest.mark.parametrize("fmt", ["alpaca", "prompt-completion", "text", "chat", "fields"])
def test_each_format_trains_and_evaluates(fmt, tmp_path, tiny_cache):
    """Checked against the run's own first step: a one-rank torchrun on 48 records of the
    format (written here, detected automatically, or mapped with --prompt-field) trains with
    the prompt masked, its loss falls over 4 steps, and the final evaluation reports a finite
    validation loss and perplexity = exp(loss)."""
    records, flags = _records(fmt)
    path = _write_jsonl(tmp_path / "train.jsonl", records)
    seq_len = {"alpaca": 256, "chat": 128}.get(fmt, 64)  # one example fits a row whole
    run = train(tmp_path, "--dataset", str(path), "--seq-len", str(seq_len), "--batch-size", "4",
                "--max-steps", "4", "--epochs", "10", "--mask-prompt", "--val-fraction", "0.1",
                *flags, nproc=1, cache=tiny_cache).check()
    assert f"data: {fmt} format" in run.output
    losses = run.losses()
    assert len(losses) == 4 and losses[-1] < losses[0], losses
    final = evals_of(run.metrics_file)[4]  # after the last step (and each epoch's end)
    assert 0 < final["eval/loss"] < 10
    assert final["eval/perplexity"] == pytest.approx(torch.tensor(final["eval/loss"]).exp().item())
    assert summary_of(run.metrics_file)["summary/eval_loss"] == final["eval/loss"]


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_eval_loss_is_the_hand_computed_loss(reference: Run):
    """Checked against a loss computed here, outside the package: the reference run's final
    weights (its fp32 export) loaded with transformers, run on each validation record alone
    (held out by the documented content-hash rule, tokenized by hand with the byte tokenizer:
    <s> prompt output </s>, every token trained as --no-mask-prompt says), summed token
    cross-entropy over the token count. The run's final eval/loss equals it within 1e-5."""
    from transformers import AutoModelForCausalLM

    records = [json.loads(line) for line in open(C.SHIPPED_DATASET)]
    val = held_out(records, 0.05)
    model = AutoModelForCausalLM.from_pretrained(reference.workdir / "export",
                                                 dtype=torch.float32).eval()
    total, count = 0.0, 0
    for r in val:
        template = dataset.PROMPT_WITH_INPUT if r.get("input") else dataset.PROMPT_NO_INPUT
        text = template.format(instruction=r["instruction"], input=r.get("input", "")) + r["output"]
        tokens = torch.tensor([[1] + [b + 3 for b in text.encode()] + [2]])
        with torch.no_grad():
            logits = model(tokens).logits[0, :-1]
        total += float(torch.nn.functional.cross_entropy(logits, tokens[0, 1:], reduction="sum"))
        count += tokens.shape[1] - 1
    final = evals_of(reference.metrics_file)[STEPS]
    assert final["eval/tokens"] == count
    assert final["eval/loss"] == pytest.approx(total / count, rel=1e-5)
    assert f"{len(records) - len(val)} training and {len(val)} validation records" in \
        reference.output


def test_validation_is_the_same_at_world_size_one_and_two(reference: Run, tmp_path, tiny_cache):
    """Checked against the 2-rank reference: the same job on ONE rank (--batch-size 8, the
    same global batch) holds out the same validation records (same counts in its log, same
    target tokens) and ends with the same validation loss within SAME_MATH_RTOL."""
    one = train(tmp_path, "--batch-size", "8", nproc=1, cache=tiny_cache).check()
    line = next(ln for ln in reference.output.splitlines() if "validation records" in ln)
    assert line.split("INFO ", 1)[1] in one.output
    two_eval, one_eval = evals_of(reference.metrics_file)[STEPS], evals_of(one.metrics_file)[STEPS]
    assert one_eval["eval/tokens"] == two_eval["eval/tokens"]
    assert one_eval["eval/loss"] == pytest.approx(two_eval["eval/loss"], rel=SAME_MATH_RTOL)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_keep_best_exports_the_best_checkpoint(tmp_path, tiny_cache):
    """Checked against the run's eval records and its checkpoints read back with DCP. A dataset
    directory (train.jsonl, validation.jsonl, as on the Hub) trains on random letters a..m and
    validates on a..z: the validation loss first falls (letters), then rises (n..z unlearnt).
    With --keep-best the export holds exactly the weights of the best step's checkpoint (kept
    by pruning beside the newest), not the last step's, and the summary names the step."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM

    rng = random.Random(0)
    data = tmp_path / "data"
    data.mkdir()
    for split, letters, n in (("train", "abcdefghijklm", 48),
                              ("validation", "abcdefghijklmnopqrstuvwxyz", 12)):
        _write_jsonl(data / f"{split}.jsonl", [
            {"text": "".join(rng.choice(letters) for _ in range(60))} for _ in range(n)])
    ckpt = tmp_path / "ckpt"
    run = train(tmp_path, "--dataset", str(data), "--seq-len", "64", "--batch-size", "2",
                "--learning-rate", "3e-2", "--warmup-steps", "1", "--max-steps", "6",
                "--epochs", "100", "--eval-every", "1",
                "--checkpoint-dir", str(ckpt), "--keep-checkpoints", "1", "--keep-best",
                "--output-dir", str(tmp_path / "export"), "--export-dtype", "fp32",
                cache=tiny_cache).check()
    assert "12 validation records (validation: --dataset" in run.output
    evals = evals_of(run.metrics_file)
    assert sorted(evals) == list(range(1, 7))
    best = min(evals, key=lambda s: evals[s]["eval/loss"])
    assert best != 6, f"precondition: the validation loss must rise at the end: {evals}"
    summary = summary_of(run.metrics_file)
    assert summary["summary/exported_step"] == summary["summary/best_eval_step"] == best
    assert sorted(p.name for p in ckpt.iterdir()) == [f"step_{best:08d}", "step_00000006"]

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "export", dtype=torch.float32)

    def checkpoint(step: int) -> dict:
        state = {"model": AutoModelForCausalLM.from_config(exported.config).state_dict()}
        dcp.load(state, checkpoint_id=str(ckpt / f"step_{step:08d}"))
        return state["model"]

    got, at_best, last = exported.state_dict(), checkpoint(best), checkpoint(6)
    for name in at_best:
        torch.testing.assert_close(got[name], at_best[name], rtol=0, atol=0)
    assert any(not torch.equal(at_best[n], last[n]) for n in at_best)
    assert f"exported step {best}" in run.output
