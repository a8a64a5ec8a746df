"""A packaged, then unpacked, artifact is served exactly like the directory it came from."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx

from lmi_tools.packaging.artifact import unpack

ROOT = Path(__file__).resolve().parents[1]
# The shim prints where the runtime came from, so the test can see the vendored copy was used.
MODEL_PY = ("import lmi_handlers\nprint('runtime from', lmi_handlers.__file__, flush=True)\n"
            "from lmi_handlers.entrypoint import handle  # noqa: E402,F401\n")


def lmi(*args):
    return subprocess.run([sys.executable, "-m", "lmi_tools", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, check=False)


def test_unpacked_artifact_answers_like_its_source(serve, tiny_model_dir, tmp_path):
    source = tmp_path / "source"
    shutil.copytree(tiny_model_dir, source)  # weights inside the directory: the artifact is self-contained
    # stock kernels: the artifact must answer bit for bit like its source (auto's compiled kernels are built once per
    # source folder, and the vendored copy builds its own)
    (source / "serving.properties").write_text("engine=Python\noption.rolling_batch=scheduler\n"
                                               "option.max_new_tokens=12\noption.cpu_linear_kernel=stock\n"
                                               "option.cpu_attention_kernel=torch\n")
    (source / "model.py").write_text(MODEL_PY)
    packaged = lmi("package", source, "-o", tmp_path / "model.tar.gz", "--instance", "g5.xlarge")
    assert packaged.returncode == 0, packaged.stderr
    inspected = lmi("inspect", tmp_path / "model.tar.gz")
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr
    unpacked = unpack(tmp_path / "model.tar.gz", tmp_path / "unpacked")
    assert (unpacked / "lmi_handlers" / "entrypoint.py").is_file()

    server = serve([f"source={source}", f"unpacked={unpacked}"])
    for prompt in ("The quick brown fox", "Hello world", "What is"):
        plain = [httpx.post(f"{server.url}/predictions/{name}", json={"inputs": prompt}, timeout=60).json()
                 for name in ("source", "unpacked")]
        assert plain[0] == plain[1] and plain[0]["generated_text"]
        streams = []
        for name in ("source", "unpacked"):
            body = httpx.post(f"{server.url}/predictions/{name}", json={"inputs": prompt, "stream": True},
                              timeout=60).text
            streams.append([json.loads(line) for line in body.splitlines()])
        assert streams[0] == streams[1] and streams[0][-1]["generated_text"] == plain[0]["generated_text"]
    logs = server.logs()
    assert f"[unpacked] runtime from {unpacked / 'lmi_handlers' / '__init__.py'}" in logs
