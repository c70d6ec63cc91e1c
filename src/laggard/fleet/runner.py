"""A fleet run: discover the jobs, skip those done (``resume``), analyze the rest on an engine in
batches, write each batch's rows as it finishes, merge them into ``fleet.parquet``.

Library code: progress goes to the ``on_progress(done, total)`` callback, nothing is printed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from laggard.fleet.batching import Batcher
from laggard.fleet.config import FleetConfig
from laggard.fleet.discover import discover
from laggard.fleet.engines import InlineEngine, make_engine
from laggard.fleet.writer import RowWriter


@dataclass(kw_only=True, slots=True)
class FleetRun:
    """What a run did (the results themselves are in ``parquet``)."""

    parquet: Path
    num_jobs: int  # jobs found
    num_skipped: int  # already done (resume)
    num_analyzed: int  # rows written by this run
    wall_s: float
    first_row_s: float | None  # seconds from the start of the run to its first row on disk
    engine: str
    workers: int
    status_counts: dict[str, int] = field(default_factory=dict)  # this run's rows by status


def run_fleet(
    paths: Sequence[str | Path],
    out_dir: str | Path,
    *,
    engine: str = "local",
    workers: int | None = None,
    ray_address: str | None = None,
    ray_ship_code: bool = True,
    resume: bool = False,
    config: FleetConfig | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> FleetRun:
    t0 = time.perf_counter()
    cfg = config or FleetConfig()
    out = Path(out_dir)
    writer = RowWriter(out, resume=resume)
    specs = discover(paths, exclude=out)
    done = writer.done_jobs() if resume else set()
    todo = [s for s in specs if s.job not in done]
    num_skipped = len(specs) - len(todo)
    counts: dict[str, int] = {}
    first_row_s = None
    if on_progress is not None:
        on_progress(0, len(todo))
    if todo:
        eng = make_engine(engine, workers=workers, ray_address=ray_address, ray_ship_code=ray_ship_code)
        batcher = Batcher(todo, cfg)
        finished = 0
        try:
            for results in eng.map(batcher, cfg, str(out)):
                batcher.observe(results)
                writer.write(results)
                if first_row_s is None:
                    first_row_s = time.perf_counter() - t0
                for r in results:
                    counts[r.row["status"]] = counts.get(r.row["status"], 0) + 1
                finished += len(results)
                if on_progress is not None:
                    on_progress(finished, len(todo))
        finally:
            eng.close()
        num_workers = eng.workers
        if isinstance(eng, InlineEngine):
            engine = "inline"
    else:
        num_workers = 0
    parquet = writer.finalize()
    return FleetRun(parquet=parquet, num_jobs=len(specs), num_skipped=num_skipped, num_analyzed=writer.num_rows,
                    wall_s=time.perf_counter() - t0, first_row_s=first_row_s, engine=engine, workers=num_workers,
                    status_counts=counts)
