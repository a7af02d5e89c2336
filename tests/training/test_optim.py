"""The fused world-size-1 optimizer step (training/optim.py) against PyTorch's own AdamW with
`clip_grad_norm_`, through the real local mixed precision hooks (training/parallel.py), and
its state through the real Checkpointer in both directions.

The model here is linear in its parameters (loss = sum(w * c)), so the gradient is exactly
the chosen `c` whatever the weights: the two optimizers see the same gradients at every step
and any difference is the optimizer's own."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from training.checkpoint import Checkpointer, TrainerState
from training.dist import init_distributed
from training.optim import (
    ClippedAdamW,
    LocalAdamW,
    adamw_update,
    build_optimizer,
    compile_update,
    param_groups,
)
from training.parallel import LocalMixedPrecision, Parallelism

MAX_NORM = 1.0


class Linear(nn.Module):
    """loss = sum(w * cw) + sum(b * cb): d loss / d w = cw exactly, in any dtype (cw and cb are
    bf16-representable)."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.w = nn.Parameter(torch.randn(8, 16, generator=gen))
        self.b = nn.Parameter(torch.randn(16, generator=gen))

    def forward(self, cw: torch.Tensor, cb: torch.Tensor) -> torch.Tensor:
        return (self.w * cw.to(self.w.dtype)).sum() + (self.b * cb.to(self.b.dtype)).sum()


def _gradients(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per step (cw, cb), bf16-representable; every other step's norm is above MAX_NORM, so
    clipping is on and off in turn."""
    gen = torch.Generator().manual_seed(1)
    out = []
    for step in range(steps):
        scale = 3.0 if step % 2 == 0 else 0.02
        out.append(tuple((torch.randn(*shape, generator=gen) * scale).bfloat16().float()
                         for shape in ((8, 16), (16,))))
    return out


def _schedule(optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: [1.0, 0.5, 2.0][step % 3])


def _reference(steps: int):
    """fp32 masters, the gradients as given, clip_grad_norm_, torch.optim.AdamW."""
    model = Linear()
    optimizer = torch.optim.AdamW(param_groups(model, 0.1), lr=0.05, betas=(0.9, 0.95), eps=1e-8)
    scheduler = _schedule(optimizer)
    norms, weights = [], []
    for cw, cb in _gradients(steps):
        model.w.grad, model.b.grad = cw.clone(), cb.clone()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        weights.append((model.w.detach().clone(), model.b.detach().clone()))
    return norms, weights


def _local_model():
    model = Linear()
    model.local = LocalMixedPrecision(model, torch.bfloat16)
    optimizer = LocalAdamW(param_groups(model, 0.1), model.local, lr=0.05)
    return model, optimizer


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float = 2e-6) -> bool:
    return bool(((a - b).abs() <= rtol * b.abs().max()).all())


def test_local_adamw_matches_adamw_after_clip_grad_norm():
    """Checked against torch.optim.AdamW after clip_grad_norm_ over 6 steps (lr schedule,
    decoupled weight decay on the matrix only, clipping on and off): the same norms and the
    same fp32 masters within 2e-6 of the largest weight (fp32 scalars on the device against
    the reference's float64 ones), and after every step the bf16 copy the next forward uses
    is exactly the new master cast to bf16."""
    steps = 6
    norms, weights = _reference(steps)
    model, optimizer = _local_model()
    scheduler = _schedule(optimizer)
    local = model.local
    for step, (cw, cb) in enumerate(_gradients(steps)):
        model(cw, cb).backward()
        assert model.w.grad is None and local.grad_of(model.w).dtype == torch.bfloat16
        norm = optimizer.clip_and_step(MAX_NORM)
        scheduler.step()
        optimizer.zero_grad()
        assert torch.allclose(norm, norms[step], rtol=1e-6), step
        for p, expected in zip((model.w, model.b), weights[step]):
            assert p.dtype == torch.float32
            assert _close(p.detach(), expected), (step, (p - expected).abs().max())
            assert torch.equal(local.copy_for(p), p.detach().bfloat16()), step


def test_a_parameter_holds_its_copy_or_its_gradient_not_both():
    """Checked against the dictionaries that hold them: the backward that syncs drops each
    bf16 copy as its gradient is kept (a micro-batch that does not sync keeps the copies in
    place for the next one), and the step takes each gradient as it writes that parameter's
    new copy: at its k-th update it holds k copies and n - k gradients, never all of both."""
    model, optimizer = _local_model()
    local = model.local
    (cw, cb), = _gradients(1)
    local.set_requires_gradient_sync(False)
    model(cw / 2, cb / 2).backward()
    assert [p.dtype for p in model.parameters()] == [torch.bfloat16] * 2  # copies in place
    local.set_requires_gradient_sync(True)
    model(cw / 2, cb / 2).backward()
    assert [p.dtype for p in model.parameters()] == [torch.float32] * 2
    assert local.copies == {} and len(local.grads) == 2
    held = []
    update = optimizer._update

    def counting(*args):
        held.append((len(local.copies), len(local.grads)))
        update(*args)

    optimizer._update = counting
    optimizer.clip_and_step(MAX_NORM)
    assert held == [(1, 1), (2, 0)]
    assert local.grads == {}
    for p in model.parameters():
        assert torch.equal(local.copy_for(p), p.detach().bfloat16())


def test_gradient_accumulation_sums_micro_batches_in_fp32():
    """Checked against the reference fed the whole gradient: two micro-batches of half the
    gradient each, the first without sync, give the same masters (the sum is kept in fp32 and
    handed over once)."""
    norms, weights = _reference(2)
    model, optimizer = _local_model()
    scheduler = _schedule(optimizer)
    local = model.local
    for step, (cw, cb) in enumerate(_gradients(2)):
        for sync in (False, True):
            local.set_requires_gradient_sync(sync)
            model(cw / 2, cb / 2).backward()
            if not sync:
                assert local.grad_of(model.w) is None  # not handed over before the last one
        assert local.grad_of(model.w).dtype == torch.float32
        norm = optimizer.clip_and_step(MAX_NORM)
        scheduler.step()
        optimizer.zero_grad()
        assert torch.allclose(norm, norms[step], rtol=1e-6)
        assert _close(model.w.detach(), weights[step][0])


def test_forward_without_autograd_leaves_the_fp32_masters_in_place():
    """Checked against the weights before: a forward under no_grad (the evaluation) swaps the
    bf16 copies in and the fp32 masters back out, so a checkpoint or export right after an
    evaluation reads fp32 masters, unchanged; training afterwards still steps."""
    model, optimizer = _local_model()
    before = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        model(*_gradients(1)[0])
    assert [p.dtype for p in model.parameters()] == [torch.float32, torch.float32]
    assert all(torch.equal(p.detach(), b) for p, b in zip(model.parameters(), before))
    model(*_gradients(1)[0]).backward()
    optimizer.clip_and_step(MAX_NORM)
    assert not torch.equal(model.w.detach(), before[0])


def test_the_update_compiles_whole_and_matches_eager():
    """Checked against the eager update: the update compiled as LocalAdamW compiles it on CUDA
    (whole graph, symbolic sizes; here Inductor's CPU backend) runs on two parameter sizes and
    both gradient dtypes without a graph break and lands within one fp32 rounding of eager:
    the same function, so a change that stops it compiling fails here, not on the GPU."""
    compiled = compile_update()
    for numel, grad_dtype in ((4096, torch.bfloat16), (1000, torch.float32)):
        gen = torch.Generator().manual_seed(numel)
        base = [torch.randn(numel, generator=gen), torch.randn(numel, generator=gen) * 1e-3,
                torch.rand(numel, generator=gen) * 1e-6]
        grad = torch.randn(numel, generator=gen).to(grad_dtype)
        scalars = (torch.tensor(1e-3), torch.tensor(3.0), torch.tensor(0.5), 0.9, 0.95, 1e-8, 0.1)
        results = []
        for update in (adamw_update, compiled):
            p, m, v = (t.clone() for t in base)
            copy = torch.empty(numel, dtype=torch.bfloat16)
            update(p, grad, m, v, copy, *scalars)
            results.append((p, m, v, copy))
        assert not torch.equal(results[0][0], base[0])  # the weights moved
        for p, _, _, copy in results:
            assert torch.equal(copy, p.bfloat16())
        for eager, fused in zip(results[0][:3], results[1][:3]):
            assert torch.allclose(fused, eager, rtol=1e-6, atol=1e-9)


def test_build_optimizer_picks_the_fused_step_only_for_local_mixed_precision():
    """Checked against the model's wrapping: LocalAdamW exactly when the model has local mixed
    precision, PyTorch's AdamW (ClippedAdamW, its subclass that clips first) otherwise (FSDP,
    or fp32 in one process)."""
    from training.config import OptimConfig

    plain = build_optimizer(Linear(), OptimConfig(), torch.device("cpu"))
    assert type(plain) is ClippedAdamW and isinstance(plain, torch.optim.AdamW)
    model, _ = _local_model()
    assert isinstance(build_optimizer(model, OptimConfig(), torch.device("cpu"),
                                      local=model.local), LocalAdamW)


def test_clipped_adamw_is_clip_grad_norm_then_adamw():
    """Checked against `_reference` (clip_grad_norm_, then torch.optim.AdamW): the same norms
    and exactly the same weights over 6 steps."""
    from training.config import OptimConfig

    norms, weights = _reference(6)
    model = Linear()
    optimizer = build_optimizer(model, OptimConfig(learning_rate=0.05, weight_decay=0.1),
                                torch.device("cpu"))
    scheduler = _schedule(optimizer)
    for step, (cw, cb) in enumerate(_gradients(6)):
        model.w.grad, model.b.grad = cw.clone(), cb.clone()
        assert torch.equal(optimizer.clip_and_step(MAX_NORM), norms[step])
        scheduler.step()
        optimizer.zero_grad()
        assert torch.equal(model.w.detach(), weights[step][0])
        assert torch.equal(model.b.detach(), weights[step][1])


def _save_and_load(tmp_path, env, source, target) -> None:
    """`source` = (model, optimizer) saved by the real Checkpointer; loaded into `target`."""
    scheduler = torch.optim.lr_scheduler.LambdaLR(source[1], lambda _: 1.0)
    writer = Checkpointer(str(tmp_path), keep=1, env=env, async_save=False)
    writer.save(1, *source, TrainerState(scheduler), {})
    writer.close()
    scheduler = torch.optim.lr_scheduler.LambdaLR(target[1], lambda _: 1.0)
    assert Checkpointer(str(tmp_path), keep=1, env=env).resume(*target, TrainerState(scheduler))


def test_checkpoints_move_between_adamw_and_the_fused_step(world_of_one, tmp_path):
    """Checked against the saved state and against the uninterrupted reference: an AdamW
    checkpoint (the FSDP path's format) loads into LocalAdamW with every moment and step
    count equal, and the next step lands where AdamW's does; a LocalAdamW checkpoint loads
    back into AdamW the same way. This is what lets a 1-GPU run resume on 16 nodes."""
    env = init_distributed(timeout_s=30)
    try:
        grads = _gradients(3)
        norms, weights = _reference(3)
        adamw_model = Linear()
        adamw = torch.optim.AdamW(param_groups(adamw_model, 0.1), lr=0.05, betas=(0.9, 0.95),
                                  eps=1e-8)
        sched = _schedule(adamw)
        for cw, cb in grads[:2]:
            adamw_model.w.grad, adamw_model.b.grad = cw.clone(), cb.clone()
            torch.nn.utils.clip_grad_norm_(adamw_model.parameters(), MAX_NORM)
            adamw.step()
            sched.step()
        model, optimizer = _local_model()
        _save_and_load(tmp_path / "a", env, (adamw_model, adamw), (model, optimizer))
        for p, q in zip(model.parameters(), adamw_model.parameters()):
            assert torch.equal(p.detach(), q.detach())
            for key in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(optimizer.state[p][key], adamw.state[q][key]), key
            assert float(optimizer.state[p]["step"]) == 2.0
        for group in optimizer.param_groups:
            group["lr"] = 0.05 * 2.0  # the schedule's factor at step 2, as the trainer restores
        model(*grads[2]).backward()
        optimizer.clip_and_step(MAX_NORM)
        assert _close(model.w.detach(), weights[2][0]) and _close(model.b.detach(), weights[2][1])

        back_model = Linear()
        back = torch.optim.AdamW(param_groups(back_model, 0.1), lr=0.05)
        _save_and_load(tmp_path / "b", env, (model, optimizer), (back_model, back))
        for p, q in zip(back_model.parameters(), model.parameters()):
            assert torch.equal(p.detach(), q.detach())
            assert torch.equal(back.state[p]["exp_avg_sq"], optimizer.state[q]["exp_avg_sq"])
            assert float(back.state[p]["step"]) == 3.0
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------- real runs
def _bf16_run(work, cache, *flags, nproc=1, env=None):
    from tests.training.conftest import train

    return train(work, "--precision", "bf16", "--batch-size", str(8 // nproc),
                 "--checkpoint-dir", str(work / "ckpt"), "--checkpoint-every", "4",
                 "--eval-every", "4", "--no-async-checkpoint", *flags, nproc=nproc, cache=cache,
                 env=env)


@pytest.fixture(scope="module")
def bf16_one_process(tmp_path_factory, tiny_cache):
    """`torchrun -m training.finetune` on one process with --precision bf16 (local mixed
    precision and the fused step, as a 1-GPU job runs): the whole 8 steps, and the same job
    stopped after step 4 (its checkpoint, taken right after the step-4 evaluation)."""
    whole = _bf16_run(tmp_path_factory.mktemp("bf16-whole"), tiny_cache).check()
    stopped = _bf16_run(tmp_path_factory.mktemp("bf16-stopped"), tiny_cache,
                        env={"FSDP_EKS_TEST_EXIT_AFTER_STEP": "4"}).check()
    assert sorted(stopped.steps()) == [1, 2, 3, 4]
    return whole, stopped


def test_bf16_on_one_process_checkpoints_fp32_masters_and_resumes_exactly(
        bf16_one_process, tmp_path, tiny_cache):
    """Checked against the uninterrupted run: the one-process bf16 job trains, its checkpoint
    written right after an evaluation holds fp32 masters (an evaluation used to leave the bf16
    copies in the parameters, and that checkpoint stored them), and stopped after step 4 and
    resumed, it repeats the uninterrupted losses of steps 5-8 exactly."""
    import shutil

    import torch.distributed.checkpoint as dcp

    from tests.training.conftest import STEPS, assert_losses_close

    whole, stopped = bf16_one_process
    losses = whole.losses()
    assert len(losses) == STEPS and losses[-1] < losses[0]
    meta = dcp.FileSystemReader(str(stopped.workdir / "ckpt" / "step_00000004")).read_metadata()
    weights = {k: m.properties.dtype for k, m in meta.state_dict_metadata.items()
               if k.startswith("model.") and hasattr(m, "properties")}
    assert weights and set(weights.values()) == {torch.float32}, weights

    shutil.copytree(stopped.workdir / "ckpt", tmp_path / "ckpt")
    resumed = _bf16_run(tmp_path, tiny_cache).check()
    assert "resumed from" in resumed.output
    assert sorted(resumed.steps()) == [5, 6, 7, 8]
    assert_losses_close(resumed.losses(), losses[4:], 1e-6, "bf16 stop + resume")


def test_a_one_process_checkpoint_resumes_under_fsdp_on_two(bf16_one_process, tmp_path,
                                                            tiny_cache):
    """Checked against the uninterrupted one-process run: its step-4 checkpoint (LocalAdamW's
    state) resumes on two processes under fully_shard with PyTorch's AdamW (DCP reshards the
    masters and moments), and steps 5-8 continue with the same global batch within 1e-4 (the
    two paths' arithmetic differs in rounding only; measured 3e-5)."""
    import shutil

    from tests.training.conftest import assert_losses_close

    whole, stopped = bf16_one_process
    shutil.copytree(stopped.workdir / "ckpt", tmp_path / "ckpt")
    resumed = _bf16_run(tmp_path, tiny_cache, nproc=2).check()
    assert "resumed from" in resumed.output and "'fully_shard'" in resumed.output
    assert sorted(resumed.steps()) == [5, 6, 7, 8]
    assert_losses_close(resumed.losses(), whole.losses()[4:], 1e-4, "1 -> 2 processes")


def test_reports_name_the_strategy_the_model_is_under():
    """Checked against the wrapping: a one-process model reports no sharding (local mixed
    precision, or plain fp32), whatever --sharding says; only a fully_shard-ed model reports
    the strategy."""
    model, _ = _local_model()
    local = Parallelism({"local_mixed_precision": 1}, local=model.local)
    assert local.strategy("FULL_SHARD") == "none: local mixed precision (world size 1)"
    assert Parallelism({}).strategy("FULL_SHARD") == "none: one process in fp32"
    assert Parallelism({"fully_shard": 3}, sharded=True).strategy("FULL_SHARD") == "FULL_SHARD"
