"""The docs check: every shell block of README.md and docs/*.md either runs here or says why it cannot.

A shell block (```bash, ```sh, ```shell, ```console) is preceded by one marker line:
``<!-- docs-check: run -->`` (run offline with ``bash -euo pipefail`` in an empty directory, the environment's
``bin`` first on PATH, as after ``source .venv/bin/activate``) or ``<!-- docs-check: skip REASON -->``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!-- docs-check: (run|skip (.+)) -->$")


@dataclass
class Block:
    where: str
    language: str
    marker: str | None  # "run", "skip" or None
    reason: str
    text: str


def shell_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if match.group(1) in SHELL:
            previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            marker = MARKER.match(previous)
            blocks.append(Block(f"{path.relative_to(ROOT)}:{i + 1}", match.group(1),
                                marker.group(1).split()[0] if marker else None,
                                (marker.group(2) or "") if marker else "", "\n".join(lines[i + 1:end])))
        i = end + 1
    return blocks


BLOCKS = [block for path in DOCS for block in shell_blocks(path)]


def test_every_shell_block_is_marked_run_or_skip_with_a_reason():
    unmarked = [block.where for block in BLOCKS if block.marker is None]
    assert not unmarked, f"add '<!-- docs-check: run -->' or '<!-- docs-check: skip REASON -->' before {unmarked}"
    assert all(len(block.reason) > 10 for block in BLOCKS if block.marker == "skip")


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.marker == "run"], ids=lambda b: b.where)
def test_runnable_block_runs(block, tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", block.text], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{block.where}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr


def free_port(also_next: bool = False) -> int:
    """A free port; with ``also_next``, one whose successor is free too (lmi serve's default management port)."""
    while True:
        with socket.socket() as sock, socket.socket() as after:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            if not also_next:
                return port
            try:
                after.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port


@pytest.mark.skipif(shutil.which("curl") is None, reason="the script uses curl")
def test_sagemaker_walkthrough_script_runs_offline(tmp_path):
    """docs/sagemaker.md's offline walkthrough is scripts/sagemaker_demo.sh; run it on free ports."""
    env = {**os.environ, "SKIP_SETUP": "1", "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "MOTO_PORT": str(free_port()), "PORT": str(free_port(also_next=True))}
    log = tmp_path / "demo.log"
    with log.open("w") as out:
        process = subprocess.Popen(["bash", str(ROOT / "scripts/sagemaker_demo.sh")], cwd=ROOT, env=env,
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = process.wait(timeout=300)
        finally:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    text = log.read_text()
    assert code == 0, text[-4000:]
    assert "--- 6." in text and "Traceback" not in text


def test_neuron_quick_start_properties_pass_validate(tmp_path):
    """docs/neuron.md's quick start, in a model directory holding Llama-3-8B's config.json."""
    from lmi_tools.validation.validate import validate_model_dir

    text = (ROOT / "docs/neuron.md").read_text(encoding="utf-8")
    quick_start = text[text.index("## Quick start"):]
    properties = quick_start[quick_start.index("```properties\n") + 14:]
    (tmp_path / "serving.properties").write_text(properties[:properties.index("```")])
    shutil.copy(ROOT / "serving_properties/model_configs/meta-llama--Meta-Llama-3-8B.json", tmp_path / "config.json")
    report = validate_model_dir(tmp_path, "inf2.xlarge")
    assert report.ok, [finding.message for finding in report.findings if finding.level == "error"]
    assert "option.rolling_batch=scheduler" in properties


@pytest.mark.skipif(shutil.which("curl") is None, reason="the script uses curl")
def test_demo_script_answers_then_prints_the_line_that_serves_the_chat_page(smollm2_dir, tmp_path):
    """The README's scripts/demo.sh on free ports; its last line, run as printed, serves the chat page at /."""
    port = free_port(also_next=True)
    env = {**os.environ, "SKIP_SETUP": "1", "VENV_BIN": str(Path(sys.executable).parent), "PYTHONPATH": str(ROOT),
           "OUT": str(tmp_path / "out"), "PORT": str(port), "OMP_NUM_THREADS": "1",
           "READY_TIMEOUT": "240"}  # the demo's own error, with the server's log, before this test's timeout
    demo = subprocess.run(["bash", str(ROOT / "scripts/demo.sh")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, start_new_session=True)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert '"generated_text":" Paris."' in demo.stdout
    command = demo.stdout.strip().splitlines()[-1]
    assert command == f"{Path(sys.executable).parent / 'lmi'} serve {tmp_path / 'out/model'} --port {port}"
    server = subprocess.Popen(command.split(), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        for _ in range(240):
            check = subprocess.run(["curl", "-s", f"http://127.0.0.1:{port}/"], capture_output=True, text=True)
            if "<html" in check.stdout.lower():
                break
            assert server.poll() is None, "the printed lmi serve line exited"
            time.sleep(0.5)
        assert "<html" in check.stdout.lower() and "chat" in check.stdout.lower()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
