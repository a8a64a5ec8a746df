"""The model store's settings: DJLServing's sources, read with the runtime's own value parsers."""

from __future__ import annotations

import pytest

from lmi_tools.serving.store import ServerConfig, model_settings


def model_dir(tmp_path, text: str):
    (tmp_path / "serving.properties").write_text(text)
    return tmp_path


def test_numbers_and_rolling_batch(tmp_path):
    directory = model_dir(tmp_path, "option.rolling_batch=scheduler\noption.max_rolling_batch_size=8\n"
                                    "job_queue_size=5\nmax_batch_delay=0\noption.predict_timeout=2.5\n")
    settings = model_settings(directory, ServerConfig(), environ={})
    assert settings.rolling and settings.max_rolling_batch_size == 8
    assert (settings.job_queue_size, settings.max_batch_delay_ms, settings.worker.predict_timeout) == (5, 0, 2.5)
    assert not model_settings(model_dir(tmp_path, "option.rolling_batch=disable\n"), ServerConfig(), environ={}).rolling


@pytest.mark.parametrize("line, message", [
    ("job_queue_size=many", "job_queue_size='many' in {}/serving.properties is invalid: expected an integer"),
    ("batch_size=0", "batch_size='0' in {}/serving.properties is invalid: expected an integer >= 1"),
    ("option.predict_timeout=-1", "predict_timeout='-1' in {}/serving.properties is invalid: expected a number"),
])
def test_a_bad_value_names_the_key_the_value_and_the_file(tmp_path, line, message):
    with pytest.raises(ValueError) as info:
        model_settings(model_dir(tmp_path, line + "\n"), ServerConfig(), environ={})
    assert str(info.value).startswith(message.format(tmp_path))


def test_server_defaults_from_the_environment():
    config = ServerConfig.from_env({"SERVING_JOB_QUEUE_SIZE": "7", "PREDICT_TIMEOUT": "30"})
    assert (config.job_queue_size, config.predict_timeout, config.batch_size) == (7, 30.0, 1)
    with pytest.raises(ValueError, match="SERVING_BATCH_SIZE='x' in the environment is invalid"):
        ServerConfig.from_env({"SERVING_BATCH_SIZE": "x"})


def test_the_url_pattern_bounds_the_code_a_model_runs_not_only_its_directory(tmp_path):
    from lmi_tools.serving.store import ModelStore, NotAllowed, code_outside

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "evil.py").write_text("raise SystemExit('ran code from outside the pattern')\n")
    allowed = tmp_path / "models"
    store = ModelStore(ServerConfig(model_url_pattern=str(allowed) + "/.*"))
    cases = {"relative": "option.entryPoint=../../outside/evil.py\n",
             "absolute": f"option.entryPoint={outside}/evil.py\n",
             "pythonpath": f"option.entryPoint=evil\nenv=PYTHONPATH={outside}\n",
             "preload": "env=LD_PRELOAD=/tmp/x.so\n"}
    for name, properties in cases.items():
        directory = allowed / name
        directory.mkdir(parents=True)
        (directory / "serving.properties").write_text(properties)
        with pytest.raises(NotAllowed, match="bounds the code a model runs as well as its directory"):
            store.register_url(name, str(directory))
    linked = allowed / "linked"
    linked.mkdir()
    (linked / "model.py").symlink_to(outside / "evil.py")
    with pytest.raises(NotAllowed, match=f"its entry point model.py resolves to {outside}/evil.py"):
        store.register_url("linked", str(linked))
    inside = allowed / "inside"
    (inside / "code").mkdir(parents=True)
    (inside / "code" / "handler.py").write_text("")
    (inside / "serving.properties").write_text("option.entryPoint=code/handler.py\nenv=HF_HOME=/tmp/hf\n")
    assert code_outside(inside) is None
    (inside / "serving.properties").write_text("option.entryPoint=lmi_handlers.entrypoint\n")
    assert code_outside(inside) is None and store.models == {}
    (inside / "serving.properties").write_text("option.entryPoint=code.handler\n")  # a dotted module inside
    assert code_outside(inside) is None


@pytest.mark.parametrize("link, entry", [("sub", "sub.evil"), ("sub", "sub"), ("evil.py", "evil"),
                                         ("pkg/__init__.py", "pkg"), ("pkg/deep", "pkg.deep.evil")])
def test_a_dotted_entry_point_is_refused_where_python_would_import_it_from_outside(tmp_path, link, entry):
    """``option.entryPoint=sub.evil`` with ``sub`` a link out of the allowed directory: the module's file is found
    as Python's import would find it (the model directory first), without running it."""
    from lmi_tools.serving.store import ModelStore, NotAllowed

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "__init__.py").write_text("raise SystemExit('ran code from outside the pattern')\n")
    (outside / "evil.py").write_text("raise SystemExit('ran code from outside the pattern')\n")
    directory = tmp_path / "models" / "m"
    (directory / "pkg").mkdir(parents=True)
    (directory / "pkg" / "deep").mkdir()
    (directory / "serving.properties").write_text(f"option.entryPoint={entry}\n")
    target = directory / link
    if target.exists():
        target.rmdir()
    target.symlink_to(outside / "evil.py" if link.endswith(".py") else outside)
    store = ModelStore(ServerConfig(model_url_pattern=f"{tmp_path}/models/.*"))
    with pytest.raises(NotAllowed, match=f"its entry point {entry} is imported from {outside}"):
        store.register_url("m", str(directory))
    assert store.models == {}
