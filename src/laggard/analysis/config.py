"""Every setting of one analysis in one typed object, nested by layer: untraced gaps (engine),
warm-up (engine), the diagnosis, and the healthy threshold. ``analyze()``, the CLI, the fleet and the
monitor all take an ``AnalysisConfig``.

A setting given two ways is resolved explicitly, never silently: a keyword of ``analyze()`` wins
over a field the config leaves at its default; two values that disagree (a keyword and a config
field, or ``healthy_threshold`` and ``diagnosis.threshold``) are a ``LaggardError``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from laggard.diagnose.config import HEALTHY_THRESHOLD, DiagnoseConfig
from laggard.engine.gaps import GapConfig
from laggard.engine.warmup import WarmupConfig
from laggard.errors import LaggardError, check_healthy_threshold


@dataclass(kw_only=True, slots=True)
class AnalysisConfig:
    # healthy below this slowdown (no findings); None: ``diagnosis.threshold`` if set, else
    # HEALTHY_THRESHOLD (1.05, see laggard.diagnose.config for why)
    healthy_threshold: float | None = None
    # run the diagnosis after the what-if analysis (off: attributions only, e.g. for sweeps that
    # diagnose themselves)
    diagnose: bool = True
    # leading steps to drop; None: the warm-up steps ``warmup`` detects; 0: keep every step
    skip_steps: int | None = None
    # the model's decoder layers where the trace does not record them (job metadata num_layers or
    # layers_per_stage): a stage-imbalance finding's gain is then that of `laggard partition`'s
    # whole-layer split, beside the continuous bound; None: the trace's metadata, if any
    num_layers: int | None = None
    gaps: GapConfig = field(default_factory=GapConfig)  # when untraced host time becomes host ops
    warmup: WarmupConfig = field(default_factory=WarmupConfig)  # which leading steps are warm-up
    diagnosis: DiagnoseConfig = field(default_factory=DiagnoseConfig)  # every detector threshold

    def __post_init__(self) -> None:
        if self.healthy_threshold is not None:
            check_healthy_threshold(self.healthy_threshold, "AnalysisConfig.healthy_threshold")
        if self.skip_steps is not None and (isinstance(self.skip_steps, bool) or not isinstance(self.skip_steps, int)
                                            or self.skip_steps < 0):
            raise LaggardError(f"skip_steps must be an integer >= 0 (got {self.skip_steps!r})")
        if self.num_layers is not None and (isinstance(self.num_layers, bool) or not isinstance(self.num_layers, int)
                                            or self.num_layers < 1):
            raise LaggardError(f"num_layers must be an integer >= 1 (got {self.num_layers!r})")
        for name, kind in (("gaps", GapConfig), ("warmup", WarmupConfig), ("diagnosis", DiagnoseConfig)):
            if not isinstance(getattr(self, name), kind):
                raise LaggardError(f"AnalysisConfig.{name} must be a {kind.__name__}, "
                                   f"got {type(getattr(self, name)).__name__}")
        self.resolved_diagnosis()  # a threshold given twice fails here, not mid-analysis

    @property
    def threshold(self) -> float:
        """The healthy threshold in force."""
        return self.resolved_diagnosis().healthy_threshold

    def resolved_diagnosis(self) -> DiagnoseConfig:
        """``diagnosis`` with the threshold in force filled in."""
        return self.diagnosis.with_threshold(self.healthy_threshold, "AnalysisConfig.healthy_threshold")


def resolve_config(config: AnalysisConfig | DiagnoseConfig | None = None, **given: Any) -> AnalysisConfig:
    """One ``AnalysisConfig`` from ``analyze()``'s arguments: ``config`` (a ``DiagnoseConfig`` alone is
    taken as ``AnalysisConfig(diagnosis=config)``) and its keywords (None: not given). A keyword fills a
    field the config leaves at its default; a keyword that disagrees with a field the config sets is a
    LaggardError naming both."""
    if config is None:
        config = AnalysisConfig()
    elif isinstance(config, DiagnoseConfig):
        config = AnalysisConfig(diagnosis=config)
    elif not isinstance(config, AnalysisConfig):
        raise LaggardError(f"config must be an AnalysisConfig or a DiagnoseConfig, got {type(config).__name__}")
    defaults = AnalysisConfig()
    names = {f.name for f in fields(AnalysisConfig)}
    changes = {}
    for name, value in given.items():
        if name not in names:
            raise TypeError(f"unknown analysis setting {name!r}")
        if value is None:
            continue
        current = getattr(config, name)
        if current != getattr(defaults, name) and current != value:
            raise LaggardError(f"{name} is given twice: {name}={value!r} and config.{name}={current!r}; give it once")
        changes[name] = value
    return replace(config, **changes) if changes else config


__all__ = ["HEALTHY_THRESHOLD", "AnalysisConfig", "resolve_config"]
