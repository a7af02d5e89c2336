"""The preview's forecast of speed and money (components/forecast.py)."""

from __future__ import annotations

import pytest

from components.forecast import forecast, preview_line
from components.hardware import PROFILES
from components.memory_fit import model_shape
from tests.harness import parse, raw_settings
from training import config as C

SEVEN = model_shape("meta-llama/Llama-2-7b-hf", None)


def job(*argv: str) -> C.JobConfig:
    return C.parse_args(["--model", "meta-llama/Llama-2-7b-hf", "--batch-size", "3", *argv])


def test_one_node_speed_is_the_measured_one():
    """Checked against docs/performance.md: on one node the forecast is the 2 x H200 measurement
    (12,065 tokens/s/GPU, no AC, compile; 9,881 with full AC) within the scaling model's
    NVLink difference between 2 and 8 GPUs (under 2 %)."""
    p5 = PROFILES["p5"]
    none = forecast(SEVEN, job("--activation-checkpointing", "none", "--compile"), p5, 1, 8)
    full = forecast(SEVEN, job("--activation-checkpointing", "full", "--compile"), p5, 1, 8)
    assert none.tokens_per_s_per_gpu == pytest.approx(12065, rel=0.02)
    assert full.tokens_per_s_per_gpu == pytest.approx(9881, rel=0.02)


def test_float8_and_more_nodes_move_speed_and_money_as_measured_and_priced():
    """float8 is 1.31 x bf16 (measured); 16 nodes cost 16 x the dated on-demand price and keep
    the scaling model's efficiency (98-99 % on p5, docs/performance.md)."""
    p5 = PROFILES["p5"]
    bf16 = forecast(SEVEN, job("--activation-checkpointing", "none", "--compile"), p5, 16, 8)
    fp8 = forecast(SEVEN, job("--activation-checkpointing", "none", "--compile", "--precision", "fp8"),
                   p5, 16, 8)
    assert fp8.tokens_per_s_per_gpu / bf16.tokens_per_s_per_gpu == pytest.approx(15766 / 12065, rel=0.02)
    assert bf16.usd_per_hour == pytest.approx(16 * p5.on_demand_usd_per_hour)
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


@pytest.mark.parametrize("stack", ["p5", "p4de"])
def test_every_committed_stack_prints_time_and_money(stack):
    """The case a user meets: each stack file's job gets a line with tokens/s and $ per hour."""
    line = preview_line(parse(raw_settings(stack)))
    assert line and "tokens/s per GPU" in line and "/h on demand" in line
    assert PROFILES[stack].instance_type in line
