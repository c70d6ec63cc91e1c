"""PyTorch-profiler (Kineto) traces, one file per rank: ``load`` reads them into the op table
(``identify``: which rank each trace is, and that they are one job; ``table``: the table built).
The files and their decoding in worker processes (``files``), a file read as a stream (``decode``)
into event columns (``events``), collectives and p2p (``comm``), work units and streams
(``segments``), one rank's ops (``rank``; each event's step: ``windows``, over ``labels``),
ProfilerStep alignment (``steps``), collectives matched across ranks and clock offsets (``match``),
send/recv without peer ranks matched across ranks (``p2p``), the parallel layout (``layout``, from
what ``evidence`` gathers) and the ranks without a trace (``missing``)."""

from __future__ import annotations

from laggard.util.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    **dict.fromkeys(("decode_all", "looks_like_kineto", "trace_files"), "laggard.io.kineto.files"),
    "read_kineto": "laggard.io.kineto.load",
})
