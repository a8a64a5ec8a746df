"""The front end's side of LoRA adapters, as DJLServing's Java keeps it (``ModelInfo.adapters``, ``PyAdapter``).

Each served model keeps the adapters registered on it (``AdapterRecord``): those of the ``adapters/`` folder
beside serving.properties when ``option.enable_lora`` is on (registered once the model has loaded, and again
after a worker restart), and those of the management API. Registering, updating or unregistering one is a
handler call over the worker socket with Java's Input layout (``adapter_input``): the property ``handler``
(``register_adapter``, ``update_adapter``, ``unregister_adapter``), the properties ``name``, ``alias`` and
``src``, and the other options as content items. So the same calls reach djl_python's engine in a container.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from lmi_handlers.adapters import FOLDER
from lmi_handlers.config import parse_bool
from lmi_handlers.protocol import Input, PairList

HANDLERS = {"register": "register_adapter", "update": "update_adapter", "unregister": "unregister_adapter"}


@dataclass
class AdapterRecord:
    name: str
    src: str
    options: dict[str, str] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """DJL's description: name, src, pin, and the registration's other options."""
        return {"name": self.name, "src": self.src, "pin": self.options.get("pin", "false").lower() == "true",
                **{k: v for k, v in self.options.items() if k != "pin"}}


def adapter_input(action: str, record: AdapterRecord) -> Input:
    properties = {"handler": HANDLERS[action], "name": record.name, "alias": record.name}
    content = PairList()
    if action != "unregister":
        properties["src"] = record.src
        for key, value in record.options.items():
            content.add(key, value.encode("utf-8"))
    return Input(properties, content)


def folder_adapters(model_dir: Path, properties: Mapping[str, Any]) -> dict[str, AdapterRecord]:
    """The adapters of ``model_dir/adapters`` (one folder each, named after it) when ``option.enable_lora`` is on."""
    folder = Path(model_dir) / FOLDER
    if not parse_bool(properties, "enable_lora", False) or not folder.is_dir():
        return {}
    return {path.name: AdapterRecord(path.name, str(path.resolve()))
            for path in sorted(folder.iterdir()) if path.is_dir()}
