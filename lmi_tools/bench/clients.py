"""Executors: send one request, time every token, return its ``RequestRecord``.

* ``HttpClient``: aiohttp on the asyncio loop, chosen by measurement (benchmarks/http_clients.py; the figures are
  in docs/benchmarking.md): it sustained many times the streamed requests/s of httpx's async client against a
  trivial endpoint; uvloop made no consistent difference.
* ``SageMakerClient``: boto3's ``invoke_endpoint_with_response_stream`` (or ``invoke_endpoint``), one thread per
  concurrent client (boto3 is synchronous), so SigV4 signing, retries and event-stream parsing are the SDK's.

Times are ``time.perf_counter() - origin``; ``origin`` is set by the load generator for each phase.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping
from urllib.parse import urlsplit

from ..answers.messages import Api
from ..answers.reader import AnswerReader, payload_parts
from .records import RequestRecord, complete
from .targets import BenchTarget

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _closed(record: RequestRecord, reader: AnswerReader | None, end: float) -> RequestRecord:
    """The record once its answer (if any) is read; a request that never got one keeps only its end time."""
    if reader is None:
        record.end = end
        return record
    return complete(record, reader.finish(end), end)


class HttpClient:
    """Posts JSON bodies with one aiohttp session; keeps up to ``concurrency`` connections alive."""

    def __init__(self, target: BenchTarget, concurrency: int, request_timeout: float,
                 headers: Mapping[str, str] | None = None):
        self.target, self.concurrency, self.request_timeout = target, concurrency, request_timeout
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.origin = time.perf_counter()
        self._session: Any = None

    async def __aenter__(self) -> "HttpClient":
        import aiohttp

        self._aiohttp = aiohttp
        connector = aiohttp.TCPConnector(limit=self.concurrency, limit_per_host=self.concurrency)
        self._session = aiohttp.ClientSession(connector=connector, headers=self.headers,
                                              timeout=aiohttp.ClientTimeout(total=self.request_timeout))
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._session.close()

    async def send(self, index: int, body: bytes) -> RequestRecord:
        clock, origin = time.perf_counter, self.origin
        record = RequestRecord(index=index, send=clock() - origin)
        reader = None
        try:
            async with self._session.post(self.target.url, data=body) as response:
                record.status = response.status
                reader = AnswerReader(self.target.api, response.headers.get("Content-Type"), response.status)
                async for chunk in response.content.iter_any():
                    reader.feed(chunk, clock() - origin)
        except asyncio.TimeoutError:
            record.error = f"no complete answer within --request-timeout {self.request_timeout:g}s"
        except self._aiohttp.ClientError as exc:
            record.error = _describe(exc)
        return _closed(record, reader, clock() - origin)


class SageMakerClient:
    """boto3 ``sagemaker-runtime`` calls on a pool of ``concurrency`` threads."""

    def __init__(self, target: BenchTarget, concurrency: int, request_timeout: float):
        import boto3
        from botocore.config import Config

        self.target, self.request_timeout = target, request_timeout
        session = boto3.session.Session()
        credentials = {}
        host = urlsplit(target.endpoint_url or "").hostname
        if host in LOCAL_HOSTS and session.get_credentials() is None:
            credentials = {"aws_access_key_id": "local", "aws_secret_access_key": "local"}  # lmi serve ignores them
        config = Config(max_pool_connections=concurrency, retries={"total_max_attempts": 1},
                        connect_timeout=min(request_timeout, 60), read_timeout=request_timeout)
        self.client = session.client("sagemaker-runtime", region_name=target.region, endpoint_url=target.endpoint_url,
                                     config=config, **credentials)
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="lmi-bench")
        self.origin = time.perf_counter()

    async def __aenter__(self) -> "SageMakerClient":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    async def send(self, index: int, body: bytes) -> RequestRecord:
        return await asyncio.get_running_loop().run_in_executor(self.pool, self._invoke, index, body)

    def _invoke(self, index: int, body: bytes) -> RequestRecord:
        from botocore.exceptions import BotoCoreError, ClientError

        clock, origin = time.perf_counter, self.origin
        record = RequestRecord(index=index, send=clock() - origin)
        reader = None
        try:
            reader = self._call(body, record, clock, origin)
        except ClientError as exc:  # ModelError before the stream; EventStreamError (ModelStreamError) inside it
            error = exc.response.get("Error", {})
            status = exc.response.get("OriginalStatusCode") or exc.response.get("ResponseMetadata", {}).get(
                "HTTPStatusCode")
            record.status = record.status or status
            record.error = f"{error.get('Code', 'ClientError')}: {error.get('Message', exc)}"[:300]
        except BotoCoreError as exc:
            record.error = _describe(exc)
        return _closed(record, reader, clock() - origin)

    def _call(self, body: bytes, record: RequestRecord, clock, origin: float) -> AnswerReader:
        args = {"EndpointName": self.target.endpoint_name, "Body": body, "ContentType": "application/json"}
        if not self.target.stream:
            response = self.client.invoke_endpoint(**args)
            record.status = 200
            reader = AnswerReader(Api.SAGEMAKER, response.get("ContentType"), 200)
            reader.feed(response["Body"].read(), clock() - origin)
            return reader
        response = self.client.invoke_endpoint_with_response_stream(**args)
        record.status = 200
        reader = AnswerReader(Api.SAGEMAKER, response.get("ContentType"), 200)
        for part in payload_parts(response["Body"]):
            reader.feed(part, clock() - origin)
        return reader
