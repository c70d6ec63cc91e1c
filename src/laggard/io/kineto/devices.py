"""Where a profiled rank ran: its host and GPU, from what the trace file carries.

Kineto writes ``host_name`` at the top level in newer versions (absent in older ones) and
``deviceProperties``: one entry per visible device with its ``id`` (the GPU events' ``pid``),
``name`` and, in some builds, ``uuid`` and a PCI bus id (``pciBusID``/``pci_bus_id``, with
``pciDomainID``/``pciDeviceID`` beside it). A rank's GPU is the device most of its GPU events ran
on. Whatever is missing is left out (``laggard.optable.hosts``); nothing here is an error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from laggard.io.kineto.events import RankEvents


def rank_identity(ev: RankEvents, gpu: np.ndarray) -> dict[str, str]:
    """``{"host", "gpu_uuid", "pci_bus_id", "gpu_name"}`` of the rank, each where the trace has it."""
    out: dict[str, str] = {}
    host = ev.header.get("host_name")
    if isinstance(host, str) and host.strip():
        out["host"] = host.strip()
    props = _device_props(ev, gpu)
    if props:
        name, uuid = props.get("name"), props.get("uuid") or props.get("UUID")
        if isinstance(name, str) and name:
            out["gpu_name"] = name
        if isinstance(uuid, str) and uuid:
            out["gpu_uuid"] = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        bus = _pci_bus_id(props)
        if bus:
            out["pci_bus_id"] = bus
    return out


def _device_props(ev: RankEvents, gpu: np.ndarray) -> dict[str, Any] | None:
    """The ``deviceProperties`` entry of the device most GPU events ran on (their ``pid``)."""
    devices = ev.header.get("deviceProperties")
    if not isinstance(devices, list) or not gpu.any():
        return None
    pids = np.asarray(ev.pid)[gpu]
    labels = [ev.pids[int(c)] for c in np.unique(pids)]
    counts = np.bincount(np.searchsorted(np.unique(pids), pids))
    try:
        dev = int(labels[int(np.argmax(counts))])
    except (TypeError, ValueError):  # a pid that is not a device number
        return None
    return next((d for d in devices if isinstance(d, dict) and d.get("id") == dev), None)


def _pci_bus_id(props: dict[str, Any]) -> str | None:
    bus = props.get("pci_bus_id", props.get("pciBusID", props.get("pciBusId")))
    if isinstance(bus, str) and bus:
        return bus
    if not isinstance(bus, int) or isinstance(bus, bool):
        return None
    domain = props.get("pciDomainID", props.get("pci_domain_id", 0))
    device = props.get("pciDeviceID", props.get("pci_device_id", 0))
    domain = domain if isinstance(domain, int) else 0
    device = device if isinstance(device, int) else 0
    return f"{domain:08X}:{bus:02X}:{device:02X}.0"


__all__ = ["rank_identity"]
