"""The per-request log round trip, report files (JSON, Markdown, PNG) and --compare tables."""

import json

import pytest

from lmi_tools.bench.markdown import compare_markdown, markdown
from lmi_tools.bench.metrics import summarize
from lmi_tools.bench.records import RequestRecord, RunLog
from lmi_tools.bench.report import FORMAT, build_report, load_report, write_reports
from lmi_tools.bench.runner import RunResult
from lmi_tools.errors import UsageError

SETTINGS = {"target": {"api": "lmi", "stream": True, "url": "http://127.0.0.1:8080/predictions/m"},
            "request": {"max_new_tokens": 4, "ignore_eos": True, "ignore_eos_supported": True},
            "prompt": {"description": "8 tokens of filler text counted with /tok", "variants": 8, "tokens": [8]},
            "load": {"concurrencies": [1, 4], "requests": 6, "duration_s": None, "warmup": None,
                     "request_timeout_s": 120.0, "max_duration_s": 1800.0},
            "tokenizer": "/tok", "price": {"per_hour": 0.7582, "source": "--price-per-hour"}}


def synthetic_log(concurrency: int, failures: int = 0) -> RunLog:
    records = []
    for i in range(6):  # multiples of 1/64 s: exact in binary and in the log's 6 decimals
        send = i * 0.5 / concurrency
        times = [send + 0.125 + k / 64 for k in range(4)]
        records.append(RequestRecord(index=i, send=send, end=times[-1] + 1 / 64, first_token=times[0],
                                     token_times=times, status=200, finish_reason="length", input_tokens=8,
                                     input_tokens_source="server", output_tokens=4, output_tokens_source="server"))
    for record in records[:failures]:
        record.error, record.first_token, record.token_times = "HTTP 503: queue full", None, []
    return RunLog(concurrency, records, started_at="2026-01-01T00:00:00+00:00")


def results(failures: int = 0) -> list[RunResult]:
    return [RunResult(log, summarize(log, 0.7582)) for log in (synthetic_log(1), synthetic_log(4, failures))]


def test_a_request_log_round_trips_and_summarises_the_same():
    log = synthetic_log(4, failures=2)
    lines = [json.loads(json.dumps(line)) for line in log.to_lines()]
    assert lines[0]["kind"] == "run" and len(lines) == 7 and "text" not in lines[1]
    again = RunLog.from_lines(lines)
    assert json.dumps(summarize(again, 1.0), sort_keys=True) == json.dumps(summarize(log, 1.0), sort_keys=True)
    with pytest.raises(ValueError, match="run header"):
        RunLog.from_lines(lines[1:])


def test_write_reports_writes_logs_json_markdown_and_pngs(tmp_path):
    runs = results(failures=1)
    report = build_report(SETTINGS, runs)
    written = write_reports(report, runs, tmp_path)
    names = sorted(p.name for p in written)
    assert names == ["latency_cdf.png", "report.json", "report.md", "requests-c1.jsonl", "requests-c4.jsonl",
                     "throughput_vs_concurrency.png", "ttft_vs_concurrency.png"]
    for png in tmp_path.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    saved = load_report(tmp_path / "report.json")
    assert saved["format"] == FORMAT and [r["concurrency"] for r in saved["runs"]] == [1, 4]
    assert saved["runs"][1]["summary"]["requests"]["errors"] == 1
    assert "inter_token" in saved["definitions"] and saved["settings"]["tokenizer"] == "/tok"
    log = RunLog.from_lines(json.loads(line) for line in (tmp_path / "requests-c4.jsonl").read_text().splitlines())
    assert json.dumps(summarize(log, 0.7582), sort_keys=True) == json.dumps(saved["runs"][1]["summary"],
                                                                            sort_keys=True)


def test_markdown_report_states_settings_results_counts_and_definitions():
    report = build_report(SETTINGS, results(failures=2))
    report["plots"] = ["latency_cdf.png"]
    text = markdown(report)
    assert "| metric | C=1 | C=4 |" in text
    assert "| requests/min (RPM) |" in text and "| $ per 1M tokens, blended 3:1 |" in text
    assert "- C=4: 2 x HTTP 503: queue full" in text
    assert "counted with /tok" in text and "$0.7582/hour" in text
    assert "![latency_cdf.png](latency_cdf.png)" in text
    assert "**inter_token**: gaps between consecutive token events" in text
    assert "input: server 6; output: server 6" in text


def test_plots_cope_with_runs_that_have_no_successful_request(tmp_path):
    log = synthetic_log(2, failures=6)
    runs = [RunResult(log, summarize(log, None))]
    write_reports(build_report(SETTINGS, runs), runs, tmp_path)
    assert (tmp_path / "latency_cdf.png").stat().st_size > 0


def test_compare_puts_runs_side_by_side():
    a, b = build_report(SETTINGS, results()), build_report({**SETTINGS, "price": None}, results(failures=3))
    text = compare_markdown([("inf2", a), ("g5", b)])
    assert "| metric | inf2 C=1 | inf2 C=4 | g5 C=1 | g5 C=4 |" in text
    assert "| inf2 | `lmi` http://127.0.0.1:8080/predictions/m |" in text
    error_row = next(line for line in text.splitlines() if line.startswith("| error rate |"))
    assert error_row.split("|")[2:6] == [" 0.0% ", " 0.0% ", " 0.0% ", " 50.0% "]


@pytest.mark.parametrize("content, message", [(None, "does not exist"), ("{", "is not JSON"),
                                              ('{"runs": []}', "is not an lmi bench report")])
def test_load_report_rejects_what_is_not_a_report(tmp_path, content, message):
    path = tmp_path / "report.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UsageError, match=message):
        load_report(path)
