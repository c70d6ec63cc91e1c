"""NDTimeline metadata (``meta-*.yaml``) and the parallel layout it gives, checked against the trace.

The trace has one row set per worker, a worker being one (DP rank, pipeline stage). Everything
else in the layout is invisible to it: tensor, context, data-sequence (``dsp``) and expert
parallelism shard each worker's work over more GPUs that run in lockstep, so they multiply the
GPU count (and GPU-hours) and never the number of DP ranks. ``world_size``, when given, must be
the product of every dimension.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from laggard.errors import LaggardError, LaggardWarning
from laggard.optable.ops import JobMeta

# meta keys read as layout dimensions; each must be a positive integer when present
SIZE_KEYS = ("dp_size", "pp_size", "tp_size", "cp_size", "dsp_size", "ep_size", "vpp_size", "world_size")
# dimensions the trace does not see, in the order they are named in messages
_HIDDEN = ("tp_size", "cp_size", "dsp_size", "ep_size")


# a meta file of plain ``key: value`` lines, each value a decimal integer or a bare word, read
# without importing yaml (~20 ms of a `laggard analyze`); anything else goes to yaml
_PLAIN_LINE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*): +(?:(0|[1-9][0-9]*)|([A-Za-z][A-Za-z0-9_-]*)) *")
# bare words YAML 1.1 reads as booleans or null
_YAML_WORDS = frozenset("y Y yes Yes YES n N no No NO true True TRUE false False FALSE "
                        "on On ON off Off OFF null Null NULL".split())


def _plain_meta(text: str) -> dict | None:
    """The mapping of a plain meta file (what ``yaml.safe_load`` reads from it); None for any other file."""
    out: dict = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _PLAIN_LINE.fullmatch(line)
        if m is None or m.group(1) in _YAML_WORDS or (m.group(3) or "") in _YAML_WORDS:
            return None
        out[m.group(1)] = int(m.group(2)) if m.group(2) is not None else m.group(3)
    return out or None


def _load_yaml(path: Path) -> object:
    text = Path(path).read_text()
    plain = _plain_meta(text)
    if plain is not None:
        return plain
    import yaml

    return yaml.safe_load(text)


def read_meta(path: Path | None, trace: Path) -> tuple[dict, Path | None]:
    """The meta mapping (``--meta``, else ``meta-<stem>.yaml`` beside the trace, else the only meta there)."""
    if path is None:
        stem = trace.stem.removeprefix("trace-").removeprefix("trace")
        cands = [trace.parent / f"meta-{stem}.yaml", trace.parent / f"meta-{stem}.yml"]
        found = [c for c in cands if c.exists()]
        if not found:
            metas = sorted(trace.parent.glob("meta*.y*ml"))
            found = metas if len(metas) == 1 else []
        if not found:
            return {}, None
        path = found[0]
    try:
        obj = _load_yaml(Path(path))
    except FileNotFoundError:
        raise LaggardError(f"{path}: metadata file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise LaggardError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    except Exception as e:
        import yaml

        if not isinstance(e, yaml.YAMLError):
            raise
        raise LaggardError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(obj, dict):
        raise LaggardError(f"{path}: expected a mapping of dp_size, pp_size, ... in the metadata")
    for k in SIZE_KEYS:
        if k in obj and (not isinstance(obj[k], int) or isinstance(obj[k], bool) or obj[k] < 1):
            raise LaggardError(f"{path}: {k} must be a positive integer, got {obj[k]!r}")
    return obj, Path(path)


@dataclass(kw_only=True, slots=True, frozen=True)
class NdLayout:
    """The job's layout: what the trace shows (dp, pp, vpp) and what it does not (tp, cp, dsp, ep)."""

    name: str
    num_dp: int
    num_pp: int
    vpp: int
    tp: int = 1
    cp: int = 1
    dsp: int = 1
    ep: int = 1
    world: int | None = None  # None: GPU count unknown (no meta)

    @property
    def gpus_per_worker(self) -> int:
        return self.tp * self.cp * self.dsp * self.ep

    def job_meta(self, trace: Path) -> JobMeta:
        return JobMeta(
            name=self.name,
            world_size=self.world,
            dp_size=self.num_dp,
            pp_size=self.num_pp,
            tp_size=self.tp,
            cp_size=self.cp,
            dsp_size=self.dsp,
            ep_size=self.ep,
            vpp_size=self.vpp,
            gpus_per_worker=self.gpus_per_worker,
            source=f"ndtimeline:{trace.name}",
            extra={"time_base": "steps laid end to end; NDTimeline times are step-relative"},
        )


def fmt_list(values, limit: int = 8) -> str:
    vals = [str(int(v)) for v in values]
    return ", ".join(vals[:limit]) + (f", ... ({len(vals)} in all)" if len(vals) > limit else "")


def resolve_layout(
    meta_obj: dict, meta_path: Path | None, trace: Path, dp_ranks: np.ndarray, stages: np.ndarray, vpp_trace: int
) -> NdLayout:
    """Check the meta against the DP ranks, stages and model chunks the trace has; fill in the rest."""
    num_dp, num_pp = int(dp_ranks.max()) + 1, int(stages.max()) + 1
    if not meta_obj:
        if len(dp_ranks) != num_dp or len(stages) != num_pp:
            raise LaggardError(
                f"{trace}: DP ranks {fmt_list(dp_ranks)} / stages {fmt_list(stages)} are not contiguous from 0"
            )
        warnings.warn(
            f"{trace}: no meta-*.yaml beside the trace and no --meta; using dp={num_dp}, pp={num_pp}, "
            f"vpp={vpp_trace} from the trace and tp=1 (GPU count unknown)",
            LaggardWarning,
            stacklevel=3,
        )
        return NdLayout(name=trace.stem, num_dp=num_dp, num_pp=num_pp, vpp=vpp_trace)
    src = meta_path or trace
    dp_size = int(meta_obj.get("dp_size", num_dp))
    pp_size = int(meta_obj.get("pp_size", num_pp))
    if dp_size != len(dp_ranks) or num_dp != dp_size:
        raise LaggardError(f"{src}: says dp_size={dp_size} but the trace has {len(dp_ranks)} DP rank(s) "
                           f"({fmt_list(dp_ranks)})")
    if pp_size != len(stages) or num_pp != pp_size:
        raise LaggardError(f"{src}: says pp_size={pp_size} but the trace has {len(stages)} stage(s) "
                           f"({fmt_list(stages)})")
    vpp = int(meta_obj.get("vpp_size", vpp_trace))
    if vpp != vpp_trace:
        raise LaggardError(f"{src}: says vpp_size={vpp} but the trace has {vpp_trace} model chunk(s)")
    hidden = {k: int(meta_obj.get(k, 1)) for k in _HIDDEN}
    product = dp_size * pp_size * int(np.prod(list(hidden.values())))
    world = meta_obj.get("world_size")
    if world is not None and world != product:
        sizes = {"dp_size": dp_size, "pp_size": pp_size, **hidden}
        raise LaggardError(
            f"{src}: world_size={world} is not "
            f"{'*'.join(sizes)} = {'*'.join(str(v) for v in sizes.values())} = {product}"
        )
    return NdLayout(
        name=str(meta_obj.get("trial_name") or trace.stem),
        num_dp=num_dp,
        num_pp=num_pp,
        vpp=vpp,
        tp=hidden["tp_size"],
        cp=hidden["cp_size"],
        dsp=hidden["dsp_size"],
        ep=hidden["ep_size"],
        world=int(world) if world is not None else product,
    )
