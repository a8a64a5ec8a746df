"""Files that look like credentials, so that ``lmi package`` never ships them inside an artifact.

Two kinds of evidence: the file's name (``.aws/credentials``, ``id_rsa``, ``*.pem``, ``.netrc``, ...) and its
content, read with detect-secrets' rules (Yelp's scanner) and a few of ours:

* token formats, over every byte: detect-secrets' (GitHub, GitLab, AWS, Slack, Stripe, OpenAI, PyPI, npm, SendGrid,
  Square, Azure storage keys, Discord bots, private keys, passwords in URLs) and ours for what it does not know
  (Hugging Face tokens, AWS secret keys and session tokens assigned to their names, ``NAME_PASSWORD=value`` lines);
* detect-secrets' line rules, on the lines that hold what they look for: ``KeywordDetector`` (``password: x`` in
  YAML, ``secret_key = "..."`` in code, by the file's type), ``JwtTokenDetector`` (JSON web tokens whose header and
  payload decode to JSON) and ``HexHighEntropyString`` (quoted hex strings of high entropy), each finding passed
  through detect-secrets' own false-positive filters (templates, ``$VAR``, ids, sequences, UUIDs, calls). Its
  base64 entropy rule and loosest vendor formats are left out: weights and tokenizers are full of such strings.

Text is also read where it hides: UTF-16 text (every other byte NUL), base64 blobs (decoded, then read with the
same rules), members of zip archives (one level inside another at most, each bounded like gzip), and the JSON
header of a ``.safetensors`` file (its ``__metadata__``; the tensors hold no text).

Every file is read whole, in overlapping blocks, except weights in formats that hold no text (``.gguf``, ...; a
``.bin`` when it is in one of torch's formats or over 256 MiB). In binary data only the stretches of text are
searched. A gzip-compressed file is scanned as what it expands to, unless it expands as a compression bomb does
(more than ``MAX_EXPANSION`` times its size): that is reported instead.
"""

from __future__ import annotations

import base64
import json
import re
import zipfile
import zlib
from functools import lru_cache
from itertools import chain
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Iterator

from lmi_handlers.adapters import TORCH_MAGIC
from lmi_handlers.safetensors_header import header_of

SSH_KEYS = {"id_rsa", "id_dsa", "id_ecdsa", "id_ed25519"}
CREDENTIAL_FILES = {".netrc", "_netrc", ".git-credentials", ".pgpass", ".pypirc", ".npmrc", ".dockercfg"}
KEY_SUFFIXES = {".pem", ".key", ".p12", ".pfx", ".jks", ".keystore", ".ppk"}
# Not scanned: weights and other large binary formats that hold no text (a .safetensors file's header is read).
BINARY_SUFFIXES = {".pt", ".pth", ".ckpt", ".gguf", ".onnx", ".neff", ".h5", ".msgpack",
                   ".npz", ".npy", ".model", ".tflite", ".pb", ".ot"}
#: A ``.bin`` that starts as torch.save's files do (``TORCH_MAGIC``) is weights, and so is one larger than this (raw
#: tensors, compiled graphs); smaller ones are read.
WEIGHTS_BIN_BYTES = 256 * 1024**2
ZIP_MAGIC = b"PK\x03\x04"
#: Members a zip archive may hold, and how deep zips inside zips are read, before it is reported unscanned.
MAX_ZIP_MEMBERS = 10_000
MAX_ZIP_DEPTH = 2
GZIP_MAGIC = b"\x1f\x8b"
BLOCK = 4 * 1024**2
#: Carried from one block to the next, longer than any match the rules need to see whole.
OVERLAP = 64 * 1024
#: A compressed file that expands more than this many times its size is not scanned but reported.
MAX_EXPANSION = 100

#: detect-secrets plugins (module, class) whose token formats are checked in every scanned file.
DETECT_SECRETS_PLUGINS = [
    ("aws", "AWSKeyDetector"), ("azure_storage_key", "AzureStorageKeyDetector"), ("basic_auth", "BasicAuthDetector"),
    ("discord", "DiscordBotTokenDetector"), ("github_token", "GitHubTokenDetector"),
    ("gitlab_token", "GitLabTokenDetector"), ("npm", "NpmDetector"), ("openai", "OpenAIDetector"),
    ("private_key", "PrivateKeyDetector"), ("pypi_token", "PypiTokenDetector"), ("sendgrid", "SendGridDetector"),
    ("slack", "SlackDetector"), ("square_oauth", "SquareOAuthDetector"), ("stripe", "StripeDetector"),
]

OWN_RULES = [
    (re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----"), "a private key block"),
    # Assigned to its usual name (aws_secret_access_key, AWS_SECRET_ACCESS_KEY, "SecretAccessKey": ...):
    # a bare 40-character string is too common (git hashes) to mean anything on its own.
    (re.compile(rb"(?i)secret_?access_?key[\"'\s]*[:=]\s*[\"']?[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+])"),
     "an AWS secret access key"),
    (re.compile(rb"(?i)session_?token[\"'\s]*[:=]\s*[\"']?[A-Za-z0-9/+=]{100,}"), "an AWS session token"),
    # The lookbehind sits after the literal so that the search can skip ahead to each "hf_".
    (re.compile(rb"hf_(?<![A-Za-z0-9_]hf_)[A-Za-z0-9]{34,}(?![A-Za-z0-9])"), "a Hugging Face token"),
]
#: NAME_PASSWORD=value as in shell, .ini and .conf files (detect-secrets' keyword rule wants the value quoted, and
#: reads line by line, far slower); a value that refers to elsewhere ($VAR, os.environ, {{ template }},
#: <placeholder>) or is code (a call, an index) is not a secret. The start of the line is checked apart
#: (ASSIGNED_NAME): a pattern that began with it would make the search try every line.
ASSIGNED_SECRET = re.compile(rb"(?:PASSWORD|PASSWD|SECRET|SECRET_KEY|API_KEY|ACCESS_KEY|PRIVATE_KEY)\s*[=:]\s*[\"']?"
                             rb"(?![$<{%]|os\.)[^\s\"'#()\[\]]{4,}(?![^\s\"'#])")
ASSIGNED_NAME = re.compile(rb"\s*(?:export\s+)?(?:[A-Za-z0-9]+_)*")
# Assignments in .env files whose names say they hold a secret (tokens too: .env files hold nothing else there).
ENV_SECRET = re.compile(rb"(?m)^\s*(?:export\s+)?(?:[A-Z0-9]+_)*(?:SECRET|PASSWORD|PASSWD|TOKEN|API_KEY|ACCESS_KEY"
                        rb"|PRIVATE_KEY)(?:_[A-Z0-9]+)*\s*=\s*[\"']?[^\s\"'#]+")


@lru_cache(maxsize=1)
def token_rules() -> list[tuple[re.Pattern[bytes], str]]:
    """detect-secrets' token patterns as bytes patterns (ASCII classes: they run over binary files too), then ours."""
    from importlib import import_module

    rules = []
    for module, name in DETECT_SECRETS_PLUGINS:
        plugin = getattr(import_module(f"detect_secrets.plugins.{module}"), name)()
        rules += [(re.compile(pattern.pattern.encode("ascii"), pattern.flags & ~re.UNICODE),
                   f"what detect-secrets' {name} takes for a secret ({plugin.secret_type})")
                  for pattern in plugin.denylist]
    return rules + OWN_RULES


def is_env_file(name: str) -> bool:
    return name == ".env" or name.startswith(".env.") or name.endswith(".env")


def reason_from_name(relpath: str) -> str | None:
    path = PurePosixPath(relpath)
    name = path.name
    if name in ("credentials", "config") and path.parent.name == ".aws":
        return "an AWS CLI credentials/config file"
    if name in SSH_KEYS:
        return "an SSH private key"
    if name in CREDENTIAL_FILES:
        return "a credentials file"
    if path.suffix.lower() in KEY_SUFFIXES:
        return "a key or certificate file"
    return None


#: Printable ASCII, tab and line ends -> "a", every other byte -> 0: a mask that bytes' C searches read fast.
PRINTABLE = bytes(0x61 if c in (9, 10, 13) or 32 <= c <= 126 else 0 for c in range(256))
#: The shortest stretch of text any rule matches (an AWS access key id is 20 characters).
RUN = b"a" * 16


def text_of(data: bytes) -> bytes:
    """``data`` itself when it is text; else its stretches of text, one a line, so that the rules' regular
    expressions, slow over bytes, read little of a binary file (weights, zeros)."""
    mask = data.translate(PRINTABLE)
    if mask.count(0) * 100 <= len(mask):
        return data
    runs, start = [], mask.find(RUN)
    while start >= 0:
        end = mask.find(0, start)
        end = len(mask) if end < 0 else end
        runs.append(data[start:end])
        start = mask.find(RUN, end)
    return b"\n".join(runs)


#: detect-secrets' plugins that read a line in its file's context (module, class).
LINE_PLUGINS = [("keyword", "KeywordDetector"), ("jwt", "JwtTokenDetector"),
                ("high_entropy_strings", "HexHighEntropyString")]
#: detect-secrets' default false-positive filters (``detect_secrets.filters.heuristic``), with what each reads.
FILTERS = {"is_sequential_string": "secret", "is_potential_uuid": "secret", "is_likely_id_string": "secret line plugin",
           "is_templated_secret": "secret", "is_prefixed_with_dollar_sign": "secret", "is_indirect_reference": "line",
           "is_lock_file": "filename", "is_not_alphanumeric_string": "secret", "is_swagger_file": "filename"}
#: The most of a line around a candidate handed to the line plugins (a minified JSON file is one line).
WINDOW = 500
#: A quoted hex string the line calls a hash (a file's sha256, a commit, a revision) is one, not a secret.
HASH_WORDS = re.compile(r"(?i)sha\d*|md5|hash|digest|checksum|commit|revision|etag|fingerprint|uuid|\bo?id\b")
#: Base64 (or base64url) blobs long enough to hide a token; decoded and read with the same rules.
BASE64 = re.compile(rb"[A-Za-z0-9+/_-]{20,}={0,2}")


@lru_cache(maxsize=1)
def line_plugins() -> tuple[list[Any], list[re.Pattern[bytes]]]:
    """detect-secrets' line plugins, and what a line must hold, lowercased, for any of them to find something in it:
    one of ``KeywordDetector``'s words, a JWT's start, or a quoted string of hex digits (three searches: one
    pattern of all three reads a tokenizer's JSON several times slower)."""
    from importlib import import_module

    from detect_secrets.plugins.keyword import DENYLIST

    plugins = [getattr(import_module(f"detect_secrets.plugins.{module}"), name)() for module, name in LINE_PLUGINS]
    words = "|".join(DENYLIST).encode("utf-8")  # regular expressions already ("api_?key")
    return plugins, [re.compile(words), re.compile(rb"eyj"), re.compile(rb"[\"'][0-9a-f]{8,}[\"']")]


def _filtered(filename: str, line: str, secret: str, plugin: Any) -> bool:
    from detect_secrets.filters import heuristic

    if type(plugin).__name__ == "HexHighEntropyString" and HASH_WORDS.search(line):
        return True
    values = {"secret": secret, "line": line, "plugin": plugin, "filename": filename}
    return any(getattr(heuristic, name)(*(values[arg] for arg in args.split())) for name, args in FILTERS.items())


def line_rule_reason(relpath: str, data: bytes) -> str | None:
    """What detect-secrets' line plugins find in ``data`` (text), past its filters."""
    plugins, searches = line_plugins()
    lowered = data.lower()
    end = -1
    for start, stop in sorted(m.span() for search in searches for m in search.finditer(lowered)):
        if start < end:
            continue  # read with the previous candidate's line
        begin = max(data.rfind(b"\n", 0, start) + 1, start - WINDOW)
        end = data.find(b"\n", stop)
        end = min(len(data) if end < 0 else end, stop + WINDOW)
        line = data[begin:end].decode("utf-8", "replace")
        for plugin in plugins:
            if any(not _filtered(relpath, line, str(found.secret_value), plugin)
                   for found in plugin.analyze_line(filename=relpath, line=line)):
                return f"what detect-secrets' {type(plugin).__name__} takes for a secret ({plugin.secret_type})"
    return None


def _reason_in_text(relpath: str, data: bytes) -> str | None:
    for pattern, what in token_rules():
        if pattern.search(data):
            return f"it contains {what}"
    if is_env_file(PurePosixPath(relpath).name) and ENV_SECRET.search(data):
        return "it is an environment file that sets a secret"
    for match in ASSIGNED_SECRET.finditer(data):
        line_start = data.rfind(b"\n", 0, match.start()) + 1
        if ASSIGNED_NAME.fullmatch(data, line_start, match.start()):
            return "it assigns a password or secret (NAME_PASSWORD=value)"
    found = line_rule_reason(relpath, data)
    return f"it contains {found}" if found else None


def utf16_text(data: bytes) -> bytes | None:
    """The text of ``data`` when it is UTF-16 (every other byte NUL, from its first 4 KiB), one byte a character
    (secrets are ASCII); else None."""
    sample = data[:4096]
    half = len(sample) // 2
    if half < 16:
        return None
    for chars, nuls in ((0, 1), (1, 0)):
        if sample[nuls::2].count(0) >= 0.9 * half and sample[chars::2].count(0) < 0.1 * half:
            return data[chars::2]
    return None


def base64_text(data: bytes) -> bytes:
    """The base64 blobs of ``data``, decoded, as one text (its stretches of text, one blob a line)."""
    decoded = []
    for match in BASE64.finditer(data):
        blob = match.group().rstrip(b"=").replace(b"-", b"+").replace(b"_", b"/")
        if len(blob) % 4 == 1:  # no base64 ends so; one stray character more
            blob = blob[:-1]
        try:
            decoded.append(base64.b64decode(blob + b"=" * (-len(blob) % 4)))
        except ValueError:
            continue
    return text_of(b"\n".join(decoded))


def reason_from_content(relpath: str, data: bytes) -> str | None:
    """Why ``data`` (a block of the file ``relpath``) looks like a credential: in its text, its UTF-16 text, or
    the base64 blobs in either; None when nothing does."""
    for text in (text_of(data), utf16_text(data)):
        if text is None:
            continue
        reason = _reason_in_text(relpath, text)
        if reason is None:
            reason = _reason_in_text(relpath, base64_text(text))
            reason = reason and f"{reason}, base64-encoded"
        if reason:
            return reason
    return None


def should_scan(relpath: str) -> bool:
    return PurePosixPath(relpath).suffix.lower() not in BINARY_SUFFIXES


def _blocks(stream: BinaryIO) -> Iterator[bytes]:
    while block := stream.read(BLOCK):
        yield block


class ExpansionError(Exception):
    """A compressed file expands like a compression bomb."""


def _expanded(first: bytes, stream: BinaryIO) -> Iterator[bytes]:
    """The gzip stream that starts with ``first``, expanded block by block; raises ``ExpansionError`` once it has
    expanded more than ``MAX_EXPANSION`` times what it has read (past the first block), before expanding further."""
    inflate = zlib.decompressobj(zlib.MAX_WBITS | 16)
    read = expanded = 0
    for block in chain([first], _blocks(stream)):
        for start in range(0, len(block), 64 * 1024):  # fed in small pieces, so that the ratio is checked early
            read += min(64 * 1024, len(block) - start)
            pending = block[start:start + 64 * 1024]
            while pending:
                data = inflate.decompress(pending, BLOCK)
                pending = inflate.unconsumed_tail
                expanded += len(data)
                if expanded > max(BLOCK, MAX_EXPANSION * read):
                    raise ExpansionError(f"it is gzip that expands more than {MAX_EXPANSION} times its size, so it "
                                         "was not scanned (a compression bomb?); ship what it holds uncompressed")
                if data:
                    yield data


def reason_from_stream(relpath: str, stream: BinaryIO, size: int = 0, depth: int = 0) -> str | None:
    """``reason_from_content`` over a file of any size, read in overlapping blocks; a gzip file is read expanded,
    a zip archive member by member, a safetensors file's header alone. ``size`` is the file's, where known: a
    ``.bin`` that large is weights. ``depth``: how many zip archives the file is inside."""
    suffix = PurePosixPath(relpath).suffix.lower()
    if suffix == ".safetensors":
        return _safetensors_reason(relpath, stream, size)
    if suffix == ".bin" and size > WEIGHTS_BIN_BYTES:
        return None
    first = stream.read(BLOCK)
    if suffix == ".bin" and first.startswith(TORCH_MAGIC):
        return None
    if first.startswith(ZIP_MAGIC) and stream.seekable():
        reason = _zip_reason(stream, depth)
        if reason != "not a zip":
            return reason
        stream.seek(len(first))  # only looks like one: read as it is
    blocks = _expanded(first, stream) if first.startswith(GZIP_MAGIC) else chain([first], _blocks(stream))
    tail = b""
    try:
        for block in blocks:
            reason = reason_from_content(relpath, tail + block)
            if reason:
                return reason
            tail = (tail + block)[-OVERLAP:]
    except ExpansionError as exc:
        return str(exc)
    except zlib.error as exc:
        return f"it starts like gzip but does not expand ({exc}), so it was not scanned"
    return None


def _safetensors_reason(relpath: str, stream: BinaryIO, size: int) -> str | None:
    """What the ``__metadata__`` of a safetensors header holds (one entry a line); a file that is not safetensors is
    not read (loading it fails anyway)."""
    try:
        metadata = header_of(stream, size).get("__metadata__") or {}
    except (ValueError, OSError):
        return None
    reason = reason_from_content(relpath, json.dumps(metadata, indent=0, ensure_ascii=False).encode())
    return reason and f"{reason}, in its header's __metadata__"


def _zip_reason(stream: BinaryIO, depth: int) -> str | None:
    """Why a member of the zip archive ``stream`` looks like a credential (by name or content), or why the archive
    was not scanned; ``"not a zip"`` when it is none."""
    stream.seek(0)
    try:
        archive = zipfile.ZipFile(stream)
    except (zipfile.BadZipFile, ValueError, EOFError):
        return "not a zip"
    members = [info for info in archive.infolist() if not info.is_dir()]
    if depth >= MAX_ZIP_DEPTH or len(members) > MAX_ZIP_MEMBERS:
        return (f"it is a zip archive {depth + 1} levels deep in zip archives" if depth >= MAX_ZIP_DEPTH else
                f"it is a zip archive of {len(members):,} members, more than {MAX_ZIP_MEMBERS:,}") + \
            ", so it was not scanned; ship what it holds unzipped"
    try:
        for info in members:
            if info.flag_bits & 1:
                return f"its member {info.filename} is encrypted, so it was not scanned"
            if info.file_size > max(BLOCK, MAX_EXPANSION * info.compress_size):
                return (f"its member {info.filename} expands more than {MAX_EXPANSION} times its size, so it was not "
                        "scanned (a compression bomb?); ship what it holds unzipped")
            reason = reason_from_name(info.filename)
            if reason is None and should_scan(info.filename):
                with archive.open(info) as member:
                    reason = reason_from_stream(info.filename, member, info.file_size, depth + 1)
            if reason:
                return f"its member {info.filename}: {reason}"
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, OSError) as exc:
        return f"it is a zip archive that cannot be read ({exc}), so it was not scanned"
    return None


def credential_reason(relpath: str, source: Path) -> str | None:
    """Why ``source`` (shipped as ``relpath``) looks like a credential, or None."""
    reason = reason_from_name(relpath)
    if reason is None and should_scan(relpath):
        with source.open("rb") as stream:
            reason = reason_from_stream(relpath, stream, source.stat().st_size)
    return reason
