"""Files that look like credentials, so that ``lmi package`` never ships them inside an artifact.

Two kinds of evidence: the file's name (``.aws/credentials``, ``id_rsa``, ``*.pem``, ``.netrc``, ...) and its
content. The token formats are detect-secrets' own rules (Yelp's scanner: GitHub, GitLab, AWS, Slack, Stripe,
OpenAI, PyPI, npm, SendGrid, Square, Azure storage keys, Discord bots, private keys, passwords in URLs), and ours
cover what it does not know: Hugging Face tokens, AWS secret keys and session tokens assigned to their names, and
``NAME_PASSWORD=value`` lines. Its rules that fire on ordinary model files are left out: high-entropy strings
(weights and tokenizers are full of them), JSON web tokens, public IP addresses, the loosest vendor formats
(Twilio, Mailchimp, Telegram, Artifactory, IBM, SoftLayer, Cloudant), and its keyword rule, which reads line by line
(slow on a tokenizer's JSON) and flags ``api_key="unused"`` in client code.

Every file is read whole, in overlapping blocks, except weights in formats that hold no text (``.safetensors``,
``.gguf``, ...; a ``.bin`` when it is in one of torch's formats or over 256 MiB). In binary data only the stretches
of text are searched. A gzip-compressed file is scanned as what it expands to, unless it expands as a compression
bomb does (more than ``MAX_EXPANSION`` times its size): that is reported instead.
"""

from __future__ import annotations

import re
import zlib
from functools import lru_cache
from itertools import chain
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Iterator

SSH_KEYS = {"id_rsa", "id_dsa", "id_ecdsa", "id_ed25519"}
CREDENTIAL_FILES = {".netrc", "_netrc", ".git-credentials", ".pgpass", ".pypirc", ".npmrc", ".dockercfg"}
KEY_SUFFIXES = {".pem", ".key", ".p12", ".pfx", ".jks", ".keystore", ".ppk"}
# Not scanned: weights and other large binary formats that hold no text.
BINARY_SUFFIXES = {".safetensors", ".pt", ".pth", ".ckpt", ".gguf", ".onnx", ".neff", ".h5", ".msgpack",
                   ".npz", ".npy", ".model", ".tflite", ".pb", ".ot"}
#: The first bytes of torch.save's files (a zip archive, or a pickle before torch 1.6): such a ``.bin`` is weights,
#: and so is one larger than WEIGHTS_BIN_BYTES (raw tensors, compiled graphs); smaller ones are read.
TORCH_MAGIC = (b"PK\x03\x04", b"\x80")
WEIGHTS_BIN_BYTES = 256 * 1024**2
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


def reason_from_content(relpath: str, data: bytes) -> str | None:
    data = text_of(data)
    for pattern, what in token_rules():
        if pattern.search(data):
            return f"it contains {what}"
    if is_env_file(PurePosixPath(relpath).name) and ENV_SECRET.search(data):
        return "it is an environment file that sets a secret"
    for match in ASSIGNED_SECRET.finditer(data):
        line_start = data.rfind(b"\n", 0, match.start()) + 1
        if ASSIGNED_NAME.fullmatch(data, line_start, match.start()):
            return "it assigns a password or secret (NAME_PASSWORD=value)"
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


def reason_from_stream(relpath: str, stream: BinaryIO, size: int = 0) -> str | None:
    """``reason_from_content`` over a file of any size, read in overlapping blocks; a gzip file is read expanded.
    ``size`` is the file's, where known: a ``.bin`` that large is weights."""
    is_bin = PurePosixPath(relpath).suffix.lower() == ".bin"
    if is_bin and size > WEIGHTS_BIN_BYTES:
        return None
    first = stream.read(BLOCK)
    if is_bin and first.startswith(TORCH_MAGIC):
        return None
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


def credential_reason(relpath: str, source: Path) -> str | None:
    """Why ``source`` (shipped as ``relpath``) looks like a credential, or None."""
    reason = reason_from_name(relpath)
    if reason is None and should_scan(relpath):
        with source.open("rb") as stream:
            reason = reason_from_stream(relpath, stream, source.stat().st_size)
    return reason
