"""Prefill here, decode there, for real: the KV hand-off between two batchlab servers.

The rules and their reasons: ``docs/replicas-and-router.md``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from batchlab.steptime.kv_links import KV_LINKS, kv_link
from batchlab.checks import check_choice, check_number, fail
from batchlab.serve.protocol import APIError

CONNECTOR = "HTTPKVConnector"
KV_ROLES = ("kv_both", "kv_producer", "kv_consumer")     # vLLM's: both, prefill only, decode only
FAILURE_POLICIES = ("fail", "recompute")                 # vLLM's kv_load_failure_policy
EXTRA_KEYS = ("kv_lease_duration", "kv_fetch_timeout", "link")
META_HEADER = "x-batchlab-kv"
REMEMBER_GONE = 1000                                     # ids of exports that expired or were read


@dataclass(frozen=True)
class KVTransferConfig:
    """``--kv-transfer-config`` as vLLM takes it (JSON), for batchlab's HTTP hand-off.

    ``kv_connector``: ``"HTTPKVConnector"``. ``kv_role``: ``"kv_both"`` (either part, vLLM's
    choice for NIXL), ``"kv_producer"`` (prefill only) or ``"kv_consumer"`` (decode only).
    ``kv_load_failure_policy``: see the module docstring. ``engine_id``: names this server in the
    parameters it returns (default: a fresh uuid). ``kv_connector_extra_config``:
    ``kv_lease_duration`` (seconds an unread export is kept, default 30), ``kv_fetch_timeout``
    (seconds a decode worker waits for the KV, default 30), ``link`` (simulated servers: the
    link whose transfer time a decode worker waits, one of ``KV_LINKS``, default InfiniBand NDR).
    """

    kv_connector: str = CONNECTOR
    kv_role: str = "kv_both"
    kv_load_failure_policy: str = "fail"
    engine_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    kv_connector_extra_config: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kv_connector != CONNECTOR:
            fail("kv_connector", self.kv_connector,
                 f"{CONNECTOR!r} (batchlab's servers speak vLLM's NIXL "
                 "parameters, and move the KV over loopback HTTP)")
        check_choice("kv_role", self.kv_role, KV_ROLES)
        check_choice("kv_load_failure_policy", self.kv_load_failure_policy, FAILURE_POLICIES)
        if not isinstance(self.engine_id, str) or not self.engine_id:
            fail("engine_id", self.engine_id, "a non-empty string")
        extra = self.kv_connector_extra_config
        if not isinstance(extra, dict) or set(extra) - set(EXTRA_KEYS):
            fail("kv_connector_extra_config", extra, f"a dict with keys among {list(EXTRA_KEYS)}")
        check_number("kv_lease_duration", self.lease_s, strict=True, hint="seconds")
        check_number("kv_fetch_timeout", self.fetch_timeout_s, strict=True, hint="seconds")
        kv_link(self.link_name)

    @classmethod
    def parse(cls, text: "str | dict | KVTransferConfig") -> "KVTransferConfig":
        """From the flag's JSON (or a dict); a ValueError naming what is wrong."""
        if isinstance(text, KVTransferConfig):
            return text
        if isinstance(text, str):
            try:
                text = json.loads(text)
            except ValueError as e:
                raise ValueError(f"kv_transfer_config={text!r} is not JSON ({e}); must be like "
                                 f'\'{{"kv_connector": "{CONNECTOR}", '
                                 '"kv_role": "kv_both"}\'') from None
        if not isinstance(text, dict):
            fail("kv_transfer_config", text, "a JSON object")
        unknown = set(text) - {"kv_connector", "kv_role", "kv_load_failure_policy", "engine_id",
                               "kv_connector_extra_config"}
        if unknown:
            raise ValueError(f"kv_transfer_config has {sorted(unknown)}; allowed: "
                             "kv_connector, kv_role, kv_load_failure_policy, engine_id, "
                             "kv_connector_extra_config")
        return cls(**text)

    def to_json(self) -> str:
        return json.dumps({"kv_connector": self.kv_connector, "kv_role": self.kv_role,
                           "kv_load_failure_policy": self.kv_load_failure_policy,
                           "engine_id": self.engine_id,
                           "kv_connector_extra_config": self.kv_connector_extra_config})

    @property
    def lease_s(self) -> float:
        return self.kv_connector_extra_config.get("kv_lease_duration", 30.0)

    @property
    def fetch_timeout_s(self) -> float:
        return self.kv_connector_extra_config.get("kv_fetch_timeout", 30.0)

    @property
    def link_name(self) -> str:
        return self.kv_connector_extra_config.get("link", "infiniband-ndr")

    def may(self, part: str) -> bool:
        """May this server play ``part`` (``"prefill"`` or ``"decode"``)?"""
        return (self.kv_role == "kv_both"
                or self.kv_role == ("kv_producer" if part == "prefill" else "kv_consumer"))


# --- the request's parameters --------------------------------------------------------------------
@dataclass(frozen=True)
class TransferAsk:
    """What a request's ``kv_transfer_params`` ask of this server: ``part`` is ``"prefill"``
    (keep the prompt's KV for a decode worker) or ``"decode"`` (pull it from ``url``)."""

    part: str
    url: str | None = None
    remote_request_id: str | None = None


def parse_transfer_params(params: object) -> TransferAsk | None:
    """The ask in a body's ``kv_transfer_params`` (vLLM's NIXL fields), or None when it asks
    nothing."""
    if params is None:
        return None
    if not isinstance(params, dict):
        raise APIError(400,
                       f"kv_transfer_params={params!r}; must be an object (vLLM's NIXL fields)",
                       "kv_transfer_params")
    decode_there, prefill_there = params.get("do_remote_decode"), params.get("do_remote_prefill")
    for name, value in (("do_remote_decode", decode_there), ("do_remote_prefill", prefill_there)):
        if value not in (None, True, False):
            raise APIError(400, f"kv_transfer_params.{name}={value!r}; must be true or false",
                           "kv_transfer_params")
    if decode_there and prefill_there:
        raise APIError(400, "kv_transfer_params asks for both do_remote_decode and "
                            "do_remote_prefill; a request is either the prefill part or the "
                            "decode part", "kv_transfer_params")
    if decode_there:
        return TransferAsk("prefill")
    if not prefill_there:
        return None
    host, port, rid = (params.get("remote_host"), params.get("remote_port"),
                       params.get("remote_request_id"))
    if not (isinstance(host, str) and host and isinstance(port, int) and not isinstance(port, bool)
            and 0 < port < 65536 and isinstance(rid, str) and rid):
        raise APIError(400, "kv_transfer_params with do_remote_prefill need remote_host "
                            "(a string), remote_port (1-65535) and remote_request_id (a string); "
                            f"got {host!r}, {port!r}, {rid!r}",
                       "kv_transfer_params")
    return TransferAsk("decode", f"http://{host}:{port}", rid)


def simulated_transfer_s(link_name: str, num_bytes: int) -> float:
    return KV_LINKS[link_name].transfer_time(num_bytes)


__all__ = ["CONNECTOR", "KVTransferConfig", "TransferAsk", "parse_transfer_params",
           "simulated_transfer_s"]
