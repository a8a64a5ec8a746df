"""lmi inspect: checks an artifact from the archive alone; unsafe members are rejected, never extracted."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import zipfile
from pathlib import Path

import pytest

import lmi_handlers
from lmi_tools.packaging.artifact import inspect_artifact, member_problem, unpack
from lmi_tools.errors import UsageError
from lmi_tools.packaging.package import build

SHIM = "from lmi_handlers.entrypoint import handle  # noqa: F401\n"
PROPERTIES = ("# lmi: instance_type=g5.xlarge\nengine=Python\noption.entryPoint=model.py\noption.backend=scripted\n"
              "option.rolling_batch=disable\n")


@pytest.fixture
def artifact(tmp_path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "serving.properties").write_text(PROPERTIES)
    (model / "model.py").write_text(SHIM)
    (model / "weights").mkdir()
    (model / "weights" / "config.json").write_text("{}")
    build(model, tmp_path / "model.tar.gz", None)
    return tmp_path / "model.tar.gz"


def make_tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def regular(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def test_our_artifact_passes(artifact):
    report = inspect_artifact(artifact)
    assert report.ok, report.problems
    names = [name for name, _ in report.files]
    assert names == sorted(names)
    assert {"serving.properties", "model.py", "weights/config.json", "lmi_handlers/__init__.py",
            "lmi_handlers/entrypoint.py"} <= set(names)
    assert report.runtime_version == lmi_handlers.__version__
    assert report.entry_point == "model.py -> lmi_handlers.entrypoint (inside the model)"
    assert report.total_bytes == sum(size for _, size in report.files)
    assert len(report.sha256) == 64 and report.compressed_bytes == artifact.stat().st_size


def test_inspect_writes_nothing(artifact, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    inspect_artifact(artifact)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("member, problem", [
    (regular("/etc/cron.d/evil", b"x"), "absolute path"),
    (regular("../evil.py", b"x"), "'..' in the path"),
    (regular("lmi_handlers/../../evil.py", b"x"), "'..' in the path"),
    (link("escape", "/etc/passwd"), "points outside the archive"),
    (link("sub/escape", "../../outside"), "points outside the archive"),
    (link("hard", "../outside", tarfile.LNKTYPE), "points outside the archive"),
    (link("dev", "", tarfile.CHRTYPE), "device, FIFO or other special member"),
])
def test_unsafe_members_are_problems_and_never_unpacked(tmp_path, member, problem):
    archive = make_tar(tmp_path / "evil.tar.gz", [regular("serving.properties", PROPERTIES.encode()),
                                                  regular("model.py", SHIM.encode()), member])
    report = inspect_artifact(archive)
    assert any(problem in p for p in report.problems)
    with pytest.raises(UsageError, match="refusing to unpack"):
        unpack(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "evil.py").exists()


def test_links_inside_the_archive_are_allowed():
    info = tarfile.TarInfo("weights/alias.json")
    info.type, info.linkname = tarfile.SYMTYPE, "config.json"
    assert member_problem(info) is None


def test_missing_pieces_are_reported(tmp_path):
    archive = make_tar(tmp_path / "a.tar.gz", [regular("model.py", b"import os\n")])
    report = inspect_artifact(archive)
    assert "no serving.properties at the top of the archive" in report.problems
    archive = make_tar(tmp_path / "b.tar.gz", [regular("serving.properties", PROPERTIES.encode()),
                                               regular("model.py", SHIM.encode())])
    report = inspect_artifact(archive)
    assert any("lmi_handlers.entrypoint is not part of the model" in p for p in report.problems)
    assert "no vendored lmi_handlers (the container must provide it)" in report.notes


def test_bad_properties_and_credentials_inside(tmp_path):
    bad = PROPERTIES + "option.rolling_batch=lmi-dist\n"
    key_id = "AKIA" + "IOSFODNN7EXAMPLE"
    archive = make_tar(tmp_path / "a.tar", [regular("./serving.properties", bad.encode()),
                                            regular("./model.py", SHIM.encode()),
                                            regular("./notes.txt", f"id {key_id}\n".encode()),
                                            regular("./lmi_tools/cli.py", b"")], mode="w")
    report = inspect_artifact(archive)
    assert any(p.startswith("serving.properties: option.rolling_batch") for p in report.problems)
    assert any("notes.txt: looks like a credential" in p for p in report.problems)
    assert any("lmi_tools does not belong" in n for n in report.notes)


def test_version_mismatch_is_a_note(tmp_path):
    archive = make_tar(tmp_path / "a.tar.gz", [regular("serving.properties", PROPERTIES.encode()),
                                               regular("model.py", SHIM.encode()),
                                               regular("lmi_handlers/__init__.py", b'__version__ = "0.0.1"\n'),
                                               regular("lmi_handlers/entrypoint.py", b"def handle(x): pass\n")])
    report = inspect_artifact(archive)
    assert report.ok and report.runtime_version == "0.0.1"
    assert any("vendored lmi_handlers 0.0.1" in n for n in report.notes)


def test_not_an_archive(tmp_path):
    (tmp_path / "x.tar.gz").write_bytes(b"not a tarball")
    with pytest.raises(UsageError, match="not a tar archive"):
        inspect_artifact(tmp_path / "x.tar.gz")
    with pytest.raises(UsageError, match="does not exist"):
        inspect_artifact(tmp_path / "missing.tar.gz")


def test_unpack_round_trip(artifact, tmp_path):
    out = unpack(artifact, tmp_path / "unpacked")
    model = tmp_path / "model"
    for name in ("serving.properties", "model.py", "weights/config.json"):
        assert (out / name).read_bytes() == (model / name).read_bytes()
    assert (out / "lmi_handlers" / "entrypoint.py").read_bytes() == \
        (Path(lmi_handlers.__file__).parent / "entrypoint.py").read_bytes()


def test_a_two_step_link_escape_is_refused_before_anything_is_written(tmp_path):
    """Issue 12 #10: ``a -> .`` is harmless alone, but ``a/b -> ../etc/passwd`` then leaves the folder."""
    archive = make_tar(tmp_path / "x.tar.gz", [regular("serving.properties", PROPERTIES.encode()), link("a", "."),
                                               link("a/b", "../etc/passwd"), regular("a/c.txt", b"x")])
    report = inspect_artifact(archive)
    assert any("a/b: its path goes through the link a" in p for p in report.problems), report.problems
    dest = tmp_path / "out"
    with pytest.raises(UsageError, match="goes through the link a"):
        unpack(archive, dest)
    assert not dest.exists()


def test_a_truncated_archive_is_a_usage_error(artifact, tmp_path):
    """Issue 12 #9: no traceback for a cut-off download."""
    data = artifact.read_bytes()
    for cut in (len(data) // 2, len(data) - 9, 30):
        truncated = tmp_path / f"cut{cut}.tar.gz"
        truncated.write_bytes(data[:cut])
        with pytest.raises(UsageError, match="truncated or corrupt|not a tar archive"):
            inspect_artifact(truncated)
        with pytest.raises(UsageError, match="truncated or corrupt|not a tar archive"):
            unpack(truncated, tmp_path / f"out{cut}")


def test_a_compression_bomb_is_refused_from_its_header_before_it_is_expanded(tmp_path):
    """A member declaring 2 GB inside a 1 KB gzip: refused on reading its header (the data is not even there)."""
    header = tarfile.TarInfo("zeros.bin")
    header.size = 2 * 1024**3
    archive = tmp_path / "bomb.tar.gz"
    archive.write_bytes(gzip.compress(header.tobuf(format=tarfile.GNU_FORMAT) + bytes(1 << 20)))
    for check in (inspect_artifact, lambda path: unpack(path, tmp_path / "out")):
        with pytest.raises(UsageError, match="compression bomb") as info:
            check(archive)
        assert "zeros.bin alone is 2,147,483,648 bytes" in str(info.value)
    assert not (tmp_path / "out").exists()


def test_a_small_bomb_is_refused_and_a_compressible_artifact_is_not(tmp_path, monkeypatch):
    from lmi_tools.packaging import artifact as module

    monkeypatch.setattr(module, "SMALL_ARCHIVE_BYTES", 1 << 20)
    files = [regular("serving.properties", PROPERTIES.encode()), regular("model.py", SHIM.encode())]
    bomb = make_tar(tmp_path / "bomb.tar.gz", [*files, regular("pad.bin", bytes(16 << 20))])
    with pytest.raises(UsageError, match="more than 100 times its size: refusing it as a compression bomb"):
        inspect_artifact(bomb)
    text = make_tar(tmp_path / "text.tar.gz", [*files, regular("notes.txt", os.urandom(1 << 20).hex().encode())])
    assert ("notes.txt", 2 << 20) in inspect_artifact(text).files  # 2 MB of text that compresses about 2 times


def test_an_archive_of_very_many_empty_members_is_refused_after_the_limit(tmp_path):
    """No size bound catches empty members: the count does, after MAX_MEMBERS headers, in memory and time
    bounded by the limit, not by the archive."""
    from lmi_tools.packaging.artifact import MAX_MEMBERS

    archive = tmp_path / "many.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        tar.addfile(regular("serving.properties", PROPERTIES.encode())[0], io.BytesIO(PROPERTIES.encode()))
        empty = tarfile.TarInfo("x")
        for i in range(MAX_MEMBERS):
            empty.name = f"d/{i}"
            tar.addfile(empty)
    for check in (inspect_artifact, lambda path: unpack(path, tmp_path / "out")):
        with pytest.raises(UsageError, match=f"holds more than {MAX_MEMBERS:,} members"):
            check(archive)
    assert not (tmp_path / "out").exists()


def test_a_file_held_twice_is_a_problem_and_unpack_refuses_it(tmp_path):
    archive = make_tar(tmp_path / "twice.tar.gz", [regular("serving.properties", PROPERTIES.encode()),
                                                   regular("model.py", SHIM.encode()),
                                                   regular("./serving.properties", b"engine=Python\n")])
    report = inspect_artifact(archive)
    assert "serving.properties: 2 copies in the archive; which one is used is undefined, so keep one" in report.problems
    with pytest.raises(UsageError, match="serving.properties: 2 copies"):
        unpack(archive, tmp_path / "out")


def test_credentials_inside_compressed_members_are_found(tmp_path):
    token = "ghp_" + "A1b2" * 9
    archive = make_tar(tmp_path / "a.tar.gz", [regular("serving.properties", PROPERTIES.encode()),
                                               regular("model.py", SHIM.encode()),
                                               regular("notes.txt.gz", gzip.compress(f"token {token}\n".encode()))])
    assert any(p.startswith("notes.txt.gz: looks like a credential (it contains what detect-secrets' "
                            "GitHubTokenDetector takes for a secret (GitHub Token))")
               for p in inspect_artifact(archive).problems)
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w", zipfile.ZIP_DEFLATED) as inner:
        inner.writestr("readme.md", "x" * 1000)
        inner.writestr("db.yaml", "password: hunter22\n")
    archive = make_tar(tmp_path / "b.tar.gz", [regular("serving.properties", PROPERTIES.encode()),
                                               regular("model.py", SHIM.encode()),
                                               regular("docs.zip", zipped.getvalue())])
    assert "docs.zip: looks like a credential (its member db.yaml: it contains what detect-secrets' KeywordDetector " \
           "takes for a secret (Secret Keyword))" in inspect_artifact(archive).problems


@pytest.mark.parametrize("instance, backend, problem", [
    ("g5.xlarge", "neuronx", "serving.properties: backend neuronx runs on inf2, trn1, trn1n, trn2 instances; "
                             "g5.xlarge is not one"),
    ("inf2.xlarge", "auto", None),  # auto is what the registry picks there: neuronx
])
def test_the_backend_is_asked_of_the_registry_for_the_instance(tmp_path, instance, backend, problem):
    properties = PROPERTIES.replace("g5.xlarge", instance).replace("backend=scripted", f"backend={backend}")
    archive = make_tar(tmp_path / "a.tar.gz", [regular("serving.properties", properties.encode()),
                                               regular("model.py", SHIM.encode())])
    report = inspect_artifact(archive)
    assert (problem in report.problems) if problem else not any("backend" in p for p in report.problems)
    assert any(n.startswith(f"backend {'neuronx'}, TP 1") for n in report.notes)
