"""``lmi inspect``: list and check a ``model.tar.gz`` without unpacking it, and unpack one safely.

Members are read from the archive into memory; nothing is written to disk. A member with an
absolute path, a ``..`` component, a link that points outside the archive, a path through a link member, or a
device/FIFO type is a problem: ``unpack`` refuses such archives outright, before extracting anything. A
truncated or corrupt archive is a usage error, never a traceback. The checks: ``serving.properties`` at the top
and parseable by the runtime, the entry point resolvable inside the archive (``model.py`` is parsed,
never imported), the vendored ``lmi_handlers`` version, credential-looking files, stray caches.
"""

from __future__ import annotations

import ast
import posixpath
import re
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from lmi_handlers.backends.registry import BACKENDS, for_instance
from lmi_handlers.config import ConfigError

from ..errors import UsageError
from ..modeldir.properties import init_properties, parse_directives, parse_properties
from ..validation.entry_point import EntryPoint, resolve
from ..modeldir.handler_config import CONTAINER_MODEL_DIR, handler_config, ignored_options
from .credentials import reason_from_name, reason_from_stream, should_scan
from .package import sha256_of



@dataclass
class ArtifactReport:
    """What an artifact holds and what is wrong with it (``problems`` block, ``notes`` inform)."""

    path: str
    sha256: str
    compressed_bytes: int
    total_bytes: int = 0
    files: list[tuple[str, int]] = field(default_factory=list)
    runtime_version: str | None = None
    entry_point: str = ""
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {"path": self.path, "sha256": self.sha256, "compressed_bytes": self.compressed_bytes,
                "total_bytes": self.total_bytes, "files": [{"name": n, "size": s} for n, s in self.files],
                "runtime_version": self.runtime_version, "entry_point": self.entry_point,
                "problems": self.problems, "notes": self.notes, "ok": self.ok}


def normalized(name: str) -> str:
    return name[2:] if name.startswith("./") else name


def member_problem(member: tarfile.TarInfo) -> str | None:
    """Why extracting ``member`` could write outside the target folder (or is not a plain member)."""
    name = member.name
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return f"{name}: absolute path"
    if ".." in parts:
        return f"{name}: '..' in the path"
    if member.issym() or member.islnk():
        base = posixpath.dirname(normalized(name)) if member.issym() else ""
        target = posixpath.normpath(posixpath.join(base, member.linkname))
        if member.linkname.startswith("/") or target == ".." or target.startswith("../"):
            return f"{name}: link to {member.linkname} points outside the archive"
        return None
    if not (member.isfile() or member.isdir()):
        return f"{name}: device, FIFO or other special member"
    return None


def archive_problems(members: list[tarfile.TarInfo]) -> list[str]:
    """Every member's own problem, and members whose path goes through a link member: ``a -> .`` is harmless
    alone, but ``a/b -> ../x`` then lands outside, so no member may sit under a link (our artifacts have none)."""
    problems = [p for p in map(member_problem, members) if p]
    links = {normalized(m.name).rstrip("/") for m in members if m.issym() or m.islnk()}
    for member in members:
        parts = PurePosixPath(normalized(member.name)).parts
        through = next((posixpath.join(*parts[:i]) for i in range(1, len(parts))
                        if posixpath.join(*parts[:i]) in links), None)
        if through is not None:
            problems.append(f"{member.name}: its path goes through the link {through}")
    return problems


def read_members(tar: tarfile.TarFile, path: Path) -> list[tarfile.TarInfo]:
    """The members, after reading the stream to its end: a cut-off download fails here (gzip's length and CRC
    check), not halfway through an unpack."""
    try:
        members = tar.getmembers()
        while tar.fileobj.read(1 << 20):
            pass
        return members
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise UsageError(f"{path} is truncated or corrupt: {exc}") from None


def open_archive(path: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(path, "r:*")
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist") from None
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise UsageError(f"{path} is not a tar archive (or is truncated): {exc}") from None


def inspect_artifact(path: str | Path) -> ArtifactReport:
    path = Path(path)
    with open_archive(path) as tar:
        report = ArtifactReport(path=str(path), sha256=sha256_of(path), compressed_bytes=path.stat().st_size)
        members = read_members(tar, path)
        report.problems = archive_problems(members)
        files = {normalized(m.name): m for m in members if m.isfile() and not member_problem(m)}
        report.files = sorted((name, m.size) for name, m in files.items())
        report.total_bytes = sum(m.size for m in files.values())

        def read(name: str) -> str:
            handle = tar.extractfile(files[name])
            return handle.read().decode("latin-1") if handle else ""

        try:
            _check_properties(report, files, read)
            _check_runtime(report, files, read)
            _check_contents(report, tar, files)
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            raise UsageError(f"{path} is truncated or corrupt: {exc}") from None
    return report


def _check_properties(report: ArtifactReport, files: dict, read) -> None:
    if "serving.properties" not in files:
        report.problems.append("no serving.properties at the top of the archive")
        return
    text = read("serving.properties")
    props = init_properties(parse_properties(text))
    # The instance ``lmi render`` wrote down says what ``auto`` becomes there; without it, any backend auto may pick.
    family = parse_directives(text).get("instance_type", "").removeprefix("ml.").split(".")[0] or None
    entry: EntryPoint = resolve(props.get("entryPoint"), lambda n: n in files, read, runtime_vendored=True)
    report.entry_point = entry.detail
    if not entry.ok:
        report.problems.append(f"entry point: {entry.detail}" + (f" ({entry.hint})" if entry.hint else ""))
    try:
        config = handler_config(props, CONTAINER_MODEL_DIR)
        backend = config.backend if family is None else for_instance(config.backend, family).name
        unknown = ignored_options(props, backend)
    except ConfigError as exc:
        if entry.own_handle:  # the model's own handle() reads its properties; lmi_handlers' rules do not apply
            report.notes.append(f"serving.properties: {exc} for lmi_handlers; model.py's own handle() reads it")
        else:
            report.problems.append(f"serving.properties: {exc}")
        return
    report.notes.extend(f"serving.properties: {message}" for message in unknown)
    if family is not None and not BACKENDS[backend].runs_on(family):
        instance = parse_directives(text)["instance_type"]
        report.problems.append(f"serving.properties: {BACKENDS[backend].not_on(instance)}")
    batching = (f"rolling batch of {config.max_rolling_batch_size}" if config.rolling
                else f"batch size {config.batch_size}")
    report.notes.append(f"backend {backend}, TP {config.tensor_parallel_degree or 'max'}, {batching}")


def _check_runtime(report: ArtifactReport, files: dict, read) -> None:
    init = "lmi_handlers/__init__.py"
    if init not in files:
        report.notes.append("no vendored lmi_handlers (the container must provide it)")
        return
    report.runtime_version = _version_of(read(init))
    import lmi_handlers

    if report.runtime_version != lmi_handlers.__version__:
        report.notes.append(f"vendored lmi_handlers {report.runtime_version}; this lmi has {lmi_handlers.__version__}")


def _version_of(source: str) -> str | None:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in tree.body:
        names = [t.id for t in node.targets if isinstance(t, ast.Name)] if isinstance(node, ast.Assign) else []
        if "__version__" in names:
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
    return None


def _check_contents(report: ArtifactReport, tar: tarfile.TarFile, files: dict) -> None:
    for name, member in sorted(files.items()):
        parts = PurePosixPath(name).parts
        if "__pycache__" in parts or name.endswith(".pyc"):
            report.notes.append(f"{name}: compiled Python cache (harmless, but not reproducible)")
        if parts[0] in ("lmi_tools", "tests"):
            report.notes.append(f"{name}: {parts[0]} does not belong in a model artifact")
        reason = reason_from_name(name)
        if reason is None and should_scan(name):
            handle = tar.extractfile(member)
            reason = reason_from_stream(name, handle) if handle else None
        if reason:
            report.problems.append(f"{name}: looks like a credential ({reason})")


def unpack(path: str | Path, dest: str | Path) -> Path:
    """Extract an artifact into ``dest`` after checking every member; unsafe archives are refused whole."""
    path, dest = Path(path), Path(dest)
    with open_archive(path) as tar:
        members = read_members(tar, path)
        problems = archive_problems(members)
        if problems:
            raise UsageError(f"refusing to unpack {path}:\n  " + "\n  ".join(problems))
        dest.mkdir(parents=True, exist_ok=True)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, members=members, filter="data")  # the standard library's own safety net
        else:  # pragma: no cover - Python < 3.11.4
            tar.extractall(dest, members=members)
    return dest
