"""The preview's forecast of speed and money (components/planning/forecast.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.planning.forecast import forecast, idle_tail_line
from components.planning.hardware import PROFILES
from components.planning.memory_fit import model_shape
from components.stack import preview_line
from tests.harness import parse, raw_settings
from training import config as C
from training.shapes import flops_per_token

SEVEN = model_shape("meta-llama/Llama-2-7b-hf", None)


def job(*argv: str) -> C.JobConfig:
    return C.parse_args(["--model", "meta-llama/Llama-2-7b-hf", "--batch-size", "3", *argv])


@pytest.mark.parametrize(("argv", "measured"), [
    (("--activation-checkpointing", "none", "--compile"), 12065),
    (("--activation-checkpointing", "full", "--compile"), 9881),
    (("--activation-checkpointing", "full"), 7643),  # eager
    (("--activation-checkpointing", "none", "--compile", "--precision", "fp8"), 15766),
])
def test_one_node_speed_is_the_measured_one(argv, measured):
    """Checked against docs/performance.md: on one node the forecast is the 2 x H200 measurement
    (tokens/s/GPU, Llama-2-7B, batch 3) within the scaling model's NVLink difference between 2
    and 8 GPUs (under 2 %)."""
    assert forecast(SEVEN, job(*argv), PROFILES["p5"], 1, 8).tokens_per_s_per_gpu == pytest.approx(measured, rel=0.02)


def test_more_nodes_move_speed_and_money_as_priced():
    """16 nodes cost 16 x the dated price and keep the scaling model's efficiency (98-99 % on
    p5, docs/performance.md)."""
    p5 = PROFILES["p5"]
    bf16 = forecast(SEVEN, job("--activation-checkpointing", "none", "--compile"), p5, 16, 8)
    assert bf16.usd_per_hour == pytest.approx(16 * p5.usd_per_hour)
    assert 0.97 <= bf16.scaling_efficiency <= 1.0
    assert bf16.usd_per_billion_tokens == pytest.approx(
        bf16.usd_per_hour / (bf16.tokens_per_s * 3600 / 1e9))


def test_dense_mask_attention_is_forecast_at_its_measured_packed_speed():
    """Checked against the one-H200 call (docs/benchmarks/h200-packed/call1): packed rows on
    the dense-mask path ran 21,113 tokens/s where plain rows ran 25,087; FlexAttention, the
    default, keeps the plain rate."""
    p5 = PROFILES["p5"]
    flex = forecast(SEVEN, job("--activation-checkpointing", "none", "--compile"), p5, 1, 8)
    sdpa = forecast(SEVEN, job("--activation-checkpointing", "none", "--compile",
                               "--packed-attention", "sdpa"), p5, 1, 8)
    assert sdpa.tokens_per_s_per_gpu / flex.tokens_per_s_per_gpu == pytest.approx(21113 / 25087, rel=0.01)


def test_every_committed_stack_prints_time_and_money(stack):
    """The case a user meets: each stack file's job gets a line with tokens/s and $ per hour,
    and says what the price is (on demand, or a Capacity Block's rate)."""
    profile = PROFILES[raw_settings(stack)["profile"]]
    line = preview_line(parse(raw_settings(stack)))
    assert line and "tokens/s per GPU" in line
    assert f"{profile.instance_type} at ${profile.usd_per_hour:,.2f}/h {profile.price_basis} = $" in line


def test_float8_recipes_are_forecast_at_their_measured_speed():
    """Checked against the one-H200 call (docs/benchmarks/h200-loss/call1: 16 layers of the 7B
    shape, no AC, compile): each recipe's tokens/s over tensorwise's, read from its JSON."""
    import json
    from pathlib import Path

    call = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "h200-loss" / "call1"
    speed = {json.loads(p.read_text())["tag"]: json.loads(p.read_text())["perf/tokens_per_s_per_gpu"]
             for p in call.glob("ours-16l-fp8*.json")}
    p5 = PROFILES["p5"]
    base = ("--activation-checkpointing", "none", "--compile", "--precision", "fp8")
    tensorwise = forecast(SEVEN, job(*base), p5, 1, 8).tokens_per_s_per_gpu
    for recipe in ("rowwise", "rowwise_with_gw_hp"):
        f = forecast(SEVEN, job(*base, "--float8-recipe", recipe), p5, 1, 8)
        assert f.tokens_per_s_per_gpu / tensorwise == pytest.approx(
            speed[f"ours-16l-fp8-{recipe}"] / speed["ours-16l-fp8"], rel=1e-3)


@pytest.mark.parametrize(("changes", "expected"), [
    # The line names the delay, the nodes, and delay x nodes x price.
    ({}, "idle tail after the job: 10 min x 2 nodes = ${tail:,.2f} before they scale to zero"),
    ({"scaleDownDelayMinutes": 20}, "idle tail after the job: 20 min x 2 nodes = ${tail:,.2f} before"),
    ({"scaleDownDelayMinutes": 0}, "idle tail after the job: ${hourly:,.2f}/h until the nodes are scaled down by hand"),
])
def test_preview_gives_the_idle_tail_beside_the_jobs_cost(changes, expected):
    """The forecast line ends with what the GPU nodes cost after the job: the autoscaler's
    delay x the job's nodes x the dated price, or the hourly price when nothing scales them down."""
    raw = raw_settings("p5")
    raw["gpuNodes"] = {**raw["gpuNodes"], **changes}
    settings = parse(raw)
    price, nodes = settings.profile.usd_per_hour, settings.job.nodes
    delay = settings.gpu_nodes.scale_down_delay_minutes
    line = preview_line(settings)
    assert line.startswith("job forecast:"), line
    assert expected.format(tail=nodes * price * delay / 60, hourly=nodes * price) in line, line


def test_a_reservation_is_paid_whether_nodes_run_or_not():
    """Scaling to zero saves the instance-hours of on-demand nodes, nothing of a reservation."""
    raw = raw_settings("p5")
    raw["gpuNodes"] = {**raw["gpuNodes"], "capacityReservationId": "cr-0123456789abcdef0"}
    assert "the reservation itself bills whether nodes run or not" in preview_line(parse(raw))
    assert "reservation" not in preview_line(parse(raw_settings("p5")))


def test_an_existing_clusters_nodes_are_priced_by_the_hour():
    """On an existing cluster nothing of this stack scales the GPU nodes: the tail is an hourly
    price, never a delay."""
    tail = idle_tail_line(55.04, 2, None, reservation=False)
    assert "$110.08/h for 2" in tail and "min x" not in tail


@pytest.mark.parametrize("call, ac", [("call3", "none"), ("call5", "full")])
def test_the_llama3_shape_is_forecast_at_its_measured_mfu(call, ac):
    """Checked against one-H200 calls (docs/benchmarks/h200-llama3/: 16 layers of each shape
    without AC in call3, 32 layers of each with full AC in call5; compile, one call each): the
    forecast MFU of Llama-3-8B over Llama-2-7B's is the measured MFU ratio, read from the two
    JSONs of the call."""
    folder = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "h200-llama3" / call
    mfu = {r["tag"]: r["perf/mfu_pct"]
           for r in (json.loads(p.read_text()) for p in folder.glob("ours-*.json"))}
    llama3, llama2 = (("ours-l3-16l-none", "ours-16l-none") if ac == "none"
                      else ("ours-l3-32l-full", "ours-7b-full"))
    eight = model_shape("meta-llama/Meta-Llama-3-8B", None)
    argv = ("--activation-checkpointing", ac, "--compile", "--seq-len", "4096")
    p5 = PROFILES["p5"]

    def forecast_mfu(shape, model):
        f = forecast(shape, C.parse_args(["--model", model, "--batch-size", "2", *argv]), p5, 1, 8)
        flops = flops_per_token(shape.parameters - shape.vocab * shape.hidden, shape.layers,
                                shape.hidden, 4096)
        return f.tokens_per_s_per_gpu * flops

    ratio = forecast_mfu(eight, "meta-llama/Meta-Llama-3-8B") / forecast_mfu(
        SEVEN, "meta-llama/Llama-2-7b-hf")
    assert ratio == pytest.approx(mfu[llama3] / mfu[llama2], rel=1e-3)
