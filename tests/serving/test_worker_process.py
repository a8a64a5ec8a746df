"""Our engine maps a handler's result as DJL's sync engine does (docs/djl-compat.md, the engine's calls)."""

import json
from types import SimpleNamespace

from lmi_handlers.protocol import Input, Output
from lmi_tools.serving.worker.process import invoke


def run(handle):
    inputs = Input({"handler": "handle"})
    inputs.function_name = "handle"
    return invoke(SimpleNamespace(handle=handle), inputs, Output)


def raises(exc):
    def handle(_):
        raise exc
    return handle


def test_none_is_204_and_an_output_is_kept():
    assert (run(lambda _: None).code, run(lambda _: None).message) == (204, "No content")
    answer = Output(code=201)
    assert run(lambda _: answer) is answer


def test_other_results_and_exceptions_are_424_with_v0_29_0s_message_and_memory_errors_507():
    wrong = run(lambda _: "text")
    assert wrong.code == 424 and "Invalid output type" in json.loads(bytes(wrong.content.value_at(0)))["error"]
    failed = run(raises(ValueError("bad")))
    assert (failed.code, failed.message) == (424, "prediction failure")
    assert json.loads(bytes(failed.content.value_at(0))) == {"code": 424, "message": "prediction failure",
                                                            "error": "bad"}
    assert run(raises(MemoryError("no room"))).code == 507
