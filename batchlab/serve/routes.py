"""The routes, as vLLM's OpenAI server names them (the list: ``app.py``). Each handler finds the
server's ``EngineRunner`` on the app (``app.state.runner``) and never touches the engine."""

from __future__ import annotations

import json
import logging
import time

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

import batchlab
from batchlab.serve.kv_connector import Export, Received
from batchlab.serve.kv_transfer import META_HEADER, TransferAsk
from batchlab.serve.metrics import CONTENT_TYPE
from batchlab.serve.parsing import parse_detokenize, parse_generation, parse_tokenize
from batchlab.serve.protocol import APIError, GenerationRequest, parse_json
from batchlab.serve.responses import error_response
from batchlab.serve.runner import EngineRunner
from batchlab.serve.streaming import stream_events, whole_response

LOG = logging.getLogger("batchlab.serve")
MAX_REQUEST_ID_CHARS = 256
router = APIRouter()


def runner_of(request: Request) -> EngineRunner:
    return request.app.state.runner


@router.get("/health")
async def health(request: Request):
    runner = runner_of(request)
    if runner.healthy:
        return Response(status_code=200)
    return error_response(APIError(503, runner.error or "the engine is not running", None,
                                   "service_unavailable"))


@router.api_route("/ping", methods=["GET", "POST"])
async def ping(request: Request):
    # vLLM's /ping (the SageMaker route) answers as /health does
    return await health(request)


@router.get("/version")
async def version():
    return {"version": batchlab.__version__}


@router.get("/load")
async def load(request: Request):
    # vLLM's name: requests in flight
    return {"server_load": runner_of(request).stats()["in_flight"]}


def _permission(created: int) -> dict:
    """vLLM's ``ModelPermission`` card (clients that read ``permission`` find its fields)."""
    return {"id": f"modelperm-{created}", "object": "model_permission", "created": created,
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
            "organization": "*", "group": None, "is_blocking": False}


@router.get("/v1/models")
async def models(request: Request):
    runner = runner_of(request)
    created = int(runner.started_unix)
    return {"object": "list", "data": [{
        "id": runner.config.model_name, "object": "model", "created": created,
        "owned_by": "batchlab", "root": runner.model_root, "parent": None,
        "max_model_len": runner.config.engine.max_model_len, "permission": [_permission(created)],
        "simulated_device": None if runner.device is None else runner.device.card()}]}


@router.get("/metrics")
async def prometheus_metrics(request: Request):
    return Response(runner_of(request).metrics.exposition(), media_type=CONTENT_TYPE)


@router.post("/tokenize")
async def tokenize(request: Request):
    runner = runner_of(request)
    ids, with_strs = parse_tokenize(parse_json(await request.body()),
                                    served_model=runner.config.model_name,
                                    tokenizer=runner.tokenizer, root=runner.model_root)
    out = {"count": len(ids), "max_model_len": runner.config.engine.max_model_len, "tokens": ids,
           "token_strs": None}
    if with_strs:
        out["token_strs"] = runner.tokenizer.convert_ids_to_tokens(ids)
    return out


@router.post("/detokenize")
async def detokenize(request: Request):
    runner = runner_of(request)
    ids = parse_detokenize(parse_json(await request.body()), served_model=runner.config.model_name,
                           tokenizer=runner.tokenizer, root=runner.model_root)
    return {"prompt": runner.tokenizer.decode(ids)}


@router.get("/get_load")
async def get_load(request: Request):
    # vllm-router reads the integer "load" of each worker under its power_of_two policy only,
    # every --worker-startup-check-interval (30 s by default); the other fields are SGLang's names.
    stats = runner_of(request).stats()
    return {"load": stats["in_flight"], "num_reqs": stats["in_flight"] - stats["waiting"],
            "num_waiting_reqs": stats["waiting"], "num_tokens": stats["kv_used_tokens"]}


@router.get("/batchlab/stats")
async def stats(request: Request):
    return runner_of(request).stats()


@router.get("/batchlab/kv/{request_id}")
async def kv_export(request_id: str, request: Request):
    # disaggregated serving: a decode worker pulls a finished prefill's KV (read once)
    runner = runner_of(request)
    export = None if runner.connector is None else runner.connector.exports.take(request_id)
    if not isinstance(export, Export):
        raise APIError(404,
                       export or "this server keeps no KV for others (no --kv-transfer-config)",
                       None, "not_found_error")
    return Response(export.data, media_type="application/octet-stream",
                    headers={META_HEADER: json.dumps(export.meta)})


@router.post("/v1/completions")
async def completions(request: Request):
    return await generate(request, "completion")


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    return await generate(request, "chat")


async def generate(request: Request, kind: str):
    """A completion or chat request: parsed, handed to the engine, answered as a stream or whole."""
    received = time.time()
    runner = runner_of(request)
    x_request_id = client_request_id(request)
    body = parse_json(await request.body())
    gen = parse_generation(body, kind, served_model=runner.config.model_name,
                           tokenizer=runner.tokenizer,
                           max_model_len=runner.config.engine.max_model_len, root=runner.model_root)
    transfer, kv = await _hand_off(runner, gen)
    handle = runner.submit(gen, received, x_request_id, transfer, kv)
    if gen.stream:
        return StreamingResponse(stream_events(runner, handle), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return await whole_response(runner, handle, request)


def client_request_id(request: Request) -> str | None:
    """The ``X-Request-Id`` header, checked (printable, at most 256 characters)."""
    value = request.headers.get("x-request-id")
    if value is None:
        return None
    if not value or len(value) > MAX_REQUEST_ID_CHARS or not value.isprintable():
        raise APIError(400, f"X-Request-Id={value[:60]!r}; must be 1 to "
                            f"{MAX_REQUEST_ID_CHARS} printable characters", "X-Request-Id")
    return value


async def _hand_off(runner: EngineRunner,
                    gen: GenerationRequest) -> tuple[TransferAsk | None, Received | None]:
    """Disaggregated serving (``kv_transfer.py``): the part this request asks this server to play,
    and for the decode part the KV pulled from the prefill worker before the request is admitted."""
    if gen.kv_transfer_params is None:
        return None, None
    if runner.connector is None:
        LOG.warning("kv_transfer_params ignored: this server has no --kv-transfer-config, so it "
                    "computes the whole prompt and keeps no KV for others")
        return None, None
    transfer = runner.connector.ask(gen.kv_transfer_params, gen.stream)
    if transfer is None or transfer.part == "prefill":
        return transfer, None
    return transfer, await runner.connector.receive(transfer, gen.prompt_ids)


__all__ = ["router"]
