"""lmi package: reproducible bytes, the vendored runtime, refused links and credentials, S3 layout."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import shutil
import struct
import tarfile
import zipfile
from pathlib import Path

import pytest

import lmi_handlers
from lmi_tools.errors import UsageError, ValidationFailed
from lmi_tools.packaging.package import DEFAULT_MTIME, PackagingError, build, collect, write_tarball

SHIM = "from lmi_handlers.entrypoint import handle  # noqa: F401\n"
PROPERTIES = ("# lmi: instance_type=g5.xlarge\nengine=Python\noption.entryPoint=model.py\noption.backend=scripted\n"
              "option.rolling_batch=disable\n")
AWS_KEY_ID = "AKIA" + "IOSFODNN7EXAMPLE"          # AWS's documented example key, split so no scanner
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYEXAMPLEKEY"  # trips over this test file itself


@pytest.fixture
def model(tmp_path) -> Path:
    directory = tmp_path / "model"
    (directory / "tokenizer").mkdir(parents=True)
    (directory / "serving.properties").write_text(PROPERTIES)
    (directory / "model.py").write_text(SHIM)
    (directory / "requirements.txt").write_text("# none\n")
    (directory / "tokenizer" / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    (directory / "weights.bin").write_bytes(os.urandom(4096))
    (directory / "run.sh").write_text("#!/bin/sh\n")
    (directory / "run.sh").chmod(0o755)
    (directory / "__pycache__").mkdir()
    (directory / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    (directory / ".git").mkdir()
    (directory / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (directory / "empty").mkdir()
    return directory


def names_in(archive: Path) -> list[str]:
    with tarfile.open(archive) as tar:
        return tar.getnames()


def runtime_files() -> list[str]:
    package = Path(lmi_handlers.__file__).parent
    return sorted(f"lmi_handlers/{p.relative_to(package).as_posix()}" for p in package.rglob("*.py")
                  if "__pycache__" not in p.parts)


def test_artifact_holds_the_model_and_the_runtime_only(model, tmp_path):
    out = tmp_path / "model.tar.gz"
    build(model, out, None)
    names = names_in(out)
    expected = sorted(["model.py", "requirements.txt", "run.sh", "serving.properties", "tokenizer/tokenizer.json",
                       "weights.bin", *runtime_files()])
    assert names == expected  # sorted, no caches, no .git, no empty folders, no lmi_tools or tests
    assert "lmi_handlers/entrypoint.py" in names and not any(n.startswith(("lmi_tools", "tests")) for n in names)


def test_headers_are_normalized(model, tmp_path):
    out = tmp_path / "model.tar.gz"
    build(model, out, None)
    with tarfile.open(out) as tar:
        for member in tar.getmembers():
            assert member.isfile()
            assert (member.mtime, member.uid, member.gid, member.uname, member.gname) == (DEFAULT_MTIME, 0, 0, "", "")
            assert member.mode == (0o755 if member.name == "run.sh" else 0o644)
    header = out.read_bytes()[:10]
    assert header[:3] == b"\x1f\x8b\x08" and header[3] & 0x08 == 0  # gzip, no file name stored
    assert int.from_bytes(header[4:8], "little") == DEFAULT_MTIME


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_input_same_sha256(model, tmp_path):
    first = build(model, tmp_path / "a.tar.gz", None)
    second = build(model, tmp_path / "b.tar.gz", None)
    assert first.sha256 == second.sha256 == sha(tmp_path / "a.tar.gz")
    for path in model.rglob("*"):  # new mtimes, a copy elsewhere: still the same bytes
        os.utime(path, (1_700_000_000, 1_700_000_000))
    copy = tmp_path / "elsewhere" / "model"
    shutil.copytree(model, copy)
    assert build(copy, tmp_path / "c.tar.gz", None).sha256 == first.sha256


def test_content_changes_change_the_sha256(model, tmp_path):
    first = build(model, tmp_path / "a.tar.gz", None).sha256
    (model / "requirements.txt").write_text("numpy\n")
    assert build(model, tmp_path / "b.tar.gz", None).sha256 != first


def test_source_date_epoch(model, tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    out = tmp_path / "model.tar.gz"
    build(model, out, None)
    with tarfile.open(out) as tar:
        assert {m.mtime for m in tar.getmembers()} == {1_700_000_000}
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(UsageError, match="SOURCE_DATE_EPOCH"):
        build(model, out, None)


def test_round_trip_through_tar(model, tmp_path):
    out = tmp_path / "model.tar.gz"
    build(model, out, None)
    with tarfile.open(out) as tar:
        for name in ("model.py", "weights.bin", "tokenizer/tokenizer.json"):
            assert tar.extractfile(name).read() == (model / name).read_bytes()
        assert tar.extractfile("lmi_handlers/__init__.py").read() == \
            (Path(lmi_handlers.__file__)).read_bytes()


def test_uncompressed_layout_matches_the_tarball(model, tmp_path):
    out, tree = tmp_path / "model.tar.gz", tmp_path / "s3-prefix"
    build(model, out, tree)
    files = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file())
    assert files == names_in(out)
    folders = [p for p in tree.rglob("*") if p.is_dir()]
    assert all(any(q.is_file() for q in d.rglob("*")) for d in folders)  # no empty folder keys for S3
    assert not any(p.is_symlink() for p in tree.rglob("*"))
    assert (tree / "weights.bin").read_bytes() == (model / "weights.bin").read_bytes()
    with pytest.raises(UsageError, match="not empty"):
        build(model, None, tree)


def test_output_inside_the_model_directory_is_not_packaged(model):
    build(model, model / "model.tar.gz", None)
    build(model, model / "model.tar.gz", None)  # the previous artifact is not swallowed
    assert "model.tar.gz" not in names_in(model / "model.tar.gz")


def test_model_dir_lmi_handlers_is_replaced(model, tmp_path):
    (model / "lmi_handlers").mkdir()
    (model / "lmi_handlers" / "stale.py").write_text("x = 1\n")
    artifact = build(model, tmp_path / "model.tar.gz", None)
    assert artifact.replaced_runtime
    assert "lmi_handlers/stale.py" not in names_in(tmp_path / "model.tar.gz")


def test_links_inside_are_followed_links_outside_refused(model, tmp_path):
    (model / "alias.json").symlink_to("tokenizer/tokenizer.json")
    (model / "tok").symlink_to("tokenizer", target_is_directory=True)
    entries = {e.name for e in collect(model)}
    assert {"alias.json", "tok/tokenizer.json"} <= entries
    secret = tmp_path / "outside.txt"
    secret.write_text("outside")
    (model / "escape.txt").symlink_to(secret)
    (model / "up").symlink_to("..", target_is_directory=True)
    (model / "dangling").symlink_to("missing-file")
    (model / "loop").symlink_to(".", target_is_directory=True)
    with pytest.raises(PackagingError) as info:
        collect(model)
    message = str(info.value)
    assert "escape.txt: symbolic link to" in message and "points outside the model directory" in message
    assert "up: symbolic link to .." in message
    assert "dangling: broken symbolic link" in message
    assert "loop: symbolic link loops back" in message


@pytest.mark.parametrize("name, content", [
    (".aws/credentials", "[default]\naws_access_key_id = x\n"),
    ("certs/server.pem", "not even a key\n"),
    ("id_rsa", "anything\n"),
    (".netrc", "machine x login y password z\n"),
    (".env", f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}\n"),
    ("prod.env", "export HF_TOKEN=abc123\n"),
    ("notes.txt", f"the key id is {AWS_KEY_ID}\n"),
    ("config/settings.ini", f"aws_secret_access_key = {AWS_SECRET}\n"),
    ("deploy.yaml", "key: |\n  -----BEGIN OPENSSH PRIVATE KEY-----\n  abc\n"),
    ("hub.json", '{"token": "hf_' + "a" * 34 + '"}'),
    ("sts.json", '{"Credentials": {"AccessKeyId": "x", "SecretAccessKey": "' + AWS_SECRET + '"}}'),
    ("session.txt", "aws_session_token=" + "A" * 120 + "\n"),
])
def test_credentials_are_refused(model, tmp_path, name, content):
    path = model / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    with pytest.raises(PackagingError, match=f"{name}: looks like a credential") as info:
        build(model, tmp_path / "model.tar.gz", None)
    assert "never in the artifact" in info.value.hint
    assert not (tmp_path / "model.tar.gz").exists()


GITHUB_TOKEN = "ghp_" + "A1b2" * 9  # split, as above


@pytest.mark.parametrize("name, content", [
    ("deploy/notes.md", f"clone with {GITHUB_TOKEN}\n".encode()),
    ("conf/app.conf", b"[db]\nDB_PASSWORD=hunter22\n"),
    ("start.sh", b"#!/bin/sh\nexport API_KEY='k3y-value'\n"),
    ("requirements.txt", b"--extra-index-url https://user:s3cret@pypi.example.com/simple\n"),
    ("blob.bin", os.urandom(5000) + f"  {GITHUB_TOKEN}  ".encode() + os.urandom(5000)),
    ("history.txt.gz", gzip.compress(b"x" * 10_000 + f"\nDB_PASSWORD=hunter22\n".encode())),
    ("slack.json", b'{"token": "xoxb-123456789012-123456789012-abcdefghij"}'),
])
def test_token_formats_of_the_secret_scanner_are_refused(model, tmp_path, name, content):
    """detect-secrets' token formats, NAME_PASSWORD=value lines, and secrets inside .bin and .gz files."""
    path = model / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    with pytest.raises(PackagingError, match=f"{name}: looks like a credential"):
        build(model, tmp_path / "model.tar.gz", None)


JWT = ".".join(base64.urlsafe_b64encode(json.dumps(part).encode()).decode().rstrip("=") for part in (
    {"alg": "HS256", "typ": "JWT"}, {"sub": "1234567890", "name": "ops"})) + ".c2lnbmF0dXJlLWJ5dGVz"
HEX_SECRET = "9f86d081884c7d659a2f" + "eaa0c55ad015a3bf4f1b"  # split, as above


def _zip(members):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _safetensors(metadata):
    header = json.dumps({"__metadata__": metadata, "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})
    return struct.pack("<Q", len(header)) + header.encode() + bytes(4)


HIDDEN = [
    ("client.py", f'HEADERS = {{"Authorization": "Bearer {JWT}"}}\n'.encode(), "JwtTokenDetector"),
    ("db.yaml", b"database:\n  user: app\n  password: hunter22\n", "KeywordDetector"),
    ("app.py", f'secret_key = "{HEX_SECRET}"\n'.encode(), "KeywordDetector"),
    ("cfg.json", f'{{"upload_token": "{HEX_SECRET}"}}'.encode(), "HexHighEntropyString"),
    ("docs.zip", _zip({"readme.md": b"hello", "deploy/notes.md": f"clone with {GITHUB_TOKEN}\n".encode()}),
     "its member deploy/notes.md: it contains what detect-secrets' GitHubTokenDetector"),
    ("nested.zip", _zip({"inner.zip": _zip({"db.yaml": b"password: hunter22\n"})}),
     "its member inner.zip: its member db.yaml"),
    ("keys.zip", _zip({".aws/credentials": b"[default]\n"}), "its member .aws/credentials: an AWS CLI"),
    ("notes.txt", f"\ufeffthe key id is {AWS_KEY_ID}\n".encode("utf-16-le"), "AWSKeyDetector"),
    ("notes-be.txt", f"token: {GITHUB_TOKEN}\n".encode("utf-16-be"), "GitHubTokenDetector"),
    ("k8s.yaml", b"kind: Secret\ndata:\n  token: " + base64.b64encode(GITHUB_TOKEN.encode()) + b"\n",
     "(GitHub Token), base64-encoded"),
    ("adapter.safetensors", _safetensors({"format": "pt", "hub": f"token={GITHUB_TOKEN}"}),
     "in its header's __metadata__"),
]


@pytest.mark.parametrize("name, content, reason", HIDDEN, ids=[case[0] for case in HIDDEN])
def test_secrets_the_line_rules_find_and_secrets_hidden_in_archives_encodings_and_headers(model, tmp_path, name,
                                                                                         content, reason):
    """detect-secrets' JWT, keyword and hex-entropy rules, and its token rules inside zip members, UTF-16 text,
    base64 text and a safetensors header."""
    (model / name).write_bytes(content)
    with pytest.raises(PackagingError) as info:
        build(model, tmp_path / "model.tar.gz", None)
    assert f"{name}: looks like a credential" in str(info.value) and reason in str(info.value), str(info.value)


def test_a_real_model_directory_and_hashes_pass(model, tmp_path, smollm2_dir):
    """SmolLM2's tokenizer and configuration files, and what model directories hold beside them (hashes, plain
    zips, UTF-16 text without secrets), ship."""
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json",
                 "chat_template.jinja", "gguf_source.json"):
        if (smollm2_dir / name).exists():
            shutil.copy(smollm2_dir / name, model / name)
    (model / "hashes.json").write_text(json.dumps({"sha256": HEX_SECRET * 2, "commit": HEX_SECRET,
                                                   "revision": HEX_SECRET}))
    (model / "examples.zip").write_bytes(_zip({"prompts.txt": b"The capital of France is\n" * 50}))
    (model / "notes-utf16.txt").write_bytes("A model card, in UTF-16.\n".encode("utf-16"))
    (model / "weights.safetensors").write_bytes(_safetensors({"format": "pt"}))
    (model / "app.yaml").write_text("password: ${DB_PASSWORD}\nsecret: <your-secret>\n")
    build(model, tmp_path / "model.tar.gz", None)


def test_zip_bombs_and_encrypted_members_are_reported_unscanned(model, tmp_path):
    (model / "bomb.zip").write_bytes(_zip({"zeros.txt": bytes(64 << 20)}))
    zipped = bytearray(_zip({"secret.txt": b"x"}))
    zipped[6] |= 1  # the local header's and the central directory's "encrypted" bit
    zipped[zipped.rindex(b"PK\x01\x02") + 8] |= 1
    (model / "locked.zip").write_bytes(bytes(zipped))
    with pytest.raises(PackagingError) as info:
        build(model, tmp_path / "model.tar.gz", None)
    assert "bomb.zip: looks like a credential (its member zeros.txt expands more than 100 times" in str(info.value)
    assert "locked.zip: looks like a credential (its member secret.txt is encrypted" in str(info.value)


def test_torch_weights_and_references_to_secrets_pass(model, tmp_path):
    (model / "pytorch_model.bin").write_bytes(b"PK\x03\x04" + os.urandom(1000) + GITHUB_TOKEN.encode())
    (model / "run.sh").write_text('export DB_PASSWORD="$DB_PASSWORD"\nAPI_KEY=${API_KEY}\n')
    (model / "settings.py").write_text("API_KEY = os.environ['API_KEY']\nSECRET = load_secret()\n")
    build(model, tmp_path / "model.tar.gz", None)


def test_a_gzip_bomb_in_the_model_directory_is_refused_in_seconds(model, tmp_path):
    (model / "notes.gz").write_bytes(gzip.compress(bytes(64 << 20), 9))  # 64 MiB of zeros in about 64 KB
    with pytest.raises(PackagingError, match="notes.gz: looks like a credential .*expands more than 100 times"):
        build(model, tmp_path / "model.tar.gz", None)


def test_every_problem_is_listed_at_once(model, tmp_path):
    (model / "id_rsa").write_text("x")
    (model / "key.pem").write_text("x")
    (model / "escape").symlink_to(tmp_path)
    with pytest.raises(PackagingError) as info:
        build(model, tmp_path / "model.tar.gz", None)
    assert all(n in str(info.value) for n in ("id_rsa", "key.pem", "escape"))


def test_ordinary_env_and_token_words_pass(model, tmp_path):
    (model / ".env").write_text("LOG_LEVEL=debug\nMAX_TOKENS=64\n")
    (model / "tokenizer_config.json").write_text('{"pad_token": "<pad>", "eos_token": "</s>"}')
    (model / "gen.py").write_text("EOS_TOKEN = 2\n")
    (model / "commit.txt").write_text("built from 3f2a9c1e5b7d4a6f8e0c2b4d6f8a0c2e4b6d8f0a\n")
    build(model, tmp_path / "model.tar.gz", None)


def test_validation_gates_packaging(model, tmp_path):
    text = (model / "serving.properties").read_text().replace("option.entryPoint=model.py", "option.entryPoint=x.py")
    (model / "serving.properties").write_text(text)
    with pytest.raises(ValidationFailed, match="there is no x.py") as info:
        build(model, tmp_path / "model.tar.gz", None)
    assert "--no-validate" in info.value.hint
    build(model, tmp_path / "model.tar.gz", None, validate=False)


def test_a_serving_properties_is_required(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no serving.properties"):
        build(tmp_path / "empty", tmp_path / "model.tar.gz", None, validate=False)


def test_write_tarball_is_atomic(model, tmp_path):
    entries = collect(model)
    out = tmp_path / "model.tar.gz"
    (model / "weights.bin").unlink()  # vanishes between collecting and writing
    with pytest.raises(FileNotFoundError):
        write_tarball(entries, out)
    assert list(tmp_path.glob("*model.tar.gz*")) == []


def test_gzip_stream_decompresses_to_a_plain_tar(model, tmp_path):
    out = tmp_path / "model.tar.gz"
    build(model, out, None)
    raw = gzip.decompress(out.read_bytes())
    assert raw[257:262] == b"ustar"


def test_a_symlink_loop_is_a_problem_not_a_traceback(model):
    """Issue 12 #9."""
    (model / "loop").symlink_to("loop")
    (model / "a").symlink_to("b")
    (model / "b").symlink_to("a")
    with pytest.raises(PackagingError) as info:
        collect(model)
    assert "loop: symbolic link loop" in str(info.value) and "a: symbolic link loop" in str(info.value)


def test_large_text_files_are_scanned_for_credentials(model, monkeypatch):
    """Issue 12 #11: a text file over 64 MiB used to ship unread; now every block is read, keys across blocks too."""
    from lmi_tools.packaging import credentials

    monkeypatch.setattr(credentials, "BLOCK", 1024)  # the same code path as a 64 MiB file, 1000 times smaller
    with (model / "notes.txt").open("w") as handle:
        handle.write("x" * 5000 + " " * 1020 + f"aws_access_key_id = {AWS_KEY_ID}\n" + "y" * 3000)
    with pytest.raises(PackagingError, match="notes.txt: looks like a credential"):
        collect(model)


def test_a_hard_link_to_a_file_outside_is_refused(model, tmp_path):
    """Issue 12 #11: a hard link is the outside file itself."""
    outside = tmp_path / "secret.txt"
    outside.write_text("not for the artifact")
    os.link(outside, model / "innocent.txt")
    with pytest.raises(PackagingError, match="innocent.txt: hard link to a file with 1 other name"):
        collect(model)
    (model / "innocent.txt").unlink()
    os.link(model / "requirements.txt", model / "same.txt")  # both names inside: fine
    collect(model)


def test_sparse_files_and_outside_weights_are_warned_about(model, tmp_path):
    """Issue 12 #11: a 2 GB sparse file and a model_id outside the directory no longer pass silently."""
    with (model / "hole.bin").open("wb") as handle:
        handle.truncate(2 * 1024**3)
    weights = tmp_path / "weights"
    weights.mkdir()
    (model / "serving.properties").write_text(PROPERTIES + f"option.model_id={weights}\n")
    artifact = build(model, None, tmp_path / "tree", validate=False)
    assert any("hole.bin: sparse file" in w for w in artifact.warnings), artifact.warnings
    assert any(f"option.model_id={weights} is outside the model directory" in w for w in artifact.warnings)
    (model / "hole.bin").unlink()
    (model / "serving.properties").write_text(PROPERTIES + "option.model_id=./tokenizer\n")
    assert build(model, None, tmp_path / "tree2", validate=False).warnings == []


def test_build_reports_progress_for_every_byte_of_each_output(tmp_path):
    from lmi_tools.packaging.package import build

    model = tmp_path / "model"
    model.mkdir()
    (model / "serving.properties").write_text("engine=Python\noption.entryPoint=lmi_handlers.entrypoint\n")
    (model / "weights.bin").write_bytes(os.urandom(3 << 20))
    calls: list[tuple[int, int]] = []
    artifact = build(model, tmp_path / "model.tar.gz", tmp_path / "tree", validate=False,
                     progress=lambda done, total: calls.append((done, total)))
    starts = [i for i, (done, _) in enumerate(calls) if done == 0]
    assert len(starts) == 2  # the tarball, then the tree
    for start, end in zip(starts, starts[1:] + [len(calls)]):
        total = calls[start][1]
        assert total == artifact.total_bytes and sum(done for done, _ in calls[start:end]) == total
    assert len(calls) > 10  # the 3 MB file is reported in blocks, not at the end
