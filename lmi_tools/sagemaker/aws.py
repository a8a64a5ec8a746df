"""boto3 sessions and clients for the SageMaker tooling, and the one place where AWS failures become ``AwsError``.

Every library function that talks to AWS wraps its calls in ``aws_errors("what it was doing")``, so the CLI
shows one line (what failed, AWS's code) plus a hint (what to do), never a traceback. Messages are scrubbed
of the secret key and session token, and nothing here ever formats credentials or request parameters.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Iterator

import boto3
from boto3.exceptions import S3UploadFailedError
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import (BotoCoreError, ClientError, ConnectionClosedError, EndpointConnectionError,
                                 NoCredentialsError, NoRegionError, ParamValidationError, PartialCredentialsError,
                                 ProfileNotFound, ReadTimeoutError)

from ..errors import AwsError, ModelFailed, UsageError

SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")

CREDENTIALS_HINT = ("configure credentials (aws configure, aws sso login, AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY); the --dry-run of deploy, delete and optimize start "
                    "needs none")

# AWS error codes grouped by what the user can do about them: kind -> (codes, hint).
KINDS: dict[str, tuple[frozenset[str], str]] = {
    "access-denied": (frozenset({"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "Forbidden",
                                 "403", "AuthorizationError"}),
                      "the identity in use lacks a permission: see 'Permissions' in docs/sagemaker.md "
                      "(sagemaker:*, s3:*, and iam:PassRole on the execution role)"),
    "credentials": (frozenset({"InvalidClientTokenId", "UnrecognizedClientException", "SignatureDoesNotMatch",
                               "InvalidAccessKeyId", "ExpiredToken", "ExpiredTokenException", "RequestExpired",
                               "InvalidToken", "IncompleteSignature"}),
                    "AWS rejected the credentials (wrong, expired, or for another account or partition): "
                    + CREDENTIALS_HINT),
    "quota": (frozenset({"ResourceLimitExceeded", "LimitExceededException", "ServiceQuotaExceededException"}),
              "a SageMaker quota is used up: ask for more in Service Quotas (Amazon SageMaker, '<instance type> "
              "for endpoint usage'), delete endpoints you no longer need, or pick another instance type or region"),
    "throttled": (frozenset({"ThrottlingException", "Throttling", "TooManyRequestsException", "SlowDown",
                             "RequestLimitExceeded"}),
                  "AWS is throttling requests: wait a little and run the command again"),
    "in-use": (frozenset({"ResourceInUse", "ResourceInUseException", "ConflictException", "BucketAlreadyExists"}),
               "the resource exists or is in use: choose another --name, or remove the old one with lmi delete"),
    "not-found": (frozenset({"ResourceNotFound", "ResourceNotFoundException", "NoSuchBucket", "NoSuchKey",
                             "NoSuchUpload", "NotFound", "404", "NoSuchEntity"}),
                  "check the name and the region (--region, AWS_DEFAULT_REGION)"),
    "validation": (frozenset({"ValidationException", "ValidationError", "InvalidParameterValue",
                              "InvalidParameterException", "InvalidArgument", "InvalidRequest", "InvalidBucketName",
                              "MalformedPolicyDocument"}),
                   "AWS rejected a value in the request: the message says which"),
    "not-ready": (frozenset({"ModelNotReadyException", "ServiceUnavailable", "ServiceUnavailableException"}),
                  "the endpoint cannot take requests yet: wait until lmi deploy reports InService, then retry"),
}
# SageMaker reports missing and duplicate resources as ValidationException; the message tells them apart.
NOT_FOUND_TEXT = re.compile(r"could not find|does not exist|not found", re.IGNORECASE)
EXISTS_TEXT = re.compile(r"already exist", re.IGNORECASE)
UPLOAD_FAILURE = re.compile(r"An error occurred \(([\w.-]+)\) when calling the \w+ operation: (.*)", re.DOTALL)


def session(region: str | None = None, profile: str | None = None) -> boto3.Session:
    """A boto3 session; reads configuration only (no AWS call, no credential lookup yet)."""
    try:
        return boto3.Session(region_name=region, profile_name=profile)
    except ProfileNotFound:
        raise UsageError(f"AWS profile {profile!r} is not configured",
                         hint="list profiles with 'aws configure list-profiles', or drop --profile") from None


def region_of(sess: boto3.Session) -> str:
    if not sess.region_name:
        raise UsageError("no AWS region is configured", hint="pass --region, or set AWS_DEFAULT_REGION")
    return sess.region_name


def client(sess: boto3.Session, service: str, endpoint_url: str | None = None, read_timeout: int | None = None,
           max_attempts: int | None = None, region: str | None = None, unsigned: bool = False):
    """A boto3 client; ``endpoint_url`` (else AWS_ENDPOINT_URL[_<SERVICE>]) points it at moto or ``lmi serve``;
    ``unsigned`` sends requests without a signature (only ``lmi serve`` accepts those)."""
    options: dict = {}
    if read_timeout is not None:
        options["read_timeout"] = read_timeout
    if max_attempts is not None:
        options["retries"] = {"max_attempts": max_attempts, "mode": "standard"}
    if unsigned:
        options["signature_version"] = UNSIGNED
    with aws_errors(f"creating the {service} client"):
        return sess.client(service, region_name=region or region_of(sess), endpoint_url=endpoint_url or None,
                           config=Config(**options) if options else None)


def has_credentials(sess: boto3.Session) -> bool:
    """Whether boto3 finds credentials (environment, profile, SSO, instance role); their values stay unread."""
    with aws_errors("looking up AWS credentials"):
        return sess.get_credentials() is not None


def scrub(text: str) -> str:
    """``text`` without the secret key or session token of this process's environment."""
    for name in SECRET_ENV:
        secret = os.environ.get(name)
        if secret and len(secret) >= 4:
            text = text.replace(secret, "****")
    return text


def kind_of(code: str, message: str = "") -> str:
    if code in KINDS["validation"][0]:
        if NOT_FOUND_TEXT.search(message):
            return "not-found"
        if EXISTS_TEXT.search(message):
            return "in-use"
    return next((kind for kind, (codes, _) in KINDS.items() if code in codes), "aws")


def from_client_error(exc: ClientError, action: str) -> AwsError | ModelFailed:
    error = exc.response.get("Error", {})
    code = str(error.get("Code") or exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "unknown"))
    message = scrub(str(error.get("Message") or exc))
    if code == "ModelError":
        return model_error(exc.response, message)
    if code in ("ModelStreamError", "InternalStreamFailure"):
        return ModelFailed(f"the model failed in the middle of the stream: {message} ({code})",
                           hint=STREAM_HINTS[code])
    return aws_error(code, message, action)


def aws_error(code: str, message: str, action: str) -> AwsError:
    kind = kind_of(code, message)
    hint = KINDS[kind][1] if kind in KINDS else None
    return AwsError(f"{action} failed: {message} ({code})", hint=hint, code=code, kind=kind)


STREAM_HINTS = {
    "ModelStreamError": "the text received before the failure was kept; the container's log says why (CloudWatch "
                        "/aws/sagemaker/Endpoints/<endpoint>, or the lmi serve log)",
    "InternalStreamFailure": "a fault on SageMaker's side: run the request again",
}


def model_error(response: dict, message: str) -> ModelFailed:
    status = response.get("OriginalStatusCode")
    original = scrub(str(response.get("OriginalMessage") or message))
    log = response.get("LogStreamArn")
    hint = f"the container's log: {log}" if log else "the container's log says more"
    return ModelFailed(f"the model answered {status or 'with an error'}: {original}", hint=hint)


@contextlib.contextmanager
def aws_errors(action: str) -> Iterator[None]:
    """Turn boto3/botocore failures inside the block into ``AwsError`` / ``ModelFailed`` / ``UsageError``."""
    try:
        yield
    except ClientError as exc:
        raise from_client_error(exc, action) from None
    except S3UploadFailedError as exc:
        match = UPLOAD_FAILURE.search(str(exc))
        code, message = (match.group(1), match.group(2)) if match else ("S3UploadFailed", str(exc))
        raise aws_error(code, scrub(message), action) from None
    except (NoCredentialsError, PartialCredentialsError):
        raise AwsError(f"{action} failed: no AWS credentials were found", hint=CREDENTIALS_HINT,
                       code="NoCredentials", kind="credentials") from None
    except NoRegionError:
        raise UsageError("no AWS region is configured", hint="pass --region, or set AWS_DEFAULT_REGION") from None
    except EndpointConnectionError as exc:
        raise AwsError(f"{action} failed: could not connect to {exc.kwargs.get('endpoint_url', 'AWS')}",
                       hint="check the network, --endpoint-url / AWS_ENDPOINT_URL and --region",
                       code="EndpointConnectionError", kind="connection") from None
    except (ReadTimeoutError, ConnectionClosedError) as exc:
        raise AwsError(f"{action} failed: {scrub(str(exc))}",
                       hint="SageMaker real-time requests must finish within 60 s: ask for fewer tokens, or use "
                            "--stream", code=type(exc).__name__, kind="connection") from None
    except ParamValidationError as exc:
        raise AwsError(f"{action} failed: {scrub(str(exc))}", hint=KINDS["validation"][1],
                       code="ParamValidationError", kind="validation") from None
    except BotoCoreError as exc:
        raise AwsError(f"{action} failed: {scrub(str(exc))}", code=type(exc).__name__) from None
