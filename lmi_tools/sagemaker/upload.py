"""Upload a model artifact to S3: ``model.tar.gz`` as one object, or a directory as one object per file.

A directory becomes an *uncompressed prefix* (SageMaker's ``ModelDataSource`` with ``S3Prefix`` and
``CompressionType: None``): every object under the prefix is copied to ``/opt/ml/model/<key minus prefix>``.
So object keys are the files' relative paths, and no zero-byte "folder" keys (ending in ``/``) are ever
created: SageMaker fails the deployment on those (reference/sagemaker.md §2.1). Objects already under the
prefix that this upload does not overwrite would be deployed too, so they are refused unless ``replace``.
Large files go up in multipart uploads (boto3's transfer manager, ``part_size`` bytes per part).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from boto3.s3.transfer import TransferConfig

from ..errors import UsageError
from .aws import aws_error, aws_errors

MIB = 1024 * 1024
DEFAULT_PART_SIZE = 64 * MIB
MIN_PART_SIZE = 5 * MIB  # S3's smallest multipart part
SKIPPED_DIRS = frozenset({"__pycache__"})

Progress = Callable[[int], None]


@dataclass(frozen=True)
class S3Uri:
    """``s3://bucket/key``; a key that is empty or ends in ``/`` is a prefix."""

    bucket: str
    key: str

    @classmethod
    def parse(cls, uri: str, what: str = "S3 location") -> S3Uri:
        if not uri.startswith("s3://"):
            raise UsageError(f"{what} {uri!r} is not an s3:// URI", hint="write it as s3://bucket/prefix/")
        bucket, _, key = uri[len("s3://"):].partition("/")
        if not bucket:
            raise UsageError(f"{what} {uri!r} has no bucket name", hint="write it as s3://bucket/prefix/")
        return cls(bucket, key)

    @property
    def is_prefix(self) -> bool:
        return self.key == "" or self.key.endswith("/")

    def child(self, relative: str) -> S3Uri:
        return S3Uri(self.bucket, self.key + relative)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


@dataclass(frozen=True)
class UploadPlan:
    """The files to send and their destination keys; ``uri`` is what ``lmi deploy --artifact`` takes."""

    uri: S3Uri
    files: tuple[tuple[Path, S3Uri], ...]
    total_bytes: int

    @property
    def is_prefix(self) -> bool:
        return self.uri.is_prefix


def plan_upload(source: Path, destination: str) -> UploadPlan:
    """What ``upload`` will send: a file to ``destination`` (or ``destination/<name>`` for a prefix), or a
    directory's files to ``destination/<relative path>``."""
    dest = S3Uri.parse(destination, "destination")
    if source.is_file():
        target = dest.child(source.name) if dest.is_prefix else dest
        return UploadPlan(target, ((source, target),), source.stat().st_size)
    if not source.is_dir():
        raise UsageError(f"{source} does not exist", hint="give model.tar.gz or a model directory")
    prefix = dest if dest.is_prefix else S3Uri(dest.bucket, dest.key + "/")
    files = tuple((path, prefix.child(relative)) for path, relative in directory_files(source))
    if not files:
        raise UsageError(f"{source} holds no files", hint="an empty prefix would deploy an empty /opt/ml/model")
    return UploadPlan(prefix, files, sum(path.stat().st_size for path, _ in files))


def directory_files(root: Path) -> Iterator[tuple[Path, str]]:
    """Every file under ``root`` (sorted) with its POSIX relative path; checks the names SageMaker refuses."""
    for current, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in sorted(names):
            path = Path(current, name)
            if not path.is_file():
                continue
            relative = path.relative_to(root).as_posix()
            too_long = next((part for part in relative.split("/") if len(part.encode("utf-8")) > 255), None)
            if too_long:
                raise UsageError(f"{path}: the name {too_long[:40]}... is longer than 255 bytes",
                                 hint="SageMaker cannot copy such a file into /opt/ml/model: rename it")
            yield path, relative


def upload(s3, plan: UploadPlan, progress: Progress | None = None, part_size: int = DEFAULT_PART_SIZE,
           replace: bool = False) -> UploadPlan:
    """Send the plan's files (multipart above ``part_size``); ``progress(n)`` is called as bytes go out."""
    if part_size < MIN_PART_SIZE:
        raise UsageError(f"part size {part_size} bytes is below S3's minimum of {MIN_PART_SIZE} (5 MiB)")
    if plan.is_prefix:
        _check_prefix(s3, plan, replace)
    config = TransferConfig(multipart_threshold=part_size, multipart_chunksize=part_size)
    for path, target in plan.files:
        with aws_errors(f"uploading {path} to {target}"):
            s3.upload_file(str(path), target.bucket, target.key, Config=config, Callback=progress)
    return plan


def _check_prefix(s3, plan: UploadPlan, replace: bool) -> None:
    new_keys = {target.key for _, target in plan.files}
    stale = [key for key in list_keys(s3, plan.uri) if key not in new_keys]
    if stale and not replace:
        raise UsageError(f"{plan.uri} already holds {len(stale)} object(s) this upload would not overwrite "
                         f"(e.g. {stale[0]}); SageMaker would copy them into /opt/ml/model too",
                         hint="use a new prefix, or --replace to delete the prefix's other objects first")
    delete_keys(s3, plan.uri.bucket, stale)


def list_keys(s3, prefix: S3Uri) -> list[str]:
    """Every key under ``prefix``."""
    keys: list[str] = []
    with aws_errors(f"listing {prefix}"):
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=prefix.bucket, Prefix=prefix.key):
            keys.extend(item["Key"] for item in page.get("Contents", []))
    return keys


def delete_keys(s3, bucket: str, keys: list[str]) -> None:
    """Delete ``keys`` from ``bucket`` in batches of 1000 (DeleteObjects' limit); any per-key error raises."""
    for start in range(0, len(keys), 1000):
        batch = [{"Key": key} for key in keys[start:start + 1000]]
        with aws_errors(f"deleting objects from s3://{bucket}"):
            answer = s3.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
        if answer.get("Errors"):
            first = answer["Errors"][0]
            raise aws_error(str(first.get("Code", "Error")), str(first.get("Message", "")),
                            f"deleting s3://{bucket}/{first['Key']}")
