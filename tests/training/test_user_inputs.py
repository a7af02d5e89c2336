"""What users bring, through the real entry point (`python -m training.finetune`, one process):
files other tools wrote, chat data with roles the model's template does not know, damaged or
read-only checkpoint directories, resumes with changed settings, two runs on one directory.
Each run either trains or ends with one error line and status 1, never a traceback alone."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.training.conftest import REPO, child_env, records_of
from tests.training.conftest import finetune_in_one_process as finetune
from training import tiny

pytestmark = pytest.mark.timeout(600)

SHIPPED = REPO / "training" / "data" / "instructions.jsonl"
QUICK = ["--seq-len", "512", "--max-steps", "1", "--val-fraction", "0", "--seed", "7"]
"""One optimizer step of the tiny preset on one process."""


def errors(out: subprocess.CompletedProcess) -> list[str]:
    """The run's error lines; asserts it ended with status 1 and no traceback."""
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    return [line for line in out.stderr.splitlines() if " ERROR " in line]


def trained(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stderr


# ----------------------------------------------------------------------------- files
@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_file_with_a_byte_order_mark_trains(suffix, tmp_path, tiny_cache):
    """Checked against the records written here: a JSON-lines file and a JSON array that start
    with the UTF-8 byte-order mark (what Excel's "CSV UTF-8" export and Notepad write) train on
    all their records (before: "line 1 is not valid JSON: Unexpected UTF-8 BOM")."""
    records = [json.loads(line) for line in SHIPPED.read_text().splitlines()[:40]]
    text = ("\n".join(map(json.dumps, records)) if suffix == ".jsonl"
            else json.dumps(records, indent=1))
    path = tmp_path / f"train{suffix}"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    log = trained(finetune(tiny_cache, "--dataset", str(path), *QUICK))
    assert "data: alpaca format, 40 training and 0 validation records" in log


def test_data_on_s3_is_refused_with_the_recipe_that_works(tmp_path):
    """Checked against the command line's contract (a usage error, status 2, before anything
    runs): an s3:// dataset names the flag and the two ways that work, a copy on the shared
    volume or an FSx data repository association (before: it passed and failed in the pod as
    "no such file")."""
    out = finetune(tmp_path / "cache", "--dataset", "s3://my-bucket/train.jsonl")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    [error] = [line for line in out.stderr.splitlines() if "error:" in line]
    assert "--dataset: is a URL, and the job reads a local path or a Hugging Face dataset" in error
    assert "aws s3 cp s3://bucket/train.jsonl /fsx/data/train.jsonl" in error
    assert "create-data-repository-association" in error


LLAMA_2_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}")
"""meta-llama/Llama-2-7b-chat-hf's chat template (its tokenizer_config.json): a system turn
only first, then user and assistant alternating; any other role raises or is dropped."""


@pytest.fixture(scope="module")
def llama2_chat_model(tmp_path_factory) -> Path:
    """The tiny model with Llama-2-chat's template, as a local model directory."""
    from transformers import AutoTokenizer

    model = tiny.materialize(tmp_path_factory.mktemp("llama2chat") / "model", seed=7)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = LLAMA_2_CHAT_TEMPLATE
    tokenizer.save_pretrained(model)
    return model


def _chat(path: Path, conversations: list[list[tuple[str, str]]]) -> Path:
    path.write_text("".join(json.dumps({"messages": [{"role": r, "content": c} for r, c in turns]})
                            + "\n" for turns in conversations))
    return path


def test_a_role_the_chat_template_refuses_names_record_role_and_roles(llama2_chat_model,
                                                                      tmp_path):
    """Checked against Llama-2-chat's template (above): record 3 has a `tool` turn, which the
    template refuses (here it raises where a user turn is due), so the run ends before the
    model is built with the record, its line, the role and the roles the template renders
    (before: a jinja2 TemplateError traceback)."""
    hello = [("user", "hi"), ("assistant", "hello")]
    data = _chat(tmp_path / "chat.jsonl", [hello, hello, [
        ("system", "be brief"), ("user", "weather?"), ("assistant", "calling"),
        ("tool", "{\"sunny\": true}"), ("assistant", "sunny")]] + [hello] * 20)
    out = finetune(tmp_path / "cache", "--model", str(llama2_chat_model), "--dataset", str(data),
                   *QUICK)
    [error] = errors(out)
    assert (f"--dataset {data}: record 3 (line 3): messages[3] has role 'tool', which the "
            "model's chat template does not render") in error
    assert "it renders system, user, assistant." in error
    assert "model: " not in out.stderr  # refused before the model was built


def test_turns_out_of_the_templates_order_name_the_record(llama2_chat_model, tmp_path):
    """Checked against the same template: roles it knows, but two user turns in a row in
    record 2; the template's own message, with the record."""
    hello = [("user", "hi"), ("assistant", "hello")]
    data = _chat(tmp_path / "chat.jsonl", [hello, [("user", "a"), ("user", "b"),
                                                    ("assistant", "c")]] + [hello] * 20)
    out = finetune(tmp_path / "cache", "--model", str(llama2_chat_model), "--dataset", str(data),
                   *QUICK)
    [error] = errors(out)
    assert f"--dataset {data}: record 2 (line 2): the model's chat template refuses" in error
    assert "Conversation roles must alternate" in error


# ----------------------------------------------------------------------------- model files
def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:1000])


MODEL_DAMAGE = {
    "config-not-json": (lambda m: (m / "config.json").write_text('{"model_type": "lla'),
                        "config.json is not readable JSON"),
    "truncated-weights": (lambda m: _truncate(m / "model-00001-of-00010.safetensors"),
                          "model-00001-of-00010.safetensors is not a readable safetensors file"),
    "shard-missing": (lambda m: (m / "model-00003-of-00010.safetensors").unlink(),
                      "model-00003-of-00010.safetensors, named in model.safetensors.index.json, "
                      "is missing"),
    "tokenizer-missing": (lambda m: [(m / f).unlink() for f in ("tokenizer.json",
                                                                "tokenizer_config.json")],
                          "its tokenizer does not load (Couldn't instantiate the backend "
                          "tokenizer"),
}


@pytest.mark.parametrize("damage", MODEL_DAMAGE)
def test_a_damaged_model_directory_is_named_before_training(damage, tmp_path):
    """Checked against the tiny preset's files (training/tiny.py: config.json and ten
    safetensors files with an index), damaged here as an interrupted copy or a full disk leaves
    them: the run ends with one error naming the directory, the file and what is wrong, before
    the data is tokenized (before: a JSONDecodeError, SafetensorError, FileNotFoundError or
    ValueError traceback from transformers or safetensors)."""
    model = tiny.materialize(tmp_path / "model", seed=7)
    damage_it, says = MODEL_DAMAGE[damage]
    damage_it(model)
    out = finetune(tmp_path / "cache", "--model", str(model), "--dataset", str(SHIPPED), *QUICK)
    [error] = errors(out)
    assert f"--model {model}: {model}: {says}" in error
    assert error.endswith("copy the model directory again from its source")
    assert "training data:" not in out.stderr


def test_weights_that_are_not_finite_stop_the_run_before_anything_is_saved(tmp_path):
    """Checked against the definition of a usable checkpoint (finite weights): the tiny
    preset's final norm set to +inf, as a damaged conversion leaves it, makes the first step's
    loss NaN. The run ends with status 1 and one error naming the step, the loss and the way
    out; that step's metrics record is written (its loss null: JSON has no NaN), and no
    checkpoint exists although one is due after every step (before: the run saved NaN weights
    every step and exported them)."""
    from safetensors.torch import load_file, save_file

    model = tiny.materialize(tmp_path / "model", seed=7)
    [shard] = [f for f in model.glob("*.safetensors") if "model.norm.weight" in load_file(f)]
    tensors = load_file(shard)
    tensors["model.norm.weight"].fill_(float("inf"))
    save_file(tensors, shard, metadata={"format": "pt"})
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "metrics.jsonl"
    out = finetune(tmp_path / "cache", "--model", str(model), "--dataset", str(SHIPPED),
                   *QUICK[:2], "--max-steps", "3", "--val-fraction", "0", "--checkpoint-dir",
                   str(ckpt), "--checkpoint-every", "1", "--output-dir", str(tmp_path / "out"),
                   "--metrics-file", str(metrics))
    [error] = errors(out)
    assert "step 1: the training loss is nan" in error
    assert "the run stops without saving them" in error and "--learning-rate" in error
    steps = [r for r in records_of(metrics) if "train/step" in r]
    assert [r["train/step"] for r in steps] == [1] and steps[0]["train/loss"] is None
    assert "NaN" not in metrics.read_text()  # strict JSON: the NaN is null
    assert not list(ckpt.glob("step_*")) and not (tmp_path / "out").exists()


def test_a_damaged_tiny_preset_names_the_directory_to_delete(tmp_path):
    """Checked against the preset's directory in --cache-dir (training/tiny.py writes it once
    and reuses it): its config.json emptied, the run ends with one error naming the file and
    the directory to delete so that it is written again."""
    model = tiny.materialize(tiny.directory(str(tmp_path / "cache"), 7), seed=7)
    (model / "config.json").write_text("")
    [error] = errors(finetune(tmp_path / "cache", "--dataset", str(SHIPPED), *QUICK))
    assert f"--model tiny: {model}: config.json is not readable JSON" in error
    assert error.endswith(f"delete {model} so that the preset is written again")


def test_a_cache_dir_the_job_cannot_use_is_one_error(tmp_path):
    """Checked against a --cache-dir under a regular file (refused before the data is read)
    and one with mode 0555 (the tiny preset cannot be written there: one error naming
    --cache-dir and the system's reason) (before: a NotADirectoryError or PermissionError
    traceback)."""
    notes = tmp_path / "notes.txt"
    notes.write_text("the user's file")
    [error] = errors(finetune(notes / "cache", "--dataset", str(tmp_path / "missing.jsonl")))
    assert f"--cache-dir {notes / 'cache'}: exists and is not a directory: {notes} is a file" \
        in error
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        out = finetune(locked, "--dataset", str(SHIPPED), *QUICK, prefix=_without_root_override())
    finally:
        locked.chmod(0o755)
    [error] = errors(out)
    assert f"--cache-dir {locked}: cannot write the model there ([Errno 13] Permission denied" \
        in error


# ----------------------------------------------------------------------------- checkpoints
BEST = ["--seq-len", "512", "--seed", "7", "--eval-every", "1", "--keep-best",
        "--checkpoint-every", "1", "--keep-checkpoints", "3"]
"""Evaluate and checkpoint every step, keep three (and the best)."""


def test_keep_best_resume_sets_aside_an_older_checkpoint_with_a_garbled_marker(tmp_path,
                                                                               tiny_cache):
    """Checked against the directory: 3 steps, step 1's COMPLETE marker garbled, resumed to
    step 5 with --keep-best: the run finishes and exports, step 1 is set aside as damaged.*
    with a warning naming it, steps 2..5 stay complete (before: a JSONDecodeError traceback
    from pruning after training had resumed)."""
    ckpt = tmp_path / "ckpt"
    trained(finetune(tiny_cache, *BEST, "--max-steps", "3", "--checkpoint-dir", str(ckpt)))
    (ckpt / "step_00000001" / "COMPLETE").write_text('{"step": 1, "eval_lo')
    log = trained(finetune(tiny_cache, *BEST, "--max-steps", "5", "--checkpoint-dir", str(ckpt),
                           "--output-dir", str(tmp_path / "export")))
    assert f"resumed from {ckpt}/step_00000003" in log
    assert f"older checkpoint {ckpt}/step_00000001 is damaged: COMPLETE is unreadable" in log
    assert [p.name.split(".")[:2] for p in ckpt.glob("damaged.*")] == [["damaged", "step_00000001"]]
    kept = {int(p.name[5:]) for p in ckpt.glob("step_*")}
    assert {3, 4, 5} <= kept and len(kept) <= 4, kept  # the newest three, and the best if older
    assert (tmp_path / "export" / "config.json").is_file()


def _without_root_override() -> tuple[str, ...]:
    """The command prefix that makes permission bits bind this test's process: as root (CI
    containers), util-linux's setpriv drops the capabilities that let root write anywhere
    (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), so the process is checked like the directories'
    owner, as a non-root pod user is; as another user, nothing is needed."""
    if os.geteuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without util-linux's setpriv: root ignores permission bits")
    return ("setpriv", "--bounding-set=-dac_override,-dac_read_search")


@pytest.mark.parametrize("flag", ["--checkpoint-dir", "--output-dir", "--metrics-file"])
def test_a_directory_the_job_cannot_write_is_refused_before_the_data(flag, tmp_path):
    """Checked against a directory with mode 0555 (r-x for everyone, as a mount without
    write permission or another user's directory looks to the job): the run ends with one
    error naming the flag, the directory and the system's reason, before the data is read
    (the dataset named here does not exist) and before the model is fetched (before: a
    PermissionError traceback after 3 trained steps, when the first checkpoint was saved)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    value = {"--checkpoint-dir": locked, "--output-dir": locked / "model",
             "--metrics-file": locked / "metrics.jsonl"}[flag]
    locked.chmod(0o555)
    try:
        out = finetune(tmp_path / "cache", flag, str(value), "--dataset",
                       str(tmp_path / "missing.jsonl"), prefix=_without_root_override())
    finally:
        locked.chmod(0o755)
    [error] = errors(out)
    assert f"{flag} {value}: this process (uid " in error
    assert f"cannot create files in {locked} (Permission denied)" in error
    assert not (tmp_path / "cache").exists() and not list(locked.iterdir())


def test_a_metrics_file_the_job_cannot_append_to_is_refused_before_the_data(tmp_path):
    """Checked against an existing --metrics-file with mode 0444 in a writable directory (a
    previous run's file, made read-only): one error naming the flag, the file and the system's
    reason, before the data is read, and the file keeps its records (before: a PermissionError
    traceback once the model was loaded, when the metrics file was opened)."""
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"train/step": 1}\n')
    metrics.chmod(0o444)
    try:
        out = finetune(tmp_path / "cache", "--metrics-file", str(metrics), "--dataset",
                       str(tmp_path / "missing.jsonl"), prefix=_without_root_override())
    finally:
        metrics.chmod(0o644)
    [error] = errors(out)
    assert (f"--metrics-file {metrics}: this process (uid {os.geteuid()}) cannot append to it "
            "(Permission denied)") in error
    assert metrics.read_text() == '{"train/step": 1}\n' and not (tmp_path / "cache").exists()


# ----------------------------------------------------------------------------- resumes
@pytest.fixture(scope="module")
def two_steps(tmp_path_factory, tiny_cache) -> Path:
    """A checkpoint of step 2: the tiny preset on its own copy of the shipped data (DATA beside
    the checkpoint), --seq-len 512, --batch-size 1, seed 7."""
    work = tmp_path_factory.mktemp("two_steps")
    shutil.copy(SHIPPED, work / "data.jsonl")
    trained(finetune(tiny_cache, *QUICK[:-4], "--seed", "7", "--val-fraction", "0",
                     "--max-steps", "2", "--dataset", str(work / "data.jsonl"),
                     "--checkpoint-dir", str(work / "ckpt")))
    return work / "ckpt"


def _resume(ckpt: Path, tmp_path: Path, *flags: str, cache: Path) -> tuple[Path, subprocess.CompletedProcess]:
    """A copy of the checkpoint directory resumed with the fixture's flags, then ``flags``."""
    shutil.copytree(ckpt, tmp_path / "ckpt")
    return tmp_path / "ckpt", _resume_in_place(tmp_path / "ckpt", ckpt.parent / "data.jsonl",
                                               *flags, cache=cache)


def _resume_in_place(ckpt: Path, data: Path, *flags: str,
                     cache: Path) -> subprocess.CompletedProcess:
    """The checkpoint directory resumed with the fixture's flags on ``data``, then ``flags``."""
    return finetune(cache, *QUICK[:-4], "--seed", "7", "--val-fraction", "0", "--max-steps", "3",
                    "--dataset", str(data), "--checkpoint-dir", str(ckpt), *flags)


@pytest.mark.parametrize("changes, named", [
    (["--seq-len", "256"], "--seq-len 512 -> 256"),
    (["--seed", "8"], "--seed 7 -> 8"),
    ([], "the dataset's content or the tokenizer ("),
], ids=["seq-len", "seed", "dataset-content"])
def test_a_resume_whose_data_order_differs_is_refused(changes, named, two_steps, tmp_path,
                                                      tiny_cache):
    """Checked against the settings of the run that wrote the checkpoint (the fixture's
    flags): another --seq-len (other packed rows), --seed (another order) or the same dataset
    file edited (its first record dropped) makes its data position meaningless: refused,
    naming the old and new value or the data (before: the run continued silently)."""
    data = two_steps.parent / "data.jsonl"
    if not changes:
        data.write_text("\n".join(SHIPPED.read_text().splitlines()[1:]) + "\n")
    try:
        ckpt, out = _resume(two_steps, tmp_path, *changes, cache=tiny_cache)
    finally:
        shutil.copy(SHIPPED, data)
    [error] = errors(out)
    assert f"--checkpoint-dir {ckpt}: cannot resume step_00000002: the training data or its " \
           "order differs from the checkpoint's" in error
    assert named in error
    assert not (ckpt / "step_00000003").exists()


def test_a_refused_resume_reads_none_of_the_checkpoints_shards(two_steps, tmp_path,
                                                              tiny_cache):
    """Checked against the refusal above: with the checkpoint's DCP shards deleted, a resume
    with another --seed is refused with the same message and the checkpoint stays where it
    was, so nothing read its shards: the refusal comes before the verification and the load,
    which read all of them (before: both ran first; the missing shards set the checkpoint
    aside as damaged and the run started from step 0)."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(two_steps, ckpt)
    shards = list((ckpt / "step_00000002").glob("*.distcp"))
    assert shards
    for shard in shards:
        shard.unlink()
    [error] = errors(_resume_in_place(ckpt, two_steps.parent / "data.jsonl", "--seed", "8",
                                      cache=tiny_cache))
    assert "cannot resume step_00000002: the training data or its order differs from the " \
           "checkpoint's (--seed 7 -> 8)" in error
    assert (ckpt / "step_00000002").is_dir()


def test_a_resume_with_another_batch_or_learning_rate_continues_with_warnings(two_steps,
                                                                              tmp_path,
                                                                              tiny_cache):
    """Checked against the fixture's flags: --batch-size 1 -> 2 and --learning-rate 2e-5 ->
    1e-3 continue from step 2 to 3, each with a warning naming the old and new value and what
    happens (the global batch changes; the learning rate is the checkpoint's, which the step's
    logged lr shows: at most the default 2e-5, not 1e-3)."""
    metrics = tmp_path / "metrics.jsonl"
    ckpt, out = _resume(two_steps, tmp_path, "--batch-size", "2", "--learning-rate", "1e-3",
                        "--metrics-file", str(metrics), cache=tiny_cache)
    log = trained(out)
    assert "the global batch changes from 1 to 2 sequences (--batch-size 1 -> 2)" in log
    assert "--learning-rate 2e-05 -> 0.001: the checkpoint's value continues" in log
    [step3] = [r for r in records_of(metrics) if r.get("train/step") == 3]
    assert step3["train/lr"] <= 2e-5
    assert (ckpt / "step_00000003" / "RUN.json").is_file()


@pytest.mark.parametrize("locked, named", [
    ("step_00000002/__0_0.distcp", "step_00000002/__0_0.distcp"),
    ("step_00000002", "step_00000002/COMPLETE"),
    ("step_00000002/COMPLETE", "step_00000002/COMPLETE"),
], ids=["shard", "directory", "marker"])
def test_a_checkpoint_the_job_cannot_read_is_refused_not_set_aside(locked, named, two_steps,
                                                                   tmp_path, tiny_cache):
    """Checked against the fixture's checkpoint (step 2) with one file or its directory
    made mode 000 (another user's files on a shared volume look so to the job): the run ends
    with one error naming what it cannot read and how to fix it, and sets nothing aside nor
    trains, since the checkpoint is sound (before: a PermissionError traceback; an unreadable
    COMPLETE marker was taken for damage and its checkpoint set aside)."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(two_steps, ckpt)
    (ckpt / locked).chmod(0)
    try:
        out = finetune(tiny_cache, *QUICK[:-4], "--seed", "7", "--val-fraction", "0",
                       "--max-steps", "3", "--dataset", str(two_steps.parent / "data.jsonl"),
                       "--checkpoint-dir", str(ckpt), prefix=_without_root_override())
    finally:
        (ckpt / locked).chmod(0o755)
    [error] = errors(out)
    assert f"this process (uid {os.geteuid()}) cannot read {ckpt / named} (Permission denied)" \
        in error
    assert error.endswith("make the checkpoint directory readable by the job's user (chmod -R "
                          "u+rX, or chown -R), or give another --checkpoint-dir")
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(p.name for p in two_steps.iterdir())


# ----------------------------------------------------------------------------- ownership
def test_a_second_run_on_a_directory_in_use_is_refused_naming_the_owner(tmp_path, tiny_cache):
    """Checked against the first run's process: while it trains (200 steps slowed to 2 s each
    by the step-delay hook, so it outlives the second however slowly a loaded machine starts
    it), a second run on its --checkpoint-dir ends with one error naming the owner's host, pid
    and start, before reading data, without resuming from the first's checkpoints (before: the
    two interfered: the first failed, the second continued from its checkpoints)."""
    import socket

    ckpt = tmp_path / "ckpt"
    first = subprocess.Popen(
        [sys.executable, "-m", "training.finetune", "--cache-dir", str(tiny_cache), *QUICK[:2],
         "--max-steps", "200", "--val-fraction", "0", "--checkpoint-every", "1",
         "--checkpoint-dir", str(ckpt)], cwd=REPO,
        env=child_env(FSDP_EKS_TEST_STEP_DELAY_S="2"), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not (ckpt / "step_00000001" / "COMPLETE").exists():
            assert first.poll() is None, "the first run ended early"
            assert time.monotonic() < deadline, "the first run saved no checkpoint"
            time.sleep(0.2)
        before = sorted(p.name for p in ckpt.glob("step_*"))
        second = finetune(tiny_cache, *QUICK, "--checkpoint-dir", str(ckpt),
                          "--dataset", str(tmp_path / "missing.jsonl"))
        assert first.poll() is None, "precondition: the first run still trains"
    finally:
        first.kill()
        first.wait()
    [error] = errors(second)
    assert (f"--checkpoint-dir {ckpt}: another run owns it (host {socket.gethostname()}, "
            f"pid {first.pid}, run id None, started ") in error
    assert "resumed from" not in second.stderr and "step_00000001" in before


@pytest.mark.parametrize("owner, age_s, env", [
    ({"host": "THIS", "pid": "DEAD", "run_id": None}, 0, {}),
    ({"host": "node-7", "pid": 1, "run_id": "job-a"}, 3600, {}),
    ({"host": "node-7", "pid": 1, "run_id": "job-a"}, 0, {"TORCHELASTIC_RUN_ID": "job-a"}),
], ids=["dead-pid-on-this-host", "old-heartbeat-elsewhere", "same-job-restarted"])
def test_a_gone_owner_does_not_block_a_restart(owner, age_s, env, tmp_path, tiny_cache):
    """Checked against owner files written here as a killed run leaves them: a pid that has
    exited on this host; a heartbeat an hour old on another host (the limit is 5 minutes); a
    fresh heartbeat of the same job (torchrun's run id: a restarted group of the PyTorchJob).
    Each run trains; the first two say whose claim they take over."""
    import socket

    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                            capture_output=True, text=True, check=True)
    owner = {**owner, "started": time.time() - age_s}
    if owner["host"] == "THIS":
        owner.update(host=socket.gethostname(), pid=int(exited.stdout))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "OWNER.json").write_text(json.dumps(owner))
    os.utime(ckpt / "OWNER.json", (owner["started"], owner["started"]))
    log = trained(finetune(tiny_cache, *QUICK, "--checkpoint-dir", str(ckpt), env=env))
    assert ("taking it over from a run that is gone" in log) == (not env)
    assert (ckpt / "step_00000001" / "COMPLETE").is_file()


@pytest.mark.parametrize("text, age_s, refusal", [
    ("[1, 2]", 0, r"its OWNER.json cannot be read \(a JSON list, not an owner record\) and "
                  r"was written \d+ s ago, so a run may be writing it"),
    ('{"host": "HERE", "pid": "abc", "started": "yesterday"}', 0,
     r"another run owns it \(host HERE, pid abc, run id None, started at an unknown time, "
     r"last heartbeat \d+ s ago\)"),
    ('{"host": "HERE", "pid": null}', 0, r"another run owns it \(host HERE, pid None"),
    ("[1, 2]", 3600, None),
    (None, 3600, r"cannot replace OWNER.json \(Is a directory\); delete "),
], ids=["a-list", "pid-and-start-not-numbers", "pid-null", "a-list-an-hour-old",
        "a-directory-an-hour-old"])
def test_an_owner_file_of_the_wrong_shape_is_judged_by_its_age(text, age_s, refusal, tmp_path):
    """Checked against the ownership rules (training/owner.py): an OWNER.json that is JSON but
    not an owner record, or whose pid or start is not a number, counts like an unreadable one
    (its age decides: refused while fresh, naming the file to delete if no run uses the
    directory; taken over once older than 5 minutes; a directory of that name cannot be, and
    is named to delete), never a traceback (before: an AttributeError, ValueError, TypeError or
    IsADirectoryError from the ownership check)."""
    import socket

    from training.errors import UserError
    from training.owner import DirectoryOwner

    path = tmp_path / "OWNER.json"
    if text is None:
        path.mkdir()
    else:
        path.write_text(text.replace("HERE", socket.gethostname()))
    os.utime(path, (time.time() - age_s, time.time() - age_s))
    owner = DirectoryOwner(tmp_path)
    if refusal is None:
        owner.take()
        owner.release()
        assert not path.exists()  # it was ours
        return
    with pytest.raises(UserError) as e:
        owner.take()
    assert re.search(refusal.replace("HERE", re.escape(socket.gethostname())), str(e.value))
    assert str(e.value).endswith(f"delete {path}" if text is None
                                 else f"delete {path} if no run uses the directory)")
    assert [p.name for p in tmp_path.iterdir()] == ["OWNER.json"]  # no leftover temporary file


@pytest.mark.parametrize("seq_len, warned", [(4160, True), (4096, False)])
def test_a_sequence_beyond_the_trained_context_is_a_warning(seq_len, warned, tmp_path,
                                                            tiny_cache):
    """Checked against the tiny preset's config.json (max_position_embeddings 4096, no
    rope_scaling; training/tiny.py): --seq-len 4160 trains with a warning naming both numbers
    and that there is no RoPE-scaling option; 4096 does not warn."""
    log = trained(finetune(tiny_cache, *QUICK, "--seq-len", str(seq_len)))
    warning = (f"--seq-len {seq_len}: the model was trained at 4096 positions and its "
               "config.json sets no RoPE scaling")
    assert (warning in log) == warned, log[-3000:]
    assert ("no RoPE-scaling option" in log) == warned


def test_a_setting_newer_than_the_checkpoint_is_not_a_change():
    """Checked against run_record.compare on records: a checkpoint written before a setting
    existed (its RUN.json lacks the key) resumes without a warning about it, while the same
    setting changed against a record that has it is named with both values."""
    from training import config as C
    from training.run_record import compare, run_record

    data = {"rows": 10, "crc32": 1}
    now = run_record(C.JobConfig(), 1, data)
    old = run_record(C.JobConfig(), 1, data)
    del old["settings"]["float8_recipe"]
    assert compare(old, now, 5) == ([], [])
    fp8 = C.parse_args(["--precision", "fp8", "--float8-recipe", "rowwise"])
    refused, warnings = compare(run_record(C.parse_args(["--precision", "fp8"]), 1, data),
                                run_record(fp8, 1, data), 5)
    assert refused == [] and len(warnings) == 1
    assert "--float8-recipe 'tensorwise' -> 'rowwise'" in warnings[0]


@pytest.mark.parametrize("flags, named", [
    (["--dataset", "{tmp}/instructons.jsonl"], "--dataset {tmp}/instructons.jsonl"),
    (["--dataset", str(SHIPPED), "--prompt-field", "instruction", "--response-field", "output",
      "--prompt-template", "{instruction} ({contxt}): "], "--prompt-template names {contxt}"),
    (["--dataset", str(SHIPPED), "--model", "{tmp}/llama-typo"],
     "--model {tmp}/llama-typo: no such directory"),
], ids=["dataset-typo", "template-field-unknown", "model-directory-typo"])
def test_a_slip_the_gpus_are_not_needed_for_ends_before_the_node_check(flags, named, tmp_path):
    """Checked against the node check's own output (its table and its `node_check/*` record in
    --metrics-file): a dataset path with a typo, a --prompt-template field the records do not
    have, or a --model directory that does not exist ends with one error naming the flag and
    value, with the node check not run and nothing written to the metrics file (before: the
    node check ran first, on every node, and appended its record for each such attempt)."""
    metrics = tmp_path / "metrics.jsonl"
    out = finetune(tmp_path / "cache", *QUICK, *[f.replace("{tmp}", str(tmp_path)) for f in flags],
                   "--metrics-file", str(metrics), "--node-check")
    [error] = errors(out)
    assert named.replace("{tmp}", str(tmp_path)) in error, error
    assert "node check:" not in out.stderr and not metrics.exists(), out.stderr[-3000:]
