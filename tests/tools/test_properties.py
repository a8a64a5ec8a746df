"""serving.properties as DJLServing reads it (java.util.Properties), and DJL's environment overrides."""

from __future__ import annotations

import pytest

from lmi_tools.errors import UsageError
from lmi_tools.modeldir.properties import (
    format_value, init_properties, parse_directives, parse_properties, read_serving_properties, with_environment,
)


def test_comments_blank_lines_and_first_separator():
    text = ("# a comment\n! also a comment\n\n   \nengine=Python\noption.model_id = s3://bucket/a=b\n"
            "  option.dtype=fp16  \n")
    # Like Java, leading whitespace goes and trailing whitespace stays part of the value.
    assert parse_properties(text) == {"engine": "Python", "option.model_id": "s3://bucket/a=b",
                                      "option.dtype": "fp16  "}


@pytest.mark.parametrize("line, key, value", [
    ("key=value", "key", "value"),
    ("key = value", "key", "value"),
    ("key:value", "key", "value"),
    ("key value", "key", "value"),
    ("key", "key", ""),
    ("key=", "key", ""),
    ("option.entryPoint=model.py", "option.entryPoint", "model.py"),
    (r"path=C:\\models\\x", "path", r"C:\models\x"),
    (r"tab=a\tb", "tab", "a\tb"),
    (r"uni=caf\u00e9", "uni", "café"),
    (r"a\=b=c", "a=b", "c"),
])
def test_java_key_value_rules(line, key, value):
    assert parse_properties(line) == {key: value}


def test_line_continuation_and_comment_with_trailing_backslash():
    text = "# comment \\\nlist=a,\\\n    b,\\\n    c\nnext=1\n"
    assert parse_properties(text) == {"list": "a,b,c", "next": "1"}


def test_last_value_wins():
    assert parse_properties("a=1\na=2\n") == {"a": "2"}


def test_init_view_strips_option_prefix_and_keeps_other_keys():
    raw = {"engine": "Python", "option.entryPoint": "model.py", "batch_size": "4", "option.rolling_batch": "disable"}
    assert init_properties(raw) == {"engine": "Python", "entryPoint": "model.py", "batch_size": "4",
                                    "rolling_batch": "disable"}


def test_read_serving_properties_from_directory_or_file(tmp_path):
    (tmp_path / "serving.properties").write_bytes(b"engine=Python\noption.model_id=caf\xe9\n")
    expected = {"engine": "Python", "model_id": "café"}  # ISO-8859-1, as Java reads an InputStream
    assert read_serving_properties(tmp_path) == expected
    assert read_serving_properties(tmp_path / "serving.properties") == expected


def test_missing_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="serving.properties"):
        read_serving_properties(tmp_path)


def test_environment_overrides_follow_djl(tmp_path):
    (tmp_path / "serving.properties").write_text("engine=Python\noption.rolling_batch=disable\n")
    environ = {
        "OPTION_ROLLING_BATCH": "auto",          # the file wins
        "OPTION_MAX_ROLLING_BATCH_SIZE": "16",   # snake case -> lower case
        "OPTION_ENTRYPOINT": "model.py",         # -> entryPoint
        "OPTION_ENGINE": "MPI",                  # -> engine (not an option), and the file wins
        "OPTION_myKey": "x",                     # not all-caps: kept as is
        "OPTION_DTYPE": "",                      # empty values are ignored
        "ARGS_JOB_QUEUE_SIZE": "10",             # -> a non-option key
        "PATH": "/usr/bin",
    }
    props = read_serving_properties(tmp_path, environ)
    assert props == {"engine": "Python", "rolling_batch": "disable", "max_rolling_batch_size": "16",
                     "entryPoint": "model.py", "myKey": "x", "job_queue_size": "10"}
    assert read_serving_properties(tmp_path) == {"engine": "Python", "rolling_batch": "disable"}


def test_environment_fills_engine_when_the_file_has_none():
    assert with_environment({}, {"OPTION_ENGINE": "Python"}) == {"engine": "Python"}


def test_directives_are_comments_for_djl():
    text = "# lmi: instance_type=inf2.xlarge\n#lmi:other = x y \nengine=Python\n"
    assert parse_directives(text) == {"instance_type": "inf2.xlarge", "other": "x y"}
    assert parse_properties(text) == {"engine": "Python"}


@pytest.mark.parametrize("value, text", [(True, "true"), (False, "false"), (8, "8"), ([256, 512], "256,512"),
                                         ("s3://b/k", "s3://b/k")])
def test_format_value(value, text):
    assert format_value(value) == text


@pytest.mark.parametrize("value", ["a\nb", "C:\\x", " padded", "café"])
def test_format_value_refuses_what_java_would_change(value):
    with pytest.raises(ValueError):
        format_value(value)
