"""``lmi package``: a model directory plus the vendored runtime, as a reproducible ``model.tar.gz``.

The artifact holds every file of the model directory (caches and VCS folders left out) and the
``lmi_handlers`` package beside ``model.py``, so the container runs exactly the code that was
tested. The bytes depend only on the file names and contents: entries sorted, fixed mtime
(``SOURCE_DATE_EPOCH`` or 1980-01-01), uid/gid 0 with no owner names, normalized modes and a
gzip header without name or time. The same files always give the same sha256.

Links that leave the directory and files that look like credentials (``credentials.py``) are
refused, all of them listed in one error. ``write_tree`` lays the same files out as plain files for
an uncompressed S3 upload (SageMaker ``CompressionType: None``): no links, no empty folders.
"""

from __future__ import annotations

import collections
import gzip
import hashlib
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable

from ..errors import ToolError, UsageError
from ..modeldir.properties import parse_properties, read_text
from .credentials import credential_reason

RUNTIME_PACKAGE = "lmi_handlers"
EXCLUDED_DIRS = {"__pycache__", ".git", ".hg", ".svn", ".ipynb_checkpoints", ".pytest_cache", ".mypy_cache",
                 ".ruff_cache"}
EXCLUDED_FILES = {".DS_Store", "Thumbs.db"}
EXCLUDED_SUFFIXES = {".pyc", ".pyo"}
#: Files above this size that take less than half of it on disk are reported as sparse.
SPARSE_MIN_BYTES = 64 * 1024**2
# 1980-01-01T00:00:00Z: zip's epoch, a date every archive tool accepts.
DEFAULT_MTIME = 315532800


#: Told ``(bytes just written, total bytes to write)`` as the artifact is written; once with 0 before the start.
Progress = Callable[[int, int], None]


class PackagingError(ToolError):
    """The model directory cannot be packaged as it is."""


@dataclass(frozen=True)
class Entry:
    """One file of the artifact: its POSIX path inside, and where its bytes come from."""

    name: str
    source: Path

    @property
    def mode(self) -> int:
        return 0o755 if self.source.stat().st_mode & 0o111 else 0o644


def fixed_mtime() -> int:
    value = os.environ.get("SOURCE_DATE_EPOCH", "")
    if not value:
        return DEFAULT_MTIME
    if not value.isdigit():
        raise UsageError(f"SOURCE_DATE_EPOCH={value!r} is not a number of seconds")
    return int(value)


def _inside(root: Path, path: Path) -> bool:
    return path == root or root in path.parents


def model_entries(model_dir: Path, skip: tuple[Path, ...] = ()) -> tuple[list[Entry], list[str]]:
    """The files to ship, and the problems (escaping or broken links, special files) found on the way."""
    root = model_dir.resolve()
    entries: list[Entry] = []
    problems: list[str] = []
    links: dict[tuple[int, int], set[Path]] = collections.defaultdict(set)
    skipped = {p.resolve() for p in skip}

    def walk(directory: Path, prefix: str, chain: frozenset[Path]) -> None:
        for child in sorted(directory.iterdir(), key=lambda p: p.name):
            rel = prefix + child.name
            if child.name in EXCLUDED_FILES or child.suffix in EXCLUDED_SUFFIXES:
                continue
            if not prefix and child.name == RUNTIME_PACKAGE:
                continue  # replaced by the vendored runtime
            try:
                target = child.resolve()
            except (RuntimeError, OSError):  # Python < 3.13 raises RuntimeError for a loop
                problems.append(f"{rel}: symbolic link loop ({os.readlink(child)})")
                continue
            if target in skipped:
                continue
            if child.is_symlink():
                if not target.exists():
                    problems.append(f"{rel}: broken symbolic link to {os.readlink(child)}")
                    continue
                if not _inside(root, target):
                    problems.append(f"{rel}: symbolic link to {os.readlink(child)} points outside the model directory")
                    continue
            if target.is_dir():
                if child.name in EXCLUDED_DIRS:
                    continue
                if target in chain:
                    problems.append(f"{rel}: symbolic link loops back to {target}")
                    continue
                walk(target, rel + "/", chain | {target})
            elif target.is_file():
                entries.append(Entry(rel, target))
                info = target.stat()
                links[(info.st_dev, info.st_ino)].add(target)
            else:
                problems.append(f"{rel}: not a regular file (device, socket or pipe)")

    walk(root, "", frozenset({root}))
    for paths in links.values():
        # A hard link is the same file under two names: if some of its names are not in the directory, the
        # directory ships a file that lives elsewhere (as a symbolic link outside it would).
        first = min(paths)
        outside = first.stat().st_nlink - len(paths)
        if outside > 0:
            problems.append(f"{first.relative_to(root)}: hard link to a file with {outside} other name(s) outside "
                            "the model directory (copy it in if it is meant to ship)")
    return entries, problems


def runtime_entries() -> list[Entry]:
    """``lmi_handlers``' Python files, from wherever it is imported (checkout or installed wheel)."""
    import lmi_handlers

    package = Path(lmi_handlers.__file__).resolve().parent
    files = [p for p in package.rglob("*.py") if "__pycache__" not in p.parts]
    return [Entry(f"{RUNTIME_PACKAGE}/{p.relative_to(package).as_posix()}", p) for p in sorted(files)]


def credential_problems(entries: list[Entry]) -> list[str]:
    problems = []
    for entry in entries:
        reason = credential_reason(entry.name, entry.source)
        if reason:
            problems.append(f"{entry.name}: looks like a credential ({reason})")
    return problems


def collect(model_dir: Path, skip: tuple[Path, ...] = ()) -> list[Entry]:
    """Model files plus the runtime, sorted; every problem is reported in one ``PackagingError``."""
    if not (model_dir / "serving.properties").is_file():
        raise UsageError(f"{model_dir} has no serving.properties", hint="lmi new / lmi render write one")
    entries, problems = model_entries(model_dir, skip)
    problems += credential_problems(entries)
    if problems:
        listing = "\n  ".join(problems)
        raise PackagingError(f"refusing to package {model_dir}:\n  {listing}",
                             hint="remove these files (or the links) from the model directory; keep credentials "
                                  "in the environment or an IAM role, never in the artifact")
    return sorted(entries + runtime_entries(), key=lambda e: e.name)


def write_tarball(entries: list[Entry], output: Path, mtime: int | None = None,
                  progress: Progress | None = None) -> str:
    """Write ``entries`` as a reproducible ``.tar.gz``; returns its sha256."""
    mtime = fixed_mtime() if mtime is None else mtime
    report = _reporter(entries, progress)
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=output.parent, prefix=f".{output.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=mtime,
                                                       compresslevel=6) as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for entry in sorted(entries, key=lambda e: e.name):
                    _add(tar, entry, mtime, report)
        os.replace(tmp, output)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return sha256_of(output)


def _reporter(entries: list[Entry], progress: Progress | None) -> Callable[[int], None]:
    if progress is None:
        return lambda n: None
    total = sum(entry.source.stat().st_size for entry in entries)
    progress(0, total)
    return lambda n: progress(n, total)


class _Reading:
    """A file whose reads are reported (tarfile copies it in blocks)."""

    def __init__(self, handle: BinaryIO, report: Callable[[int], None]):
        self.handle, self.report = handle, report

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size)
        self.report(len(data))
        return data


def _add(tar: tarfile.TarFile, entry: Entry, mtime: int, report: Callable[[int], None]) -> None:
    info = tarfile.TarInfo(entry.name)
    info.size = entry.source.stat().st_size
    info.mtime, info.mode, info.type = mtime, entry.mode, tarfile.REGTYPE
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    with entry.source.open("rb") as handle:
        tar.addfile(info, _Reading(handle, report))


def write_tree(entries: list[Entry], out_dir: Path, progress: Progress | None = None) -> None:
    """The same files as plain files under ``out_dir`` (which must be new or empty)."""
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UsageError(f"{out_dir} is not empty", hint="give a new or empty folder for the uncompressed layout")
    report = _reporter(entries, progress)
    for entry in entries:
        target = out_dir / entry.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(entry.source, target)
        target.chmod(entry.mode)
        report(entry.source.stat().st_size)


@dataclass
class Artifact:
    """What ``build`` wrote."""

    files: list[Entry]
    total_bytes: int
    tarball: Path | None = None
    sha256: str | None = None
    tree: Path | None = None
    #: The model directory had its own lmi_handlers/, replaced by the vendored copy.
    replaced_runtime: bool = False
    warnings: list[str] = field(default_factory=list)


def build(model_dir: Path, output: Path | None, tree: Path | None, validate: bool = True,
          instance: str | None = None, config: Path | None = None, progress: Progress | None = None,
          container: str = "lmi") -> Artifact:
    """Validate (unless told not to), collect, then write the tarball and/or the uncompressed tree; for ``container``
    ``vllm`` (AWS's vLLM container), validated for it and with a ``model.py`` that serves it."""
    if output is None and tree is None:
        raise UsageError("nothing to write", hint="pass -o model.tar.gz and/or --uncompressed DIR")
    warnings: list[str] = []
    if validate:
        warnings = _validated(model_dir, instance, config, container)
    entries = collect(model_dir, skip=tuple(p for p in (output, tree) if p is not None))
    if container == "vllm":
        entries, replaced = _with_container_script(model_dir, entries)
        warnings += replaced
    warnings += shipping_warnings(model_dir, entries)
    artifact = Artifact(files=entries, total_bytes=sum(e.source.stat().st_size for e in entries),
                        replaced_runtime=(model_dir / RUNTIME_PACKAGE).is_dir(), warnings=warnings)
    if output is not None:
        artifact.tarball, artifact.sha256 = output, write_tarball(entries, output, progress=progress)
    if tree is not None:
        write_tree(entries, tree, progress)
        artifact.tree = tree
    return artifact


def shipping_warnings(model_dir: Path, entries: list[Entry]) -> list[str]:
    """What ships but may surprise: sparse files (small on disk, full size in the artifact) and weights that
    ``option.model_id`` names outside the directory (left behind)."""
    warnings = []
    for entry in entries:
        info = entry.source.stat()
        if info.st_size > SPARSE_MIN_BYTES and info.st_blocks * 512 < info.st_size // 2:
            warnings.append(f"{entry.name}: sparse file: {info.st_blocks * 512:,} bytes on disk but {info.st_size:,} "
                            "in the artifact")
    model_id = parse_properties(read_text(model_dir / "serving.properties")).get("option.model_id", "").strip()
    if model_id.startswith(("/", "./", "../", "~")):
        target = (model_dir / Path(model_id).expanduser()).resolve()
        if not _inside(model_dir.resolve(), target):
            warnings.append(f"option.model_id={model_id} is outside the model directory: its weights are not in "
                            f"the artifact, and the container sees only the artifact (at /opt/ml/model)")
    return warnings


def _with_container_script(model_dir: Path, entries: list[Entry]) -> tuple[list[Entry], list[str]]:
    """``entries`` with the ``model.py`` that serves both containers where the directory's serves DJLServing alone
    (or is missing), and the note saying so."""
    from ..containers.vllm.checks import container_script

    script = container_script(model_dir)
    if script is None:
        return entries, []
    kept = [entry for entry in entries if entry.name != "model.py"]
    note = (f"model.py: the artifact has lmi render's model.py, which serves DJLServing and AWS's vLLM container "
            f"(the directory's {'serves DJLServing alone' if (model_dir / 'model.py').is_file() else 'is missing'})")
    return sorted(kept + [Entry("model.py", script)], key=lambda e: e.name), [note]


def _validated(model_dir: Path, instance: str | None, config: Path | None, container: str = "lmi") -> list[str]:
    from ..errors import ValidationFailed
    from ..validation.validate import validate_model_dir

    if container == "vllm":
        from ..containers.vllm.checks import validate_container

        report = validate_container(model_dir, instance, config)
    else:
        report = validate_model_dir(model_dir, instance, config)
    if not report.ok:
        listing = "\n  ".join(f"{f.check}: {f.message}" + (f" ({f.hint})" if f.hint else "") for f in report.errors)
        raise ValidationFailed(f"{model_dir} does not validate:\n  {listing}",
                               hint="fix these (lmi validate shows the details), or pass --no-validate")
    return [f"{f.check}: {f.message}" for f in report.warnings]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
