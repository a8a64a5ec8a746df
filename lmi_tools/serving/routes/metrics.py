"""``GET /metrics``: Prometheus' text format (what is counted: ``serving/metrics.py``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..metrics import CONTENT_TYPE

router = APIRouter(tags=["metrics"])


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.exposition(), media_type=CONTENT_TYPE)
