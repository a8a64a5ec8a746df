"""``lmi validate`` on an embedding model (``option.task=text-embedding``): what the handler's load refuses, the
pooling it will use, and no KV-cache figures."""

from lmi_tools.validation.validate import validate_model_dir


def model_dir(tmp_path, minilm_dir, **options):
    lines = {"engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint", "option.model_id": str(minilm_dir),
             "option.task": "text-embedding", **{f"option.{k}": v for k, v in options.items()}}
    (tmp_path / "serving.properties").write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
    return tmp_path


def test_an_embedding_model_validates_with_its_pooling_and_no_kv_cache(tmp_path, minilm_dir):
    report = validate_model_dir(model_dir(tmp_path, minilm_dir, backend="hf"), "g5.xlarge")
    assert report.ok, [f.message for f in report.errors]
    pooling = next(f for f in report.findings if f.check == "pooling")
    assert pooling.message == "mean pooling, normalized, inputs up to 256 tokens"
    assert "weights" in report.figures and not any(name.startswith("kv cache") for name in report.figures)


def test_rolling_batch_and_an_unknown_task_are_errors(tmp_path, minilm_dir):
    report = validate_model_dir(model_dir(tmp_path, minilm_dir, backend="hf", rolling_batch="auto"), "g5.xlarge")
    assert [f.check for f in report.errors] == ["task"] and "option.rolling_batch" in report.errors[0].message
    report = validate_model_dir(model_dir(tmp_path, minilm_dir, backend="hf", task="translation"), "g5.xlarge")
    assert not report.ok and "option.task" in " ".join(f.message for f in report.errors)
