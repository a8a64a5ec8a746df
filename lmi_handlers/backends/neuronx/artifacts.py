"""Compiled-artifact reuse for the neuronx backend (``option.compiled_graph_path``).

The location is a local directory (relative paths are taken from the model directory) or an
``s3://bucket/prefix`` URI. Beside the artifacts that ``model.save()`` writes we keep a manifest,
``lmi-neuronx-compile.json``: the ``CompileSettings`` they were compiled with plus the
transformers-neuronx and neuronx-cc versions. At load:

* a manifest that matches: the artifacts are loaded and nothing is compiled;
* a manifest that differs: loading stops with the list of differing settings (transformers-neuronx
  would otherwise fail later, or recompile on every worker, depending on what differs);
* no manifest and no files: the model is compiled, then saved with a manifest (a read-only
  location, such as SageMaker's ``/opt/ml/model``, only costs a warning);
* files without a manifest (e.g. DJL's ahead-of-time ``compiled/`` folder): loaded unverified;
  transformers-neuronx itself refuses them if no graph matches.

S3 goes through boto3 (present in LMI images), imported only when an s3:// location is used.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from importlib import metadata
from typing import Any

from ...errors import ConfigError
from .options import CompileSettings

logger = logging.getLogger(__name__)

MANIFEST = "lmi-neuronx-compile.json"
KEY = "compiled_graph_path"


def runtime_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for package in ("transformers-neuronx", "neuronx-cc"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    if versions["transformers-neuronx"] is None:  # e.g. a source checkout: ask the module itself
        import transformers_neuronx

        versions["transformers-neuronx"] = getattr(transformers_neuronx, "__version__", None)
    return versions


def manifest_for(settings: CompileSettings) -> dict[str, Any]:
    return {"settings": settings.manifest(), "versions": runtime_versions()}


def differences(saved: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """``name: saved -> wanted`` for every setting or version that differs."""
    out = []
    for section in ("settings", "versions"):
        old, new = saved.get(section) or {}, wanted[section]
        for name in sorted(set(old) | set(new)):
            if old.get(name) != new.get(name):
                out.append(f"{name}: {old.get(name)!r} -> {new.get(name)!r}")
    return out


class ArtifactStore:
    """A ``compiled_graph_path`` location; ``prepare`` before compiling, ``publish`` after."""

    def __init__(self, location: str, model_dir: str):
        self.location = location
        self.s3 = location.startswith("s3://")
        if self.s3:
            bucket, _, prefix = location[len("s3://"):].partition("/")
            if not bucket:
                raise ConfigError(KEY, location, "expected s3://bucket/prefix")
            self.bucket, self.prefix = bucket, prefix.strip("/")
            self.local = tempfile.mkdtemp(prefix="lmi-neuronx-artifacts-")
        else:
            self.local = location if os.path.isabs(location) else os.path.join(model_dir, location)
            if os.path.exists(self.local) and not os.path.isdir(self.local):
                raise ConfigError(KEY, location, "is a file; expected a directory or an s3:// URI")

    def prepare(self, settings: CompileSettings) -> str | None:
        """The local directory to load artifacts from, or None when they must be compiled."""
        if self.s3:
            self._download()
        wanted = manifest_for(settings)
        path = os.path.join(self.local, MANIFEST)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                saved = json.load(f)
            changed = differences(saved, wanted)
            if changed:
                raise ConfigError(KEY, self.location, "its artifacts were compiled with other settings ("
                                  + "; ".join(changed) + "). Use these settings again, point "
                                  "option.compiled_graph_path at a new location, or empty this one to recompile")
            logger.info("reusing compiled artifacts from %s", self.location)
            return self.local
        if os.path.isdir(self.local) and os.listdir(self.local):
            logger.warning("%s holds files but no %s: loading them unverified", self.location, MANIFEST)
            return self.local
        return None

    def publish(self, model: Any, settings: CompileSettings) -> None:
        """Save freshly compiled artifacts and their manifest; a failure only costs a warning."""
        try:
            os.makedirs(self.local, exist_ok=True)
            model.save(self.local)
            with open(os.path.join(self.local, MANIFEST), "w", encoding="utf-8") as f:
                json.dump(manifest_for(settings), f, indent=2, sort_keys=True)
            if self.s3:
                self._upload()
            logger.info("saved compiled artifacts to %s", self.location)
        except Exception as exc:  # noqa: BLE001 - serving goes on; only the next start recompiles
            logger.warning("could not save compiled artifacts to %s (%s: %s); the next start compiles again",
                           self.location, type(exc).__name__, exc)

    # --- s3 -------------------------------------------------------------------------------------

    def _client(self) -> Any:
        import boto3

        return boto3.client("s3")

    def _download(self) -> None:
        client = self._client()
        prefix = f"{self.prefix}/" if self.prefix else ""
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                name = item["Key"][len(prefix):]
                if name and "/" not in name:  # artifacts are flat files named by graph hash
                    client.download_file(self.bucket, item["Key"], os.path.join(self.local, name))

    def _upload(self) -> None:
        client = self._client()
        # The manifest goes last: whoever sees it may rely on the artifacts being complete.
        for name in sorted(os.listdir(self.local), key=lambda n: (n == MANIFEST, n)):
            key = f"{self.prefix}/{name}" if self.prefix else name
            client.upload_file(os.path.join(self.local, name), self.bucket, key)
