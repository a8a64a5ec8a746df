"""A model worker process: our stand-in for DJLServing's ``djl_python_engine.py``.

Started by the front end with the same arguments DJL passes (``--sock-type unix --sock-name PATH
--model-dir DIR --entry-point EP --recommended-entry-point EP --device-id N --async-mode|--no-async-mode``), it
imports the entry point the way DJL does, binds the socket, prints ``Python engine started.`` and then serves one
connection. In sync mode (DJL's ``PythonSyncEngine``): read an ``Input``, call the handler, write the ``Output``
(streamed chunk by chunk when the handler streams). Results map as in DJL's sync engine: ``None`` -> 204, an
exception -> 424 with its text, an out-of-memory error -> 507, anything that is not an ``Output`` -> 424 "Invalid
output type". In async mode (``PythonAsyncEngine``, ``async_engine.py``): every Input is awaited on an event loop as
it arrives, and the answers go out as they come, tagged with their ``request_tracking_id``.

It imports only the standard library, ``lmi_handlers`` and the wire codec (no web framework: it starts fast).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import socket
import sys
from types import ModuleType
from typing import Any

from lmi_handlers.errors import is_out_of_memory
from lmi_handlers.protocol import Output

from .codec import iter_output_frames, read_input

STARTED = "Python engine started."
DEFAULT_ENTRY_POINT = "lmi_handlers.entrypoint"


def load_entry_point(model_dir: str, entry_point: str, recommended: str = "") -> ModuleType:
    """Resolve ``option.entryPoint`` as DJL does: a file in the model dir, an absolute file, a dotted
    module, else the recommended one; with neither, ``model.py`` if present, else our handler (where DJL would
    recommend a built-in)."""
    entry_point = entry_point or ("" if recommended.startswith("djl_python") else recommended)
    if not entry_point:
        entry_point = "model.py" if os.path.isfile(os.path.join(model_dir, "model.py")) else DEFAULT_ENTRY_POINT
    if entry_point.endswith(".py"):
        path = entry_point if os.path.isabs(entry_point) else os.path.join(model_dir, entry_point)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"entry point {entry_point} not found in {model_dir}")
        if not os.path.isabs(entry_point):
            return importlib.import_module(entry_point[:-3])  # the model dir is on sys.path
        spec = importlib.util.spec_from_file_location("model", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["model"] = module
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(entry_point)


def invoke(module: ModuleType, inputs: Any, output_class: type) -> Any:
    function = getattr(module, inputs.get_function_name() or "handle", None)
    if function is None:
        return output_class().error(f"entry point has no function {inputs.get_function_name() or 'handle'}")
    try:
        result = function(inputs)
    except Exception as exc:  # noqa: BLE001 - mapped to status codes like DJL's engine
        logging.exception("handler raised")
        if is_out_of_memory(exc):
            return output_class(code=507, message=str(exc))
        return output_class().error(str(exc))
    if result is None:
        return output_class(code=204, message="No content")
    if not hasattr(result, "content") or not hasattr(result, "code"):
        return output_class().error(f"Invalid output type: {type(result).__name__}")
    return result


def serve(args: argparse.Namespace) -> None:
    os.chdir(args.model_dir)
    sys.path.insert(0, args.model_dir)
    module = load_entry_point(args.model_dir, args.entry_point, args.recommended_entry_point or "")
    if os.path.exists(args.sock_name):
        os.unlink(args.sock_name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(args.sock_name)
    listener.listen(1)
    print(STARTED, flush=True)
    connection, _ = listener.accept()
    reader = connection.makefile("rb")
    if args.async_mode:
        from .async_engine import serve_async

        serve_async(module, connection, reader, args)
        return
    while True:
        try:
            inputs = read_input(reader)
        except EOFError:
            return  # the front end closed the connection: shut down
        inputs.properties["model_dir"] = args.model_dir
        inputs.properties["device_id"] = str(args.device_id)
        output = invoke(module, inputs, Output)
        for frame in iter_output_frames(output):
            connection.sendall(frame)
        if hasattr(output, "execute_finalize"):
            output.execute_finalize()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sock-type", choices=["unix"], default="unix")
    parser.add_argument("--sock-name", required=True)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--entry-point", default="")
    parser.add_argument("--recommended-entry-point", default="")
    parser.add_argument("--device-id", type=int, default=-1)
    parser.add_argument("--async-mode", action=argparse.BooleanOptionalAction, default=False)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    serve(args)


if __name__ == "__main__":
    main()
