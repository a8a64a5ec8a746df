"""The front end's side of one model worker process (DJLServing's ``PyProcess``/``Connection``).

``start`` launches the worker with DJL's arguments, waits (at most 2 minutes, as Java does) for the
``Python engine started.`` line, connects to its unix socket and sends the init call (empty content,
every option as a property) under ``model_loading_timeout``. ``predict`` sends one Input and reads
the Output under ``predict_timeout``; a streamed Output is then read chunk by chunk, each within ``predict_timeout`` (or
``chunked_read_timeout`` where that is shorter). A worker that times out or dies is killed; the caller restarts it.
In async mode (``--async-mode``) the front end instead ``send``s each request as it comes and a reader ``receive``s
the answers as they come, without timeouts, as Java's ``AsyncRequestManager`` does (``async_channel.py``).

Where ``djl_python`` is installed DJL's own engine can be the worker (``engines.py`` finds it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import lmi_handlers
from lmi_handlers.protocol import Input

from . import engines
from .codec import OutputHeader, StreamBroken, encode_input, read_output_header, read_stream_chunks
from .frontend import init_input
from .process import STARTED

logger = logging.getLogger("lmi.worker")
STARTUP_TIMEOUT = 120.0
#: A line a handler prints for DJLServing's model metrics (``lmi_handlers/gauges.py``); Java's reader keeps them
#: out of the log.
METRICS = "[METRICS]"


class WorkerDied(Exception):
    """The worker process exited, hung or broke the protocol; it has been killed."""


class LoadFailed(Exception):
    """The worker could not start or the init call failed."""


@dataclass
class WorkerSettings:
    model_dir: Path
    init_properties: dict[str, str]
    entry_point: str = ""
    #: The entry point DJLServing recommends where none is given (``PyModel``; ``entry_point.py``).
    recommended_entry_point: str = ""
    #: DJL's async mode: the worker runs the async engine (``--async-mode``).
    async_mode: bool = False
    model_loading_timeout: float = 240.0
    predict_timeout: float = 120.0
    chunked_read_timeout: float = 120.0
    #: "auto": DJL's own engine where it can run (engines.py), else ours; "lmi": ours; "djl": DJL's or an error.
    engine: str = "auto"
    env: dict[str, str] = field(default_factory=dict)


def _engine_command(choice: engines.EngineChoice, settings: WorkerSettings, sock: str) -> list[str]:
    return [*choice.command, "--sock-type", "unix", "--sock-name", sock, "--model-dir", str(settings.model_dir),
            "--entry-point", settings.entry_point, "--recommended-entry-point", settings.recommended_entry_point,
            "--device-id", "-1", "--async-mode" if settings.async_mode else "--no-async-mode"]


def _environment(choice: engines.EngineChoice, settings: WorkerSettings) -> dict[str, str]:
    env = dict(os.environ)
    env.update(settings.env)
    # DJL's order: the existing PYTHONPATH, DJL's engine directory, then the model directory (so a vendored
    # lmi_handlers wins); our checkout after it, so that the runtime is importable even when not installed;
    # the djl_python stand-ins last, only where no real djl_python is installed (engines.py).
    checkout = str(Path(lmi_handlers.__file__).resolve().parents[1])
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    model = [str(settings.model_dir), checkout]
    extra = list(choice.pythonpath)
    parts += extra + model if choice.name == "djl" else model + extra
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class Worker:
    def __init__(self, name: str, settings: WorkerSettings):
        self.name = name
        self.settings = settings
        self.process: subprocess.Popen[str] | None = None
        self.sock: socket.socket | None = None
        self.reader = None
        self.output_tail: deque[str] = deque(maxlen=30)
        self._started = threading.Event()
        self._dir = tempfile.mkdtemp(prefix="lmi-worker-")

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def exit_code(self) -> int | None:
        """The code the worker process ended with; None while it runs or before it starts."""
        return self.process.poll() if self.process is not None else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None and self.sock is not None

    def start(self) -> None:
        sock_path = os.path.join(self._dir, f"djl_sock.{int(time.time() * 1000) % 100000}")
        self._started.clear()
        try:
            choice = engines.choose(self.settings.engine)
        except engines.EngineNotFound as exc:
            raise LoadFailed(str(exc)) from None
        logger.info("[%s] worker engine: %s", self.name, choice.why)
        self.process = subprocess.Popen(_engine_command(choice, self.settings, sock_path), stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, cwd=self.settings.model_dir,
                                        env=_environment(choice, self.settings), start_new_session=True)
        threading.Thread(target=self._forward_output, args=(self.process,), daemon=True).start()
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not self._started.wait(0.05):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise LoadFailed(f"worker did not start: {self._tail()}")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(sock_path)
        self.reader = self.sock.makefile("rb")
        try:
            header = self._call(init_input(self.settings.init_properties), self.settings.model_loading_timeout)
        except WorkerDied as exc:
            raise LoadFailed(f"model loading failed: {exc}") from None
        if header.code >= 300:
            body = bytes(header.content.value_at(0)).decode("utf-8", "replace") if header.content and \
                header.content.size() else header.message
            self.kill()
            raise LoadFailed(f"Failed to initialize model: {body}")
        if self.settings.async_mode:
            self.sock.settimeout(None)  # answers come whenever they are ready
        logger.info("[%s] worker %s ready", self.name, self.pid)

    def _forward_output(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            line = line.rstrip("\n")
            if METRICS in line:  # a model metric, as Java's reader takes it: /metrics has these numbers already
                logger.debug("[%s] %s", self.name, line)
                continue
            self.output_tail.append(line)
            logger.info("[%s] %s", self.name, line)
            if STARTED in line:
                self._started.set()

    def _tail(self) -> str:
        return " | ".join(list(self.output_tail)[-8:]) or "(no output)"

    def _call(self, inputs: Input, timeout: float) -> OutputHeader:
        assert self.sock is not None
        try:
            self.sock.settimeout(timeout)
            self.sock.sendall(encode_input(inputs))
            return read_output_header(self.reader)
        except socket.timeout:
            self.kill()
            raise WorkerDied(f"no answer within {timeout:g} s; the worker was killed and will be restarted") from None
        except (EOFError, OSError) as exc:
            self.kill()
            # The worker's output (paths, log text) goes to the server log, never to clients.
            logger.error("[%s] worker died (%s); last output: %s", self.name, exc, self._tail())
            raise WorkerDied(f"the worker process died ({type(exc).__name__})") from None

    def predict(self, inputs: Input) -> OutputHeader:
        if not self.alive:
            raise WorkerDied("the worker is not running")
        return self._call(inputs, self.settings.predict_timeout)

    def send(self, inputs: Input) -> None:
        """Async mode: write one request; its answers come through ``receive``."""
        if not self.alive:
            raise WorkerDied("the worker is not running")
        assert self.sock is not None
        try:
            self.sock.sendall(encode_input(inputs))
        except OSError as exc:
            raise WorkerDied(f"the worker process died ({type(exc).__name__})") from None

    def receive(self) -> OutputHeader:
        """Async mode: the next answer of any request, waiting as long as it takes (Java sets no timeout)."""
        assert self.reader is not None
        try:
            return read_output_header(self.reader)
        except (EOFError, OSError, ValueError) as exc:
            logger.error("[%s] worker died (%s); last output: %s", self.name, exc, self._tail())
            raise WorkerDied(f"the worker process died ({type(exc).__name__})") from None

    def stream(self) -> Iterator[bytes]:
        """The chunks of a streamed Output, after ``predict`` returned a header with ``is_stream``."""
        assert self.sock is not None
        # A handler that stops producing mid-stream is hung like one that never answers: predict_timeout bounds
        # every wait on it, chunked_read_timeout (DJL's gap between chunks) only where it is shorter.
        gap = min(self.settings.predict_timeout, self.settings.chunked_read_timeout)
        self.sock.settimeout(gap)
        try:
            yield from read_stream_chunks(self.reader)
        except StreamBroken:
            raise
        except socket.timeout:
            self.kill()
            raise WorkerDied(f"no chunk within {gap:g} s; the worker was killed and will be restarted") from None
        except (EOFError, OSError) as exc:
            self.kill()
            logger.error("[%s] worker died mid-stream (%s); last output: %s", self.name, exc, self._tail())
            raise WorkerDied(f"the worker process died mid-stream ({type(exc).__name__})") from None

    def _disconnect(self) -> None:
        # shutdown() rather than close() alone: the makefile() reader keeps the descriptor open,
        # and the worker only exits once it reads end-of-file.
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None

    def kill(self) -> None:
        """End the process, then close the socket. Java's ``stopPythonProcess`` disconnects and destroys the
        process at once; ending it first means DJL's engine never sees the connection close (which it logs
        as "Python engine process died" with a traceback)."""
        if self.process is not None:
            try:  # the whole group, also when the worker itself has exited: what it started may still run
                os.killpg(self.process.pid, 9)
            except (ProcessLookupError, PermissionError):
                if self.process.poll() is None:
                    self.process.kill()
            self.process.wait()
        self._disconnect()

    def stop(self) -> None:
        """End the worker for good: its processes, then the folder of its socket (a restart keeps the folder)."""
        self.kill()
        shutil.rmtree(self._dir, ignore_errors=True)
