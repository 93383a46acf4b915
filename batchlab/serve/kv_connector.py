"""The KV hand-off's moving parts (what the hand-off is: ``kv_transfer.py``): the prefill side's
exports, kept until read or their lease ends; the KV as bytes on the wire; the decode side's pull
and the checks that the KV fits; and ``KVConnector``, what a server holds of all this."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from batchlab.loadgen.client import KEEPALIVE_S
from batchlab.serve.kv_transfer import (META_HEADER, REMEMBER_GONE, KVTransferConfig, TransferAsk,
                                        parse_transfer_params, simulated_transfer_s)
from batchlab.serve.protocol import APIError

LOG = logging.getLogger("batchlab.serve")


def prompt_hash(prompt_ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(prompt_ids).encode()).hexdigest()[:32]


# --- the prefill side: exports kept until read ---------------------------------------------------
@dataclass
class Export:
    """One finished prefill's KV, waiting for its decode worker: ``meta`` (shape, dtype, prompt,
    block size, bytes) and ``data`` (the raw bytes; empty from a simulated server)."""

    meta: dict
    data: bytes
    expires: float


class KVExports:
    """Exports by request id, each kept until it is read or its lease runs out (thread-safe: the
    engine thread puts, HTTP handlers take)."""

    def __init__(self, lease_s: float) -> None:
        self.lease_s = lease_s
        self._items: OrderedDict[str, Export] = OrderedDict()      # in expiry order
        self._gone: OrderedDict[str, str] = OrderedDict()           # id -> why it is no longer here
        self._lock = threading.Lock()
        self.num_expired = 0

    def put(self, request_id: str, meta: dict, data: bytes) -> None:
        with self._lock:
            self._expire(time.monotonic())
            self._items[request_id] = Export(meta, data, time.monotonic() + self.lease_s)

    def take(self, request_id: str) -> Export | str:
        """The export (now freed), or why there is none."""
        with self._lock:
            self._expire(time.monotonic())
            export = self._items.pop(request_id, None)
            if export is None:
                return self._gone.get(request_id,
                                      f"no KV is kept for request {request_id!r} on this server")
            self._forget(request_id,
                         f"the KV of request {request_id!r} was already read (a read frees it)")
            return export

    def meta_of(self, request_id: str) -> dict | None:
        with self._lock:
            export = self._items.get(request_id)
            return None if export is None else export.meta

    @property
    def held_bytes(self) -> int:
        with self._lock:
            return sum(e.meta["bytes"] for e in self._items.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def _expire(self, now: float) -> None:
        while self._items:
            rid, export = next(iter(self._items.items()))
            if export.expires > now:
                return
            del self._items[rid]
            self.num_expired += 1
            self._forget(rid, f"the KV of request {rid!r} was dropped unread after its lease of "
                              f"{self.lease_s:g} s (kv_lease_duration)")

    def _forget(self, request_id: str, why: str) -> None:
        self._gone[request_id] = why
        while len(self._gone) > REMEMBER_GONE:
            self._gone.popitem(last=False)


def export_meta(req, kv, cache_shape: dict, block_ids: list[int], num_bytes: int) -> dict:
    """What a decode worker needs to know about a prefill's KV (the ``X-Batchlab-KV`` header)."""
    return {"request_id": req.request_id, "num_tokens": req.prompt_len,
            "prompt_sha": prompt_hash(req.prompt_ids),
            "shape": None if kv is None else list(kv.shape), "bytes": num_bytes,
            "block_ids": block_ids, **cache_shape}


def to_bytes(kv) -> bytes:
    """A tensor's raw bytes (any dtype, bf16 included)."""
    import torch
    return kv.contiguous().view(torch.uint8).numpy().tobytes()


def from_bytes(data: bytes, meta: dict):
    import torch
    dtype = getattr(torch, meta["dtype"])
    return torch.frombuffer(bytearray(data), dtype=dtype).view(*meta["shape"])


# --- the decode side: pull, check, hand to the engine --------------------------------------------
@dataclass
class Received:
    """What a decode worker got: the KV (a tensor; None from a simulated prefill worker), its
    size, and how long the pull took (the measured loopback time, or the simulated link's)."""

    kv: object
    meta: dict
    transfer_s: float


def why_not_fits(meta: dict, mine: dict, prompt_ids: list[int]) -> str | None:
    """Why the prefill worker's KV cannot serve this request on this server (None: it can)."""
    for key in ("kv_shape", "dtype", "simulated"):
        if meta.get(key) != mine.get(key):
            return (f"the prefill worker's KV has {key}={meta.get(key)!r} and this server's cache "
                    f"{key}={mine.get(key)!r}; both workers must serve the same model in the "
                    "same dtype")
    if (meta.get("prompt_sha") != prompt_hash(prompt_ids)
            or meta.get("num_tokens") != len(prompt_ids)):
        return ("the prefill worker's KV is for another prompt (its tokens differ from this "
                "request's); the decode request must carry the same prompt as the prefill request")
    theirs, ours = meta.get("block_size"), mine.get("block_size")
    if not (isinstance(theirs, int) and theirs > 0 and ours % theirs == 0):
        return (f"block size mismatch: the prefill worker's KV blocks hold {theirs} tokens and "
                f"this worker's {ours}; vLLM's NIXL connector needs the decode worker's block "
                "size to be a multiple of the prefill worker's (its block_size_ratio), so "
                "batchlab refuses the pair too")
    return None


async def pull_kv(ask: TransferAsk, timeout_s: float, client) -> tuple[bytes, dict]:
    """GET the export from the prefill worker: (raw bytes, meta); an APIError saying why not."""
    import httpx
    url = f"{ask.url}/batchlab/kv/{ask.remote_request_id}"
    try:
        response = await asyncio.wait_for(client.get(url), timeout_s)
    except asyncio.TimeoutError:
        raise APIError(504, f"the KV of request {ask.remote_request_id!r} did not arrive from the "
                            f"prefill worker at {ask.url} within kv_fetch_timeout={timeout_s:g} s",
                            "kv_transfer_params",
                       "kv_transfer_error") from None
    except httpx.HTTPError as e:
        raise APIError(502, f"the prefill worker at {ask.url} did not deliver the KV of request "
                            f"{ask.remote_request_id!r} ({type(e).__name__}: "
                            f"{e or 'connection lost'}); it may have died", "kv_transfer_params",
                            "kv_transfer_error") from None
    if response.status_code != 200:
        try:
            why = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            why = response.text[:200]
        raise APIError(502, f"the prefill worker at {ask.url} answered HTTP {response.status_code} "
                            f"for the KV of request {ask.remote_request_id!r}: {why}",
                            "kv_transfer_params", "kv_transfer_error")
    try:
        meta = json.loads(response.headers[META_HEADER])
    except (KeyError, ValueError):
        raise APIError(502, f"the answer from {ask.url} has no valid {META_HEADER} header: it is "
                            "not a batchlab prefill worker's KV", "kv_transfer_params",
                            "kv_transfer_error") from None
    if len(response.content) != (meta["bytes"] if meta.get("shape") else 0):
        raise APIError(502, f"the KV of request {ask.remote_request_id!r} arrived cut short "
                            f"({len(response.content)} of {meta['bytes']} bytes); the prefill "
                            "worker may have died mid-transfer",
                       "kv_transfer_params", "kv_transfer_error")
    return response.content, meta


class KVConnector:
    """One server's side of the hand-off (``EngineRunner`` holds one when it has a
    ``--kv-transfer-config``): what a request asks, the exports it keeps, the pulls it makes.

    ``cache``: this server's KV as a decode worker must match it (``kv_shape``, ``dtype``,
    ``block_size``, ``simulated``) and ``bytes_per_token``.
    """

    def __init__(self, config: KVTransferConfig, cache: dict, bytes_per_token: int) -> None:
        self.config, self.cache, self.bytes_per_token = config, cache, bytes_per_token
        self.exports = KVExports(config.lease_s)
        self._client = None

    def ask(self, params: object, stream: bool) -> TransferAsk | None:
        """What ``params`` (a body's ``kv_transfer_params``) ask of this server; a 400 if it may
        not."""
        ask = parse_transfer_params(params)
        if ask is None:
            return None
        if not self.config.may(ask.part):
            raise APIError(400, f"kv_transfer_params ask this server for the {ask.part} part, "
                                f"and its kv_role is {self.config.kv_role!r}",
                                "kv_transfer_params")
        if ask.part == "prefill" and stream:
            raise APIError(400, "kv_transfer_params.do_remote_decode needs stream=false: the "
                                "prefill part's answer carries the parameters the decode part "
                                "needs", "stream")
        return ask

    def export(self, copy, req) -> None:
        """A prefill finished: keep its KV (``copy``: the engine's ``KVCopy``) until it is read."""
        kv = copy.kv
        num_bytes = (req.prompt_len * self.bytes_per_token if kv is None
                     else kv.numel() * kv.element_size())
        meta = export_meta(req, kv, self.cache, copy.block_ids, num_bytes)
        self.exports.put(req.request_id, meta, b"" if kv is None else to_bytes(kv))

    def params_for_decode(self, request_id: str, host: str, port: int) -> dict:
        """The prefill part's answer: where its KV waits (vLLM's NixlConnector's fields)."""
        meta = self.exports.meta_of(request_id)
        return {"do_remote_prefill": True, "do_remote_decode": False,
                "remote_engine_id": self.config.engine_id, "remote_request_id": request_id,
                "remote_block_ids": meta["block_ids"] if meta else [],
                "remote_host": host, "remote_port": port,
                "remote_num_tokens": meta["num_tokens"] if meta else 0, "tp_size": 1}

    async def receive(self, ask: TransferAsk, prompt_ids: list[int]) -> Received | None:
        """Pull and check the KV for a decode part; None (compute the prompt here) when it fails
        under ``"recompute"``, an APIError saying why under ``"fail"``."""
        import httpx
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=None,
                                             limits=httpx.Limits(keepalive_expiry=KEEPALIVE_S))
        start = time.perf_counter()
        try:
            data, meta = await pull_kv(ask, self.config.fetch_timeout_s, self._client)
            why = why_not_fits(meta, self.cache, prompt_ids)
            if why is not None:
                raise APIError(400, why, "kv_transfer_params", "kv_transfer_error")
        except APIError as e:
            if self.config.kv_load_failure_policy == "fail":
                raise
            LOG.warning("kv_load_failure_policy='recompute': computing the prompt here: %s",
                        e.message)
            return None
        # simulated: the engine holds the blocks for the link's time (KVTransfer.seconds)
        if meta["shape"] is None:
            return Received(None, meta, simulated_transfer_s(self.config.link_name, meta["bytes"]))
        return Received(from_bytes(data, meta), meta, time.perf_counter() - start)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()


__all__ = ["KVConnector", "KVExports", "Received", "export_meta", "from_bytes", "prompt_hash",
           "pull_kv", "to_bytes", "why_not_fits"]
