"""``lmi inspect``: list and check a ``model.tar.gz`` without unpacking it, and unpack one safely.

Members are read from the archive into memory; nothing is written to disk. A member with an
absolute path, a ``..`` component, a link that points outside the archive, a path through a link member, or a
device/FIFO type is a problem, and so is a name held twice: ``unpack`` refuses such archives outright, before
extracting anything. A truncated or corrupt archive, one whose members declare more than ``MAX_EXPANSION``
times its size (a compression bomb), and one of more than ``MAX_MEMBERS`` members are usage errors, never a traceback
or minutes of expanding. The checks:
``serving.properties`` at the top and parseable by the runtime, the entry point resolvable inside the archive
(``model.py`` is parsed, never imported), the vendored ``lmi_handlers`` version, credential-looking files, stray
caches.
"""

from __future__ import annotations

import ast
import posixpath
import re
import tarfile
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from lmi_handlers.backends.registry import BACKENDS, for_instance
from lmi_handlers.config import ConfigError

from ..errors import UsageError
from ..modeldir.properties import init_properties, parse_directives, parse_properties
from ..validation.entry_point import EntryPoint, resolve
from ..modeldir.handler_config import CONTAINER_MODEL_DIR, ignored_options, settings
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
    """Every member's own problem, names held more than once (which copy an unpacker keeps is undefined), and
    members whose path goes through a link member: ``a -> .`` is harmless alone, but ``a/b -> ../x`` then lands
    outside, so no member may sit under a link (our artifacts have none)."""
    problems = [p for p in map(member_problem, members) if p]
    copies = Counter(normalized(m.name).rstrip("/") for m in members if not m.isdir())
    problems += [f"{name}: {count} copies in the archive; which one is used is undefined, so keep one"
                 for name, count in sorted(copies.items()) if count > 1]
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
    check), not halfway through an unpack. Each member's size is checked as its header is read, before its
    data is expanded, so a compression bomb is refused at once."""
    packed = path.stat().st_size
    limit = max(SMALL_ARCHIVE_BYTES, MAX_EXPANSION * packed)
    members, declared = [], 0
    try:
        while (member := tar.next()) is not None:
            if len(members) == MAX_MEMBERS:
                raise UsageError(f"{path} holds more than {MAX_MEMBERS:,} members: refusing it before reading the "
                                 "rest (a model artifact holds hundreds at most)",
                                 hint="list it with tar -tzf | head; ship a model directory's files, not a tree of "
                                      "many small ones")
            declared += tarfile.BLOCKSIZE + member.size
            if declared > limit:
                raise UsageError(f"{path} declares at least {declared:,} bytes unpacked from {packed:,} packed, more "
                                 f"than {MAX_EXPANSION} times its size: refusing it as a compression bomb "
                                 f"({member.name} alone is {member.size:,} bytes)",
                                 hint="model artifacts compress a few times at most; if this one is genuine, list it "
                                      "with tar -tvzf and unpack it with care")
            members.append(member)
        while tar.fileobj.read(1 << 20):
            pass
        return members
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise UsageError(f"{path} is truncated or corrupt: {exc}") from None


#: An archive whose members declare more than this many times its own size is refused before they are expanded:
#: weights and text compress a few times at most, a compression bomb about a thousand times.
MAX_EXPANSION = 100
#: Below this many bytes unpacked any ratio passes (small archives of text and zero padding compress well).
SMALL_ARCHIVE_BYTES = 64 * 1024**2
#: Members an archive may hold: each costs memory and a check before anything is unpacked, so an archive of many
#: empty members (which no size bound catches) is refused after this many headers.
MAX_MEMBERS = 20_000
#: The compressions tarfile reads, by their first bytes.
COMPRESSIONS = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz"}


def open_archive(path: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(path, "r:*")
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist") from None
    except (tarfile.TarError, OSError, EOFError, zlib.error):
        raise UsageError(_not_an_archive(path), hint="lmi package writes a model.tar.gz") from None


def _not_an_archive(path: Path) -> str:
    """Why tarfile could not open ``path``, in one sentence: tarfile's own message lists one failure per method."""
    if path.is_dir():
        return f"{path} is a directory, not a tar archive"
    with path.open("rb") as stream:
        head = stream.read(8)
    compression = next((name for magic, name in COMPRESSIONS.items() if head.startswith(magic)), None)
    if compression:
        return f"{path} is {compression}-compressed but not a tar archive, or is truncated"
    return f"{path} is not a tar archive (plain, gzip, bzip2 or xz): {path.stat().st_size:,} bytes of something else"


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
        read = settings(props, CONTAINER_MODEL_DIR)
        config = read.config
        backend = read.requested if family is None else for_instance(read.requested, family).name
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
            reason = reason_from_stream(name, handle, member.size) if handle else None
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
