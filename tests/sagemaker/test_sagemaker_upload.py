"""lmi upload against moto's S3: tarballs (multipart), directories as uncompressed prefixes."""

import os

import pytest

from lmi_tools.errors import AwsError, UsageError
from lmi_tools.sagemaker.upload import MIB, MIN_PART_SIZE, S3Uri, list_keys, plan_upload, upload

from .conftest import BUCKET


def keys_and_sizes(s3, prefix=""):
    listing = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return {item["Key"]: item["Size"] for item in listing}


def test_a_tarball_goes_under_the_prefix_in_multipart_with_progress(aws, tmp_path):
    s3, _ = aws
    tarball = tmp_path / "model.tar.gz"
    tarball.write_bytes(os.urandom(11 * MIB))
    sent = []
    plan = upload(s3, plan_upload(tarball, f"s3://{BUCKET}/lmi/"), sent.append, part_size=MIN_PART_SIZE)
    assert str(plan.uri) == f"s3://{BUCKET}/lmi/model.tar.gz" and not plan.is_prefix
    assert keys_and_sizes(s3) == {"lmi/model.tar.gz": 11 * MIB}
    assert s3.head_object(Bucket=BUCKET, Key="lmi/model.tar.gz")["ETag"].endswith('-3"')  # three parts
    assert sum(sent) == 11 * MIB and len(sent) > 1


def test_a_file_can_be_given_its_own_key(aws, tmp_path):
    s3, _ = aws
    (tmp_path / "a.tar.gz").write_bytes(b"x")
    plan = upload(s3, plan_upload(tmp_path / "a.tar.gz", f"s3://{BUCKET}/v1/model.tar.gz"))
    assert str(plan.uri) == f"s3://{BUCKET}/v1/model.tar.gz" and keys_and_sizes(s3) == {"v1/model.tar.gz": 1}


@pytest.fixture
def model_dir(tmp_path):
    root = tmp_path / "model"
    (root / "tokenizer").mkdir(parents=True)
    (root / "empty" / "deeper").mkdir(parents=True)
    (root / "__pycache__").mkdir()
    (root / "serving.properties").write_text("engine=Python\n")
    (root / "model.safetensors").write_bytes(b"\0" * 1000)
    (root / "tokenizer" / "tokenizer.json").write_text("{}")
    (root / "tokenizer" / "empty.txt").write_bytes(b"")
    (root / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"pyc")
    return root


@pytest.mark.parametrize("destination", [f"s3://{BUCKET}/raw/", f"s3://{BUCKET}/raw"])
def test_a_directory_becomes_one_object_per_file_keyed_by_relative_path(aws, model_dir, destination):
    s3, _ = aws
    plan = upload(s3, plan_upload(model_dir, destination))
    assert str(plan.uri) == f"s3://{BUCKET}/raw/" and plan.is_prefix
    assert keys_and_sizes(s3) == {"raw/model.safetensors": 1000, "raw/serving.properties": 14,
                                  "raw/tokenizer/empty.txt": 0, "raw/tokenizer/tokenizer.json": 2}
    assert not [key for key in keys_and_sizes(s3) if key.endswith("/")]  # never a "folder" key
    assert plan.total_bytes == 1016


def test_objects_already_under_the_prefix_are_refused_unless_replaced(aws, model_dir):
    s3, _ = aws
    s3.put_object(Bucket=BUCKET, Key="raw/old-weights.bin", Body=b"old")
    s3.put_object(Bucket=BUCKET, Key="raw/serving.properties", Body=b"old")  # overwritten: not stale
    plan = plan_upload(model_dir, f"s3://{BUCKET}/raw/")
    with pytest.raises(UsageError, match="1 object.*raw/old-weights.bin") as info:
        upload(s3, plan)
    assert "--replace" in info.value.hint
    upload(s3, plan, replace=True)
    assert "raw/old-weights.bin" not in list_keys(s3, S3Uri(BUCKET, "raw/"))
    assert s3.get_object(Bucket=BUCKET, Key="raw/serving.properties")["Body"].read() == b"engine=Python\n"


def test_a_missing_bucket_is_a_not_found_error_with_a_hint(aws, tmp_path):
    s3, _ = aws
    (tmp_path / "model.tar.gz").write_bytes(b"x")
    with pytest.raises(AwsError, match="bucket does not exist") as info:
        upload(s3, plan_upload(tmp_path / "model.tar.gz", "s3://no-such-bucket-here/lmi/"))
    assert info.value.kind == "not-found" and info.value.code == "NoSuchBucket" and info.value.hint


@pytest.mark.parametrize("source, destination, message", [
    ("model.tar.gz", "bucket/prefix/", "not an s3:// URI"),
    ("model.tar.gz", "s3:///prefix/", "no bucket"),
    ("missing", f"s3://{BUCKET}/x/", "does not exist"),
    ("empty-dir", f"s3://{BUCKET}/x/", "holds no files"),
])
def test_bad_sources_and_destinations(tmp_path, source, destination, message):
    (tmp_path / "model.tar.gz").write_bytes(b"x")
    (tmp_path / "empty-dir" / "sub").mkdir(parents=True)
    with pytest.raises(UsageError, match=message):
        plan_upload(tmp_path / source, destination)


def test_parts_below_five_mib_are_refused(aws, tmp_path):
    (tmp_path / "model.tar.gz").write_bytes(b"x")
    with pytest.raises(UsageError, match="5 MiB"):
        upload(aws[0], plan_upload(tmp_path / "model.tar.gz", f"s3://{BUCKET}/x/"), part_size=MIB)
