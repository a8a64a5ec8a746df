"""Files that look like credentials, so that ``lmi package`` never ships them inside an artifact.

Two kinds of evidence: the file's name (``.aws/credentials``, ``id_rsa``, ``*.pem``, ``.netrc``, ...)
and its content (a private-key block, an AWS access key id, an AWS secret key assigned to its usual
name, a Hugging Face token, secrets in a ``.env`` file). Weight files are not read: they are large
and binary, and no credential format lives in them. Every other file is read whole, whatever its size, in
overlapping blocks.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import BinaryIO

SSH_KEYS = {"id_rsa", "id_dsa", "id_ecdsa", "id_ed25519"}
CREDENTIAL_FILES = {".netrc", "_netrc", ".git-credentials", ".pgpass", ".pypirc", ".npmrc", ".dockercfg"}
KEY_SUFFIXES = {".pem", ".key", ".p12", ".pfx", ".jks", ".keystore", ".ppk"}
# Not scanned: weights and other large binary formats.
BINARY_SUFFIXES = {".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".onnx", ".neff", ".h5", ".msgpack",
                   ".npz", ".npy", ".model", ".tflite", ".pb", ".ot"}
BLOCK = 4 * 1024**2
#: Carried from one block to the next, longer than any match the rules need to see whole.
OVERLAP = 64 * 1024

CONTENT_RULES = [
    (re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----"), "a private key block"),
    # Assigned to its usual name (aws_secret_access_key, AWS_SECRET_ACCESS_KEY, "SecretAccessKey": ...):
    # a bare 40-character string is too common (git hashes) to mean anything on its own.
    (re.compile(rb"(?i)(?:aws_?)?secret_?access_?key[\"'\s]*[:=]\s*[\"']?[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+])"),
     "an AWS secret access key"),
    (re.compile(rb"(?i)(?:aws_?)?session_?token[\"'\s]*[:=]\s*[\"']?[A-Za-z0-9/+=]{100,}"), "an AWS session token"),
    (re.compile(rb"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])"), "an AWS access key id"),
    (re.compile(rb"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{34,}(?![A-Za-z0-9])"), "a Hugging Face token"),
]
# Assignments in .env files whose names say they hold a secret.
ENV_SECRET = re.compile(rb"(?m)^\s*(?:export\s+)?(?:[A-Z0-9]+_)*(?:SECRET|PASSWORD|PASSWD|TOKEN|API_KEY|ACCESS_KEY"
                        rb"|PRIVATE_KEY)(?:_[A-Z0-9]+)*\s*=\s*[\"']?[^\s\"'#]+")


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


def reason_from_content(relpath: str, data: bytes) -> str | None:
    for pattern, what in CONTENT_RULES:
        if pattern.search(data):
            return f"it contains {what}"
    if is_env_file(PurePosixPath(relpath).name) and ENV_SECRET.search(data):
        return "it is an environment file that sets a secret"
    return None


def should_scan(relpath: str) -> bool:
    return PurePosixPath(relpath).suffix.lower() not in BINARY_SUFFIXES


def reason_from_stream(relpath: str, stream: BinaryIO) -> str | None:
    """``reason_from_content`` over a file of any size, read in overlapping blocks."""
    tail = b""
    while True:
        block = stream.read(BLOCK)
        if not block:
            return None
        reason = reason_from_content(relpath, tail + block)
        if reason:
            return reason
        tail = (tail + block)[-OVERLAP:]


def credential_reason(relpath: str, source: Path) -> str | None:
    """Why ``source`` (shipped as ``relpath``) looks like a credential, or None."""
    reason = reason_from_name(relpath)
    if reason is None and should_scan(relpath):
        with source.open("rb") as stream:
            reason = reason_from_stream(relpath, stream)
    return reason
