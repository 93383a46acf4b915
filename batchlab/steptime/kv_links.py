"""The links a disaggregated deployment's KV crosses, from a prefill worker to a decode worker.

``KVLink.transfer_time(bytes)``: a fixed per-transfer latency plus the bytes over the link's
nominal one-direction bandwidth. The cluster simulator (``batchlab.cluster.disaggregated``) and a
simulated decode server (``batchlab.serve.kv_transfer``) price a hand-off with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchlab.checks import check_number, fail


@dataclass(frozen=True)
class KVLink:
    """A link the KV crosses: ``bandwidth`` in bytes/s (one direction), ``latency_s`` per
    transfer."""

    name: str
    bandwidth: float
    latency_s: float
    source: str

    def __post_init__(self) -> None:
        check_number("bandwidth", self.bandwidth, strict=True, hint="bytes per second")
        check_number("latency_s", self.latency_s, hint="seconds per transfer")

    def transfer_time(self, num_bytes: float) -> float:
        return self.latency_s + num_bytes / self.bandwidth


# Nominal per-direction bandwidths from the standards and datasheets named. The latency (20 us)
# is an assumed per-transfer software cost of an RDMA transfer library (NIXL, UCX, Mooncake's
# transfer engine), not a measured figure: at these sizes (megabytes) bandwidth dominates.
_LATENCY = 20e-6
KV_LINKS: dict[str, KVLink] = {link.name: link for link in (
    KVLink("nvlink4", 450e9, _LATENCY,
           "NVIDIA H100 SXM datasheet: NVLink 900 GB/s, both directions together"),
    KVLink("pcie5-x16", 63e9, _LATENCY, "PCI-SIG PCIe 5.0: 32 GT/s x 16 lanes, 128b/130b coding"),
    KVLink("infiniband-ndr", 50e9, _LATENCY,
           "InfiniBand NDR (NVIDIA ConnectX-7): 400 Gb/s per port"),
    KVLink("ethernet-100g", 12.5e9, _LATENCY, "IEEE 802.3 100 Gb/s Ethernet"),
    KVLink("ethernet-25g", 3.125e9, _LATENCY, "IEEE 802.3 25 Gb/s Ethernet"),
)}


def kv_link(link: str | KVLink) -> KVLink:
    """A ``KVLink``, or one of ``KV_LINKS`` by name."""
    if isinstance(link, KVLink):
        return link
    if link not in KV_LINKS:
        fail("link", link, f"one of {list(KV_LINKS)} or a KVLink")
    return KV_LINKS[link]


__all__ = ["KV_LINKS", "KVLink", "kv_link"]
