"""How DJLServing's Java front end builds the ``Input`` it sends to a Python handler.

Each function reproduces one layout of ``reference/djl-contract.md``; the local server and the
contract tests both use them, so what passes locally is what the container sends:

* ``init_input``: the empty init call carrying every option (``option.`` stripped) and ``handler``;
* ``request_input`` (from ``lmi_handlers/protocol.py``, which the handler in AWS's vLLM container builds its requests
  with too): HTTP headers as properties (original case), ``X-Amzn-SageMaker-Custom-Attributes`` split into ``k=v``
  properties, ``requestId``, query parameters then the body as ``data``;
* ``batch_input``: N >= 2 requests packed with ``batch_size`` and ``batch_NNN.`` prefixes (a batch
  of one is sent unwrapped);
* ``rolling_step_input``: one rolling-batch step - always the batch layout; new requests with their
  headers, body and a server seed, ongoing ones with an empty body; ``reset_rollingbatch``;
* ``entry_points``: the worker's ``--entry-point`` and ``--recommended-entry-point`` (``PyModel``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from lmi_handlers.protocol import Input, PairList, request_input  # noqa: F401 - re-exported
from lmi_handlers.rolling import CANCEL_PROPERTY, STATS_PROPERTY

from .codec import binary_decode

#: Model files for which DJL recommends its scikit-learn handler.
SKLEARN_FILES = (".skops", ".joblib", ".pkl", ".pickle", ".cloudpkl")


def entry_points(model_dir: Path, properties: Mapping[str, Any], features: str, async_mode: bool,
                 environ: Mapping[str, str]) -> tuple[str, str]:
    """The worker's entry point and recommended entry point, as ``PyModel`` resolves them: ``option.entryPoint``,
    else ``DJL_ENTRY_POINT``, else the model's ``model.py``; where no entry point is given, also the handler DJL
    recommends for the image (``SERVING_FEATURES``) and the model (the engine runs it where the entry point is
    empty or lacks the function called)."""
    given = str(properties.get("entryPoint") or environ.get("DJL_ENTRY_POINT") or "")
    if given:
        return given, ""
    entry = "model.py" if (model_dir / "model.py").is_file() else ""
    if any((model_dir / f"model{ext}").is_file() for ext in SKLEARN_FILES):
        return entry, "djl_python.sklearn_handler"
    if features == "trtllm":
        return entry, "djl_python.lmi_trtllm.trtllm_async_service"
    if features == "vllm":
        return entry, "djl_python.lmi_vllm.vllm_async_service" if async_mode else "djl_python.huggingface"
    if "model_id" in properties or (model_dir / "config.json").is_file():
        return entry, "djl_python.huggingface"
    return entry, ""


def init_input(options: Mapping[str, Any], handler: str = "handle") -> Input:
    properties = {key: str(value) for key, value in options.items()}
    properties["handler"] = handler
    return Input(properties)


def batch_prefix(index: int) -> str:
    # Zero-padded to 3 digits; Java writes indices >= 100 unpadded ("max 999 batch size").
    return f"batch_{index:03d}."


def batch_input(requests: Sequence[Input], handler: str = "handle") -> Input:
    """The layout for N >= 2 requests (a single request is sent as it is)."""
    if len(requests) == 1:
        single = requests[0]
        return Input({**single.properties, "handler": handler}, single.content)
    properties: dict[str, Any] = {"batch_size": str(len(requests)), "handler": handler}
    content = PairList()
    for i, request in enumerate(requests):
        prefix = batch_prefix(i)
        for key, value in request.properties.items():
            properties[prefix + key] = value
        for j in range(request.content.size()):
            content.add(prefix + (request.content.key_at(j) or "data"), request.content.value_at(j))
    return Input(properties, content)


@dataclass(eq=False)
class RollingRequest:
    """One request in the Java-side active list of a rolling batch."""

    input: Input
    seed: int
    key: Any = None  # the caller's handle on this request
    started: bool = False  # a response has been seen: from now on only an empty body is sent
    cancelled: bool = False


def rolling_step_input(active: Sequence[RollingRequest], reset: bool = False, handler: str = "handle") -> Input:
    properties: dict[str, Any] = {"batch_size": str(len(active)), "handler": handler}
    if reset:
        properties["reset_rollingbatch"] = "true"
    content = PairList()
    for i, request in enumerate(active):
        prefix = batch_prefix(i)
        if request.started:
            if request.cancelled:
                properties[prefix + CANCEL_PROPERTY] = "true"
            content.add(prefix + "data", b"")
            continue
        for key, value in request.input.properties.items():
            properties[prefix + key] = value
        content.add(prefix + "data", request.input.get_as_bytes() or b"")
        properties[prefix + "seed"] = str(request.seed)
    return Input(properties, content)


@dataclass
class StepItem:
    """What one rolling-batch step produced for one request."""

    request: RollingRequest
    data: str
    last: bool
    headers: dict[str, str] = field(default_factory=dict)
    code: int | None = None
    error: str | None = None

    @property
    def content_type(self) -> str | None:
        return next((v for k, v in self.headers.items() if k.lower() == "content-type"), None)


def _request_headers(properties: Mapping[str, Any]) -> dict[int, dict[str, str]]:
    """``batch_<i>_<Header>`` properties by request index (Java splits at the first ``_`` after the index)."""
    headers: dict[int, dict[str, str]] = {}
    for key, value in properties.items():
        if key.startswith("batch_"):
            index, sep, name = key[6:].partition("_")
            if sep and index.isdigit() and name:
                headers.setdefault(int(index), {})[name] = str(value)
    return headers


def engine_stats(raw: Any) -> dict[str, float | str] | None:
    """The engine's counters in ``raw`` (the JSON of our handler's ``lmi_engine_stats``): numbers, and the adapter
    lists as strings; None where it holds none (counters are a nicety: a garbled value never fails a request)."""
    if not raw:
        return None
    try:
        stats = json.loads(raw)
    except ValueError:
        return None
    return {k: v for k, v in stats.items() if isinstance(v, (int, float, str))} if isinstance(stats, dict) else None


class RollingBatchLoop:
    """The Java side of rolling batch (``RollingBatch.run``, reference §4.1-4.2) without the I/O:
    the ordered active list, the step Input, and what each returned item means for its request.

    New requests are appended; finished ones leave in place, so the handler's own list stays in step.
    A step whose answer is not 200 with exactly one item per request fails every active request and
    the next step carries ``reset_rollingbatch``. ``engine_stats`` keeps the engine's counters of the
    latest answer that had them (our handler's ``lmi_engine_stats``; other handlers send none), numbers and the
    adapter lists (strings), and ``engine_stats_at`` when (``time.time()``) they came.
    """

    def __init__(self, max_size: int = 32):
        self.max_size = max_size
        self.active: list[RollingRequest] = []
        self.reset_next = False
        self.engine_stats: dict[str, float | str] = {}
        self.engine_stats_at = 0.0

    @property
    def room(self) -> int:
        return self.max_size - len(self.active)

    def add(self, request: RollingRequest) -> None:
        self.active.append(request)

    def next_input(self, handler: str = "handle") -> Input:
        inputs = rolling_step_input(self.active, reset=self.reset_next, handler=handler)
        self.reset_next = False
        return inputs

    def step(self, handler: Any) -> list[StepItem]:
        """One step against an in-process handler (tests and benchmarks; the server goes over the socket)."""
        out = handler.handle(self.next_input())
        return self.apply(out.code, out.properties, [out.content.value_at(i) for i in range(out.content.size())])

    def run(self, handler: Any, joins: Iterable[tuple[int, RollingRequest]]) -> dict[Any, str]:
        """Steps ``handler`` until every request has finished. ``joins`` are (step, request) in step order: a
        request joins at the start of its step, or later when the batch is full. Returns each request's whole
        body by key; a failed request raises (for tests and benchmarks that expect none)."""
        pending, bodies, step = list(joins), {}, 0
        while pending or self.active:
            while pending and self.room and pending[0][0] <= step:
                self.add(pending.pop(0)[1])
            step += 1
            for item in self.step(handler) if self.active else ():
                if item.code is not None:
                    raise RuntimeError(f"request {item.request.key!r} failed: {item.code} {item.error}")
                bodies[item.request.key] = bodies.get(item.request.key, "") + item.data
        return bodies

    def apply(self, code: int, properties: Mapping[str, Any], items: Sequence[bytes]) -> list[StepItem]:
        self._read_stats(properties.get(STATS_PROPERTY))
        if code != 200 or len(items) != len(self.active):
            return self.fail_all(code if code != 200 else 500, "Batch inference failed")
        results, survivors = [], []
        headers = _request_headers(properties)
        for i, (request, raw) in enumerate(zip(self.active, items)):
            item = binary_decode(bytes(raw))
            request.started = True
            last = item.get("last", "").lower() == "true"
            code_text = item.get("code")
            results.append(StepItem(request, item.get("data", ""), last, headers.get(i, {}),
                                    int(code_text) if code_text else None, item.get("error")))
            if not last:
                survivors.append(request)
        self.active = survivors
        return results

    def _read_stats(self, raw: Any) -> None:
        stats = engine_stats(raw)
        if stats is not None:
            self.engine_stats, self.engine_stats_at = stats, time.time()

    def fail_all(self, code: int, error: str) -> list[StepItem]:
        """Every active request ends with this error; the next step resets the handler."""
        results = [StepItem(r, "", True, {"Content-Type": "application/json"}, code, error) for r in self.active]
        self.active = []
        self.reset_next = True
        return results
