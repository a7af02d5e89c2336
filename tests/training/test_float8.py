"""--precision fp8 for real on CPU (torch 2.13 runs torch._scaled_mm there; torchao 0.17.0's
Float8Linear on top): the one-process path (local mixed precision, the fused step, float8
linears fed the bf16 copies) and the two-process path (FSDP2 all-gathering float8 weights
with scales precomputed after each optimizer step, `parallel.float8_post_step`) both train,
and agree with each other. The GPU speed and convergence figures are in docs/performance.md;
this is what CI can check of the same code."""

from __future__ import annotations

import pytest

from tests.training.conftest import STEPS, assert_losses_close, train

pytest.importorskip("torchao.float8", reason="torchao is in training/requirements.txt")

# CPU float8 matmuls are emulated and slow, and a loaded 2-core CI machine runs these three
# jobs with everything else: the runs are small and their limits generous.
pytestmark = pytest.mark.timeout(3600)
RUN_TIMEOUT_S = 1200
SMALL = ["--seq-len", "256", "--val-fraction", "0"]
"""Half the tiny job's rows (examples cut at 256 tokens still train: --no-mask-prompt) and no
evaluation: the steps' float8 arithmetic is what these tests check."""

FP8_AGREE_RTOL = 3e-3
"""One process casts each float8 weight from its bf16 copy with a scale of the moment; two
processes cast the fp32 shards with the scale precomputed after the last step: the same
float8 arithmetic up to rounding (measured: 6.2e-4 at most over 8 steps at --seq-len 256,
1.1e-3 at 512)."""


@pytest.fixture(scope="module")
def fp8_runs(tmp_path_factory, tiny_cache):
    """The tiny job (SMALL) in float8 on one process (batch 8) and on two (batch 4 each), and
    in bf16 on one process."""
    runs = {}
    for name, nproc, precision in (("one", 1, "fp8"), ("two", 2, "fp8"), ("bf16", 1, "bf16")):
        work = tmp_path_factory.mktemp(f"fp8-{name}")
        runs[name] = train(work, *SMALL, "--precision", precision, "--batch-size",
                           str(8 // nproc), nproc=nproc, cache=tiny_cache,
                           timeout=RUN_TIMEOUT_S).check()
    return runs


def test_float8_linears_are_in_the_model_on_both_paths(fp8_runs):
    """Checked against the model log line: 14 float8 linears (7 per decoder layer; the output
    head stays bf16), local mixed precision on one process, fully_shard on two; the plan line's
    run/sharding says the same."""
    assert "'float8_linears': 14" in fp8_runs["one"].output
    assert "'local_mixed_precision': 1" in fp8_runs["one"].output
    assert "'float8_linears': 14" in fp8_runs["two"].output
    assert "'fully_shard'" in fp8_runs["two"].output
    # and the run's description names what the parameters are under
    assert '"run/sharding": "none: local mixed precision (world size 1)"' in fp8_runs["one"].output
    assert '"run/sharding": "FULL_SHARD"' in fp8_runs["two"].output
    assert "float8_linears" not in fp8_runs["bf16"].output


def test_float8_trains_and_one_process_agrees_with_fsdp_float8_all_gathers(fp8_runs):
    """Checked against each other and against bf16: both float8 runs lower the loss over the
    8 steps, agree within FP8_AGREE_RTOL at every step, and differ from the bf16 run (the
    float8 casts are really in the matmuls)."""
    one, two, bf16 = (fp8_runs[k].losses() for k in ("one", "two", "bf16"))
    assert len(one) == len(two) == STEPS
    assert one[-1] < one[0] - 0.5 and two[-1] < two[0] - 0.5
    assert_losses_close(two, one, FP8_AGREE_RTOL, "fp8 on two processes vs one")
    assert one != bf16


def test_fp8_on_a_gpu_without_float8_matmuls_is_refused_first(monkeypatch):
    """Checked against the A100 of p4de (compute capability 8.0; torch._scaled_mm needs 8.9):
    --precision fp8 is a UserError naming the GPU and --precision bf16, raised before data or
    model are touched; an H100/H200 (9.0) and the CPU pass, and bf16 is never checked."""
    import torch

    from training.errors import UserError
    from training.parallel import check_precision

    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda _: (8, 0))
    with pytest.raises(UserError, match=r"A100.*8\.0.*--precision bf16"):
        check_precision("fp8", gpu)
    check_precision("bf16", gpu)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda _: (9, 0))
    check_precision("fp8", gpu)
    check_precision("fp8", torch.device("cpu"))



def _tiny_float8_model(recipe: str, fsdp_all_gather: bool):
    from transformers import LlamaConfig

    from training import tiny
    from training.model import meta_model_from_config
    from training.parallel import apply_float8

    model = meta_model_from_config(LlamaConfig(**tiny.LLAMA_KWARGS))
    converted = apply_float8(model, recipe, fsdp_all_gather=fsdp_all_gather)
    return model, converted


@pytest.mark.parametrize("recipe,granularity,fsdp_all_gather", [
    ("tensorwise", "TENSORWISE", True),
    ("rowwise", "AXISWISE", False),
    ("rowwise_with_gw_hp", "AXISWISE", False),
])
def test_float8_recipe_sets_the_scaling_and_the_all_gather(recipe, granularity, fsdp_all_gather):
    """Checked against torchao's recipes: --float8-recipe reaches every float8 linear of the
    tiny model (14: its input scaling per tensor or per row), FSDP all-gathers float8 weights
    only for tensorwise (torchao has none for row scales), and the post-step scale hook exists
    exactly when it does."""
    from training.parallel import float8_post_step

    model, converted = _tiny_float8_model(recipe, fsdp_all_gather=True)
    linears = [m for m in model.modules() if type(m).__name__ == "Float8Linear"]
    assert converted == len(linears) == 14
    assert {m.config.cast_config_input.scaling_granularity.name for m in linears} == {granularity}
    assert {m.config.enable_fsdp_float8_all_gather for m in linears} == {fsdp_all_gather}
    assert (float8_post_step(model) is not None) == fsdp_all_gather


def test_row_scales_keep_the_rows_beside_an_outlier():
    """Checked against the exact product: one input row 100,000 x larger than the others pushes
    the others into float8's subnormals under one scale per tensor, not under one per row, so
    a rowwise linear's output for those rows is several times closer (the recipe's scales are
    really in the matmul)."""
    import torch

    from training.model import allocate, init_random_

    errors = {}
    for recipe in ("tensorwise", "rowwise"):
        model, _ = _tiny_float8_model(recipe, fsdp_all_gather=False)
        allocate(model, torch.device("cpu"))
        init_random_(model, 0)
        layer = next(m for m in model.modules() if type(m).__name__ == "Float8Linear")
        layer = layer.to(torch.bfloat16)
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(16, layer.in_features, generator=gen).bfloat16()
        x[0] *= 100_000
        with torch.no_grad():
            exact = (x.float() @ layer.weight.float().t())[1:]
            errors[recipe] = float((layer(x).float()[1:] - exact).abs().mean() / exact.abs().mean())
    assert errors["rowwise"] < 0.1
    assert errors["tensorwise"] > 3 * errors["rowwise"]
