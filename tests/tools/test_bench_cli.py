"""``lmi bench`` command-line errors: each names the option, the value and what is allowed (exit code 2)."""

import pytest

from lmi_tools.cli import main

URL = "http://127.0.0.1:9/predictions/m"


@pytest.mark.parametrize("args, message", [
    ([], "give one TARGET (or --serve MODEL_DIR)"),
    ([URL, URL], "give one TARGET"),
    ([URL, "--sweep", "1,0"], "--sweep '1,0': '0' is not a positive integer"),
    ([URL, "--sweep", "1,,4"], "is not a positive integer"),
    ([URL, "-c", "0"], "--concurrency must be positive, got 0"),
    ([URL, "-n", "0"], "--requests must be positive, got 0"),
    ([URL, "--duration", "-1"], "--duration must be positive"),
    ([URL, "--max-new-tokens", "0"], "--max-new-tokens must be positive"),
    ([URL, "--warmup", "-1"], "--warmup must be >= 0"),
    ([URL, "--extra-body", "[1]"], "--extra-body must be a JSON object"),
    ([URL, "--extra-body", "{x"], "--extra-body is not JSON"),
    ([URL, "-H", "no-colon"], "--header 'no-colon' is not 'Name: value'"),
    ([URL, "--price-per-hour", "0"], "--price-per-hour must be positive"),
    ([URL, "--instance-type", "g5.4xlarge"], "the instance table has no price for g5.4xlarge"),
    ([URL, "--instance-type", "z9.huge"], "unknown instance type 'z9.huge'"),
    ([URL, "--api", "grpc"], "--api 'grpc' is not one of"),
    (["http://h/generate", "--stream"], "--stream contradicts TARGET"),
    (["--compare"], "--compare needs report.json files"),
])
def test_usage_errors(args, message, capsys):
    assert main(["bench", *args, "--no-progress", "--no-plots"]) == 2
    assert message in capsys.readouterr().err


def test_serve_needs_a_model_directory(tmp_path, capsys):
    assert main(["bench", "--serve", str(tmp_path), "--no-progress"]) == 2
    assert "no serving.properties there" in capsys.readouterr().err


def test_serve_and_a_target_together(tmp_path, capsys):
    (tmp_path / "serving.properties").write_text("engine=Python\noption.backend=scripted\n"
                                                 "option.entryPoint=lmi_handlers.entrypoint\n")
    assert main(["bench", URL, "--serve", str(tmp_path), "--no-progress", "-o", str(tmp_path / "out")]) == 2
    assert "give either TARGET or --serve, not both" in capsys.readouterr().err


def test_compare_rejects_files_that_are_not_reports(tmp_path, capsys):
    path = tmp_path / "notes.json"
    path.write_text('{"hello": 1}')
    assert main(["bench", "--compare", str(path)]) == 2
    assert "is not an lmi bench report" in capsys.readouterr().err


@pytest.mark.parametrize("model_id, expected", [
    (None, "."),                 # no model_id: the model directory itself
    ("weights", "weights"),      # relative to the model directory
    ("ABS", "weights"),          # absolute
    ("missing", None),
])
def test_serve_finds_the_models_tokenizer(tmp_path, model_id, expected):
    from lmi_tools.bench.local_server import tokenizer_dir

    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "tokenizer.json").write_text("{}")
    if model_id is None:
        (tmp_path / "tokenizer_config.json").write_text("{}")
    value = str(tmp_path / "weights") if model_id == "ABS" else model_id
    (tmp_path / "serving.properties").write_text("engine=Python\n" + (f"option.model_id={value}\n" if value else ""))
    found = tokenizer_dir(tmp_path)
    assert found == (None if expected is None else (tmp_path / expected if expected != "." else tmp_path))


def test_a_dead_port_is_one_error_before_anything_is_sent(tmp_path, capsys):
    output = tmp_path / "report"
    assert main(["bench", URL, "-n", "4", "--no-progress", "--output", str(output)]) == 1
    err = capsys.readouterr().err
    assert "cannot connect to 127.0.0.1:9" in err and "nothing was sent" in err
    assert not output.exists()


def test_prompt_tokens_without_a_tokenizer_warns_that_they_are_words(tmp_path, capsys):
    main(["bench", URL, "--prompt-tokens", "32", "--no-progress", "--output", str(tmp_path)])
    assert "--prompt-tokens 32 means 32 words" in capsys.readouterr().err
