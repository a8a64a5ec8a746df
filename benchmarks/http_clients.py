"""Which async HTTP client should drive ``lmi bench``? Streamed requests/s of httpx and aiohttp (each with the
default asyncio loop and with uvloop) against the self-test's trivial endpoint, in another process pinned to its
own CPU. Each client reads the JSON lines of every answer and parses them, as the bench does.

    python benchmarks/http_clients.py [--seconds 3] [--rounds 3] [--concurrency 1,16,64]

Prints one line per (client, loop, concurrency) with the median of the rounds. Machine noise is large on a
shared 2-core box: compare medians from the same run only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

from lmi_tools.bench.selftest import trivial_endpoint

BODY = json.dumps({"inputs": "hello", "stream": True, "parameters": {"max_new_tokens": 4}}).encode()


async def aiohttp_loop(url: str, concurrency: int, seconds: float) -> float:
    import aiohttp

    done = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async def client(deadline: float) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                async with session.post(url, data=BODY, headers={"Content-Type": "application/json"}) as r:
                    async for line in r.content:
                        json.loads(line)
                done += 1

        start = time.perf_counter()
        await asyncio.gather(*(client(start + seconds) for _ in range(concurrency)))
        return done / (time.perf_counter() - start)


async def httpx_loop(url: str, concurrency: int, seconds: float) -> float:
    import httpx

    done = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits) as session:
        async def client(deadline: float) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                async with session.stream("POST", url, content=BODY,
                                          headers={"Content-Type": "application/json"}) as r:
                    async for line in r.aiter_lines():
                        if line:
                            json.loads(line)
                done += 1

        start = time.perf_counter()
        await asyncio.gather(*(client(start + seconds) for _ in range(concurrency)))
        return done / (time.perf_counter() - start)


def run(loop: str, coroutine) -> float:
    if loop == "uvloop":
        import uvloop

        return uvloop.run(coroutine)
    return asyncio.run(coroutine)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", default="1,16,64")
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    clients = {"aiohttp": aiohttp_loop, "httpx": httpx_loop}
    loops = ["asyncio"] + (["uvloop"] if _has("uvloop") else [])
    results: dict[tuple[str, str, int], list[float]] = {}
    with trivial_endpoint(tokens=4) as port:
        url = f"http://127.0.0.1:{port}/predictions/trivial"
        for _ in range(args.rounds):  # interleaved, so slow phases of a busy machine hit every variant
            for name, fn in clients.items():
                for loop in loops:
                    for c in levels:
                        results.setdefault((name, loop, c), []).append(run(loop, fn(url, c, args.seconds)))
    for (name, loop, c), values in results.items():
        print(f"{name:8} {loop:8} C={c:<4} median {statistics.median(values):7,.0f} req/s   "
              f"rounds {', '.join(f'{v:,.0f}' for v in values)}")


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
