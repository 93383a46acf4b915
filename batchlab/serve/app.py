"""The HTTP side: a FastAPI app with OpenAI-compatible routes over an ``EngineRunner``.

The rules and their reasons: ``docs/serving-over-http.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import FastAPI, Request

from batchlab.serve.memory import TRIM_INTERVAL_S, release_free_memory
from batchlab.serve.protocol import APIError
from batchlab.serve.responses import error_response
from batchlab.serve.routes import router
from batchlab.serve.runner import EngineRunner

LOG = logging.getLogger("batchlab.serve")


def build_app(runner: EngineRunner, api_key: str | None = None) -> FastAPI:
    """The app; the runner's engine thread starts with the app's lifespan and stops with it."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        loop = asyncio.get_running_loop()
        runner.start(loop)
        trimmer = asyncio.ensure_future(_release_memory_periodically())
        try:
            yield
        finally:
            trimmer.cancel()
            runner.shutdown("server stopped")
            await loop.run_in_executor(None, runner.join)
            if runner.connector is not None:
                await runner.connector.close()

    app = FastAPI(title="batchlab", lifespan=lifespan)
    app.state.runner = runner
    app.add_middleware(ProtocolMiddleware, api_key=api_key)
    app.add_exception_handler(APIError, _api_error)
    app.include_router(router)
    return app


async def _api_error(request: Request, e: APIError):
    # every refused request leaves a line in the log (at the default level, warning)
    LOG.warning("%s %s refused %d: %s", request.method, request.url.path, e.status, e.message)
    return error_response(e)


class ProtocolMiddleware:
    """Plain ASGI (no per-chunk overhead on streams): the API key on ``/v1`` routes, and the
    client's ``X-Request-Id`` echoed in the response headers."""

    def __init__(self, app, api_key: str | None) -> None:
        self.app, self.api_key = app, api_key

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self.api_key is not None and scope["path"].startswith("/v1") \
                and headers.get(b"authorization",
                                b"").decode(errors="replace") != f"Bearer {self.api_key}":
            response = error_response(APIError(401, "a valid API key is required: send the header "
                                            "'Authorization: Bearer <key>'", None,
                                            "authentication_error"))
            return await response(scope, receive, send)
        request_id = headers.get(b"x-request-id")
        if request_id is None:
            return await self.app(scope, receive, send)

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = (list(message.get("headers", []))
                                      + [(b"x-request-id", request_id)])
            await send(message)

        await self.app(scope, receive, send_with_id)


async def _release_memory_periodically() -> None:
    """Hand the allocator's free memory back to the system now and then (see ``memory.py``)."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(TRIM_INTERVAL_S)
        if not await loop.run_in_executor(None, release_free_memory):
            return                               # no glibc here: nothing to trim


__all__ = ["build_app", "ProtocolMiddleware"]
