"""Every benchmark formula on synthetic logs (no clock, no network)."""

import pytest

from lmi_tools.bench import metrics
from lmi_tools.bench.records import RequestRecord, RunLog


def record(index=0, send=0.0, tokens=(), end=None, inputs=10, outputs=None, error=None, **extra):
    times = list(tokens)
    return RequestRecord(index=index, send=send, end=end if end is not None else (times[-1] if times else send),
                         first_token=times[0] if times else None, token_times=times, error=error,
                         input_tokens=inputs, input_tokens_source="server",
                         output_tokens=len(times) if outputs is None else outputs, output_tokens_source="server",
                         status=200 if error is None else 500, **extra)


def inf2_example_log() -> RunLog:
    """The AWS inf2 example: 10 users, 104-token prompts, 500 new tokens, 15 minutes, 0.3 requests/s.

    27 rounds of 10 requests, each round 900/27 = 33.3 s long: 270 requests in 900 s.
    """
    round_s = 900 / 27
    records = [record(index=r * 10 + u, send=r * round_s, end=(r + 1) * round_s, inputs=104, outputs=500,
                      tokens=[r * round_s + 1 + 0.06 * k for k in range(500)])
               for r in range(27) for u in range(10)]
    for rec in records:
        rec.end = rec.send + round_s
    return RunLog(concurrency=10, records=records)


def test_the_inf2_example_rpm_tpm_and_cost_per_million_tokens():
    summary = metrics.summarize(inf2_example_log(), price_per_hour=0.7582)
    assert summary["wall_s"] == pytest.approx(900)
    assert summary["requests_per_minute"] == pytest.approx(18)
    assert summary["tokens_per_minute"] == pytest.approx(10_872)  # 0.3 req/s x 60 x (104 + 500)
    assert summary["output_tokens_per_minute"] == pytest.approx(9_000)
    assert summary["cost"]["per_1m_tokens"] == pytest.approx(1.1623, abs=1e-4)
    assert round(summary["cost"]["per_1m_tokens"], 2) == 1.16
    assert summary["cost"]["per_1m_output_tokens"] == pytest.approx(1e6 / 9000 / 60 * 0.7582)


@pytest.mark.parametrize("tpm, price, expected", [
    (30_000, 1.00, 0.5556),      # reference/sagemaker.md §6.1: 1e6/30000/60 = 0.556 h
    (10_872, 0.7582, 1.1623),
    (60_000, 2.00, 0.5556),
])
def test_cost_per_million_tokens(tpm, price, expected):
    assert metrics.cost_per_million_tokens(tpm, price) == pytest.approx(expected, abs=1e-4)


def test_cost_without_throughput_is_unknown():
    assert metrics.cost_per_million_tokens(None, 1.0) is None
    assert metrics.cost_per_million_tokens(0, 1.0) is None
    assert metrics.blended_price_3_to_1(0, 1.0) is None


def test_blended_price_3_to_1():
    # §6.4: C=10, ITL p50 = 25 ms -> 400 output tokens/s; $1/h -> $0.69 per 1M output tokens, blended /4 = $0.17
    assert metrics.blended_price_3_to_1(400, 1.0) == pytest.approx(1e6 / (400 * 3600) / 4)
    assert round(metrics.blended_price_3_to_1(400, 1.0), 2) == 0.17


@pytest.mark.parametrize("values, q, expected", [
    ([1, 2, 3, 4], 50, 2.5),
    ([1, 2, 3, 4], 0, 1),
    ([1, 2, 3, 4], 100, 4),
    ([10, 20], 90, 19),
    ([5], 99, 5),
    (list(range(1, 101)), 90, 90.1),    # numpy.percentile(range(1, 101), 90) == 90.1
    ([3, 1, 2], 50, 2),                 # order does not matter
])
def test_percentile_interpolates_linearly(values, q, expected):
    assert metrics.percentile(values, q) == pytest.approx(expected)


@pytest.mark.parametrize("values, q", [([], 50), ([1.0], 101), ([1.0], -1)])
def test_percentile_rejects_bad_input(values, q):
    with pytest.raises(ValueError):
        metrics.percentile(values, q)


def test_distribution():
    assert metrics.distribution([]) is None
    dist = metrics.distribution([4.0, 1.0, 3.0, 2.0])
    assert dist == {"count": 4, "mean": 2.5, "min": 1.0, "p50": 2.5, "p90": pytest.approx(3.7),
                    "p99": pytest.approx(3.97), "max": 4.0}


def test_per_request_latencies():
    rec = record(send=1.0, tokens=[1.5, 1.6, 1.8, 2.1], end=2.2, outputs=4)
    assert metrics.end_to_end(rec) == pytest.approx(1.2)
    assert metrics.time_to_first_token(rec) == pytest.approx(0.5)
    assert metrics.inter_token_gaps(rec) == pytest.approx([0.1, 0.2, 0.3])     # TTFT is not a gap
    assert metrics.time_per_output_token(rec) == pytest.approx(0.6 / 3)      # (last - first) / (out - 1)
    assert metrics.itl_including_ttft(rec) == pytest.approx(1.1 / 4)         # LLMPerf: (last - send) / out
    assert metrics.request_output_rate(rec) == pytest.approx(4 / 1.2)


def test_time_per_output_token_uses_the_token_count_not_the_event_count():
    # an OpenAI stream whose 2 chunks carried 5 tokens in all
    rec = record(send=0.0, tokens=[0.2, 0.6], outputs=5)
    assert metrics.time_per_output_token(rec) == pytest.approx(0.4 / 4)
    assert metrics.inter_token_gaps(rec) == pytest.approx([0.4])


def test_single_token_and_non_streamed_requests_have_no_decode_latency():
    one = record(tokens=[0.3], outputs=1)
    assert metrics.time_per_output_token(one) is None and metrics.inter_token_gaps(one) == []
    whole = RequestRecord(index=0, send=0.0, end=0.9, first_token=0.9, output_tokens=7)
    assert metrics.time_to_first_token(whole) == pytest.approx(0.9)
    assert metrics.itl_including_ttft(whole) is None and metrics.time_per_output_token(whole) is None


def test_summary_counts_failures_and_cancelled_requests_in_the_error_rate():
    records = [record(index=0, send=0.0, tokens=[0.5, 1.0], inputs=4),
               record(index=1, send=0.0, tokens=[0.5, 1.0, 1.5, 2.0], inputs=4),
               record(index=2, send=1.0, end=4.0, error="HTTP 500: boom", inputs=None, outputs=0)]
    summary = metrics.summarize(RunLog(2, records, cancelled=1))
    assert summary["requests"] == {"started": 4, "ok": 2, "errors": 1, "cancelled": 1, "error_rate": 0.5}
    assert summary["wall_s"] == pytest.approx(4.0)  # failed requests still span the wall time
    assert summary["requests_per_minute"] == pytest.approx(2 / 4 * 60)
    assert summary["tokens"]["input"] == 8 and summary["tokens"]["output"] == 6
    assert summary["tokens_per_minute"] == pytest.approx(14 / 4 * 60)
    assert summary["output_tokens_per_s"] == pytest.approx(6 / 4)
    assert summary["errors"] == {"HTTP 500: boom": 1}
    assert summary["latency_s"]["end_to_end"]["count"] == 2
    assert summary["cost"] is None


def test_unknown_input_tokens_leave_tpm_unknown_rather_than_understated():
    records = [record(index=0, tokens=[0.1, 0.2], inputs=5), record(index=1, tokens=[0.1, 0.2], inputs=None)]
    summary = metrics.summarize(RunLog(1, records), price_per_hour=1.0)
    assert summary["tokens"]["input"] is None and summary["tokens_per_minute"] is None
    assert summary["cost"]["per_1m_tokens"] is None
    assert summary["output_tokens_per_minute"] == pytest.approx(4 / 0.2 * 60)
    assert summary["tokens"]["sources"]["output"] == {"server": 2}


def test_estimates_other_tools_report():
    # two clients, each request 1 s long with 11 tokens 0.1 s apart
    records = [record(index=i, send=float(i // 2), end=float(i // 2) + 1.0,
                      tokens=[i // 2 + 0.0 + 0.1 * k for k in range(11)]) for i in range(4)]
    summary = metrics.summarize(RunLog(2, records))
    assert summary["latency_s"]["inter_token"]["p50"] == pytest.approx(0.1)
    assert summary["estimates"]["output_tokens_per_s_from_itl_p50"] == pytest.approx(2 / 0.1)
    assert summary["estimates"]["requests_per_s_from_latency_sum"] == pytest.approx(4 / 4.0 * 2)


def test_an_empty_run_summarises_without_dividing_by_zero():
    summary = metrics.summarize(RunLog(4, [], cancelled=0), price_per_hour=1.0)
    assert summary["requests"]["started"] == 0 and summary["requests"]["error_rate"] is None
    assert summary["requests_per_minute"] is None and summary["latency_s"]["end_to_end"] is None
    assert summary["cost"]["per_1m_tokens"] is None


def test_every_reported_cost_and_throughput_figure_has_a_definition():
    for name in ("requests_per_minute", "tokens_per_minute", "output_tokens_per_s", "per_1m_tokens",
                 "blended_3_to_1_per_1m_tokens", "inter_token", "time_per_output_token", "inter_token_with_ttft"):
        assert name in metrics.DEFINITIONS
