"""The full analysis of a job: the what-if analysis (``laggard.whatif.core``) and then its diagnosis
(``laggard.diagnose``). Composed here, one level above both, so the what-if module never imports
the diagnosis; the CLI and ``laggard.analyze`` call this."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from laggard.analysis.config import AnalysisConfig, resolve_config
from laggard.errors import LaggardWarning

if TYPE_CHECKING:
    from collections.abc import Callable

    from laggard.diagnose.config import DiagnoseConfig
    from laggard.engine.gaps import GapConfig
    from laggard.engine.warmup import WarmupConfig
    from laggard.optable.ops import Job
    from laggard.results.analysis import Analysis


def analyze(job: Job, *, config: AnalysisConfig | DiagnoseConfig | None = None, healthy_threshold: float | None = None,
            diagnose: bool | None = None, gaps: GapConfig | None = None, skip_steps: int | None = None,
            warmup: WarmupConfig | None = None, num_layers: int | None = None,
            on_progress: Callable[[int, int, str], None] | None = None) -> Analysis:
    """Slowdown, attributions and (unless ``diagnose=False``) the diagnosis of a job. Warm-up steps
    are skipped first (``skip_steps``: how many leading steps; None: detected, ``laggard.engine.warmup``).

    Settings come in one ``AnalysisConfig`` (``config``; a ``DiagnoseConfig`` is taken as its
    ``diagnosis``); each keyword is the field of the same name (None: not given). A keyword fills a
    field the config leaves at its default; a keyword and a config field that disagree, or a healthy
    threshold set both in ``healthy_threshold`` and in ``DiagnoseConfig.threshold`` to different
    values, raise ``LaggardError`` (laggard.analysis.config). ``num_layers``: the model's decoder layers
    where the trace does not record them (a stage-imbalance finding then shows its whole-layer gain,
    ``laggard.analysis.partition``). ``on_progress(done, total, what)``: the phase under way (the CLI's
    progress bar; nothing is printed here)."""
    from laggard.engine.warmup import skip_warmup
    from laggard.whatif.core import analyze as whatif_analyze

    _release_arrow_pool()
    cfg = resolve_config(config, healthy_threshold=healthy_threshold, diagnose=diagnose, gaps=gaps,
                         skip_steps=skip_steps, warmup=warmup, num_layers=num_layers)
    from laggard.analysis.partition import check_num_layers, fill_partition

    check_num_layers(job, cfg.num_layers)
    phases = 2 if cfg.diagnose else 1
    report = on_progress or (lambda done, total, what: None)
    report(0, phases, "replaying the job (what-if analysis)")
    diagnosis_cfg = cfg.resolved_diagnosis()
    job, skipped = skip_warmup(job, cfg.skip_steps, cfg.warmup)
    note = None
    if skipped:
        how = ("as asked (--skip-steps)" if cfg.skip_steps is not None
               else "detected: they ran well above the settled step time; --skip-steps 0 keeps them")
        note = (f"skipped {len(skipped)} warm-up step(s) "
                f"({', '.join(map(str, skipped[:8]))}{' ...' if len(skipped) > 8 else ''}), {how}")
        warnings.warn(note, LaggardWarning, stacklevel=2)
    res = whatif_analyze(job, gaps=cfg.gaps)
    res.extras["warmup_steps_skipped"] = skipped
    if note is not None and note not in res.warnings:
        res.warnings.append(note)
    if cfg.diagnose:
        from laggard.diagnose.run import diagnose as run_diagnosis

        report(1, phases, "diagnosing (targeted what-ifs)")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", LaggardWarning)
            res.diagnosis = run_diagnosis(res, config=diagnosis_cfg)
            fill_partition(job, res.diagnosis.findings, cfg.num_layers)
        for w in caught:
            if issubclass(w.category, LaggardWarning) and str(w.message) not in res.warnings:
                res.warnings.append(str(w.message))
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    report(phases, phases, "analyzed")
    return res


def _release_arrow_pool() -> None:
    """Hand the pages Arrow's memory pool keeps after reading a trace back to the OS (mimalloc keeps
    freed pages for reuse: 0.6 GB after reading 7.7M ops of Parquet, resident through the analysis'
    peak while the analysis works in numpy). Skipped where pyarrow is not loaded yet."""
    import sys

    pa = sys.modules.get("pyarrow")
    if pa is not None:
        pa.default_memory_pool().release_unused()


__all__ = ["analyze"]
