"""The one-stack EC2 chat host: ``deploy/chat-host.yaml`` (shipped in the wheel as ``lmi_tools/deploy``), its
parameters from the command line, the ``aws cloudformation create-stack`` line, and create-stack itself.

The host runs ``lmi serve --one-at-a-time`` inside DJLServing's LMI image with the artifacts ``lmi package``
made and the lmi-handlers wheel, all read from one S3 bucket (the instance role may read that bucket only).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..modeldir.resources import resource_dir

#: The template's InstanceType AllowedValues (tests/tools/test_chat_stack.py keeps the two equal).
INSTANCE_TYPES = ("inf2.xlarge", "inf2.8xlarge", "g5.xlarge", "g5.2xlarge", "g5.4xlarge")
MIN_VOLUME_GIB = 80
NAME = re.compile(r"[A-Za-z0-9_.-]+")
S3_URI = re.compile(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(.+)")


def template_text() -> str:
    return (resource_dir("deploy") / "chat-host.yaml").read_text(encoding="utf-8")


@dataclass(frozen=True)
class ChatStack:
    stack_name: str
    instance: str
    key_name: str
    models: tuple[tuple[str, str], ...]  # (name, s3 URI of model.tar.gz); the first is loaded at start
    wheel: str
    volume_size: int = 120
    vpc_id: str = ""
    subnet_id: str = ""
    allowed_cidr: str = "0.0.0.0/0"
    image: str = ""

    @property
    def bucket(self) -> str:
        return bucket_of(self.wheel, "--wheel")

    def check(self) -> None:
        """A ``UsageError`` naming the option, the value and what is allowed."""
        if self.instance not in INSTANCE_TYPES:
            raise UsageError(f"--instance {self.instance} is not one this stack serves from: expected one of "
                             f"{', '.join(INSTANCE_TYPES)}")
        if self.volume_size < MIN_VOLUME_GIB:
            raise UsageError(f"--volume-size {self.volume_size} is too small: expected at least {MIN_VOLUME_GIB} GiB")
        if not self.models:
            raise UsageError("no model given: pass NAME=s3://bucket/key/model.tar.gz (from lmi package and lmi upload)")
        if not self.wheel.endswith(".whl"):
            raise UsageError(f"--wheel {self.wheel} is not a wheel: expected s3://bucket/key/lmi_handlers-*.whl "
                             "(pip wheel --no-deps . -w dist)")
        if self.vpc_id and not self.subnet_id:
            raise UsageError(f"--vpc-id {self.vpc_id} needs --subnet-id (a public subnet of that VPC)")
        names = [name for name, _ in self.models]
        for name, uri in self.models:
            if not NAME.fullmatch(name):
                raise UsageError(f"model name {name!r} is invalid: use letters, digits, '.', '_' and '-'")
            if bucket_of(uri, name) != self.bucket:
                raise UsageError(f"{uri} is not in the wheel's bucket {self.bucket}: the host may read one bucket; "
                                 "upload the artifacts and the wheel to the same one")
        if len(set(names)) != len(names):
            raise UsageError(f"model names must differ: got {', '.join(names)}")

    def parameters(self) -> list[dict[str, str]]:
        values = {"InstanceType": self.instance, "KeyName": self.key_name, "VolumeSize": str(self.volume_size),
                  "AllowedCidr": self.allowed_cidr, "VpcId": self.vpc_id, "SubnetId": self.subnet_id,
                  "ModelArtifacts": ",".join(f"{n}={u}" for n, u in self.models), "ArtifactBucket": self.bucket,
                  "WheelUri": self.wheel, "ContainerImage": self.image}
        return [{"ParameterKey": k, "ParameterValue": v} for k, v in values.items()]

    def create_stack_line(self, template: Path) -> str:
        # JSON rather than the CLI's shorthand: ModelArtifacts holds commas and '=' signs.
        return shlex.join(["aws", "cloudformation", "create-stack", "--stack-name", self.stack_name,
                           "--template-body", f"file://{template}", "--capabilities", "CAPABILITY_IAM",
                           "--parameters", json.dumps(self.parameters(), separators=(",", ":"))])

    def create(self, cloudformation) -> str:
        """create-stack with a boto3 CloudFormation client; returns the stack id."""
        response = cloudformation.create_stack(StackName=self.stack_name, TemplateBody=template_text(),
                                               Parameters=self.parameters(), Capabilities=["CAPABILITY_IAM"])
        return response["StackId"]


def parse_model(spec: str, bucket: str, prefix: str = "lmi-chat") -> tuple[str, str, Path | None]:
    """``[NAME=]s3://...`` or ``[NAME=]DIR``: the name, the artifact's S3 URI and, for a local model directory, the
    directory (its artifact goes to ``s3://BUCKET/PREFIX/NAME/model.tar.gz`` once packaged and uploaded).
    A bare URI is named after its file, or its folder for ``.../NAME/model.tar.gz``; a directory after itself."""
    name, sep, source = spec.partition("=")
    if not sep or name.startswith("s3:") or "/" in name:
        name, source = "", spec
    if not source.startswith("s3://"):
        directory = Path(source)
        if not directory.is_dir():
            raise UsageError(f"{spec!r} is neither an S3 URI nor a model directory",
                             hint="give NAME=s3://bucket/key/model.tar.gz or NAME=DIR (a directory with "
                                  "serving.properties)")
        name = name or directory.resolve().name
        return name, f"s3://{bucket}/{prefix}/{name}/model.tar.gz", directory
    bucket_of(source, spec)
    if not name:
        parts = [p for p in source.removeprefix("s3://").split("/") if p]
        stem = parts[-1].removesuffix(".tar.gz").removesuffix(".tgz")
        name = parts[-2] if stem == "model" and len(parts) > 2 else stem
    return name, source, None


def prepare_lines(name: str, uri: str, directory: Path) -> list[str]:
    """What puts a local model directory's artifact where the stack reads it."""
    artifact = f"{name}.tar.gz"
    return [shlex.join(["lmi", "package", str(directory), "-o", artifact]), shlex.join(["lmi", "upload", artifact, uri])]


def bucket_of(uri: str, what: str) -> str:
    match = S3_URI.fullmatch(uri)
    if match is None:
        raise UsageError(f"{what}: {uri!r} is not an S3 URI: expected s3://bucket/key")
    return match.group(1)
