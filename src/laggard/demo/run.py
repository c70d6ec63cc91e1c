"""`laggard demo`: train the real demo job traced, analyze the trace, write the reports.

No printing here (the CLI prints). What each injected cause should look like in the analysis is
spelled out in ``expectations``, so the demo can say whether the analysis found it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from laggard.demo.launch import JobConfig, JobResult, run_job
from laggard.diagnose.config import HEALTHY_THRESHOLD
from laggard.errors import LaggardError
from laggard.groundtruth.inject import Injection
from laggard.optable.tracedir import JOB_FILE, STATE_GLOB, shard_glob

if TYPE_CHECKING:
    from laggard.results.analysis import Analysis


@dataclass(kw_only=True, slots=True)
class DemoOutput:
    analysis: Analysis
    paths: dict[str, Path]
    job: JobResult | None = None
    config: JobConfig | None = None
    trace_warnings: list[str] = field(default_factory=list)
    # ``--act``: the injected causes are judged on the steps before the controller's first action
    # (after it the work is moved, so the whole trace no longer shows the cause alone)
    pre_action: PreAction | None = None


@dataclass(kw_only=True, slots=True)
class Span:
    """Steps ``lo``..``hi`` (inclusive, counted from the first traced step as the controller counts
    them) and their wall step time (mean over the steps and the ranks)."""

    lo: int
    hi: int
    step_s: float

    @property
    def label(self) -> str:
        return f"step {self.lo}" if self.lo == self.hi else f"steps {self.lo}-{self.hi}"


@dataclass(kw_only=True, slots=True)
class PreAction:
    """The analysis of the steps before the controller's first action that changed the job."""

    steps: Span
    warmup_steps: int  # trace step = controller step + this (the untraced warm-up steps come first)
    analysis: Analysis | None = None
    why_not: str = ""  # when ``analysis`` is None: why those steps could not be analyzed

    @property
    def trace_steps(self) -> tuple[int, int]:
        """The same steps as the trace numbers them (``laggard analyze --steps LO-HI``)."""
        return self.steps.lo + self.warmup_steps, self.steps.hi + self.warmup_steps


def clear_trace_dir(trace_dir: Path) -> None:
    """Remove what a previous run left (only files the tracer writes)."""
    if not trace_dir.is_dir():
        return
    for pattern in (shard_glob(), shard_glob() + ".tmp", STATE_GLOB, JOB_FILE):
        for p in trace_dir.glob(pattern):
            p.unlink()


def run_traced_job(cfg: JobConfig, *, on_progress: Callable[[int, int, float | None], None] | None = None
                   ) -> JobResult:
    """Run the demo job with tracing into ``cfg.trace_dir`` (emptied first)."""
    if cfg.trace_dir is None:
        raise LaggardError("run_traced_job: the config has no trace_dir")
    trace_dir = Path(cfg.trace_dir)
    try:
        trace_dir.mkdir(parents=True, exist_ok=True)
        clear_trace_dir(trace_dir)
    except OSError as e:
        raise LaggardError(f"{trace_dir}: cannot use as the trace directory ({e.strerror or e})") from None
    return run_job(cfg, on_progress=on_progress)


def analyze_and_report(trace: Path, out_dir: Path) -> tuple[Analysis, dict[str, Path], list[str]]:
    """Analyze a trace (warning about missing ranks and lost tails) and write JSON, HTML, Perfetto."""
    from laggard.analysis.pipeline import analyze
    from laggard.io import load_job
    from laggard.optable.tracedir import warn_trace
    from laggard.report.html import write_report
    from laggard.report.jsonout import dump_json
    from laggard.report.perfetto import write_perfetto

    trace_warnings = warn_trace(trace)
    result = analyze(load_job(trace))
    for w in trace_warnings:  # the report shows them too
        if w not in result.warnings:
            result.warnings.append(w)
    paths = {
        "json": out_dir / "analysis.json",
        "html": out_dir / "report.html",
        "perfetto": out_dir / "timeline.perfetto.json",
    }
    dump_json(result, paths["json"])
    write_perfetto(result, paths["perfetto"])
    write_report(result, paths["html"], perfetto=paths["perfetto"])
    return result, paths, trace_warnings


def report_screenshot(html: Path) -> tuple[Path | None, str]:
    """A full-page PNG of the report beside it (report.png) in headless Chromium: (path, "") or
    (None, why not) when no browser can be had or it fails."""
    from laggard.report.browser import find_chromium, screenshot

    exe, why = find_chromium()
    if exe is None:
        return None, why
    try:
        return screenshot(html, html.with_suffix(".png")), ""
    except Exception as e:  # noqa: BLE001 - a screenshot is a convenience; any browser failure is one line
        return None, f"the browser failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"


def expectations(result: Analysis, injections: list[Injection]) -> list[tuple[str, bool | None]]:
    """For each injected cause: where the analysis should show it, and whether it does (None: no check)."""
    out: list[tuple[str, bool | None]] = []
    workers = result.by_worker
    top_rank = workers[0]["rank"] if workers else None
    stages = result.by_stage
    top_stage = max(stages, key=lambda k: stages[k]) if stages else None
    last_stage = max(stages) if stages else None
    for inj in injections:
        p = inj.params
        if inj.cause == "slow-worker":
            r = int(p["rank"])
            out.append((f"slow-worker on rank {r}: rank {r} should have the highest S_w (it is rank {top_rank})",
                        top_rank == r))
        elif inj.cause == "heavy-stage":
            st = int(p["stage"])
            out.append((f"heavy-stage on stage {st}: it should have the highest S_stage (it is pp{top_stage})",
                        top_stage == st))
        elif inj.cause == "host-stall" or (inj.cause == "launch-delay" and "rank" in p):
            r = int(p["rank"])
            gaps = (result.extras.get("untraced_gaps") or {}).get("per_rank_s_per_step", {})
            top_gap = max(gaps, key=gaps.get) if gaps else None
            out.append((f"{inj.cause} on rank {r}: it should have the most untraced host time per step (it is rank "
                        f"{top_gap})", None if top_gap is None else int(top_gap) == r))
        elif inj.cause == "heavy-last-stage":
            out.append((f"heavy-last-stage: the last stage (pp{last_stage}) should have the highest S_stage "
                        f"(it is pp{top_stage})", top_stage == last_stage))
        elif inj.cause == "seqlen-imbalance":
            s = max(result.by_optype.get("forward-compute", 1.0), result.by_optype.get("backward-compute", 1.0))
            out.append((f"seqlen-imbalance: compute S_t should rise (forward/backward-compute S_t {s:.3f}); "
                        "the steps' S varies with their microbatch lengths", s > HEALTHY_THRESHOLD))
        elif inj.cause == "gc-pauses":
            s = result.by_optype.get("gc", 1.0)
            out.append((f"gc-pauses: the gc op type should have S_t above 1 (it is {s:.3f})", s > 1.02))
        elif inj.cause == "slow-link":
            s = max((v for k, v in result.by_optype.items() if k.endswith("-pp-comm")), default=1.0)
            out.append((f"slow-link {int(p['src'])}->{int(p['dst'])}: pipeline transfers should have S_t above 1 "
                        f"(the worst is {s:.3f})", s > 1.02))
        elif inj.cause == "launch-delay":
            out.append((f"launch-delay: untraced CPU time between ops shows as replay fidelity above 1 "
                        f"(measured/replayed {result.launch_slowdown:.3f})", result.launch_slowdown > 1.03))
    return out


def summary_lines(out: DemoOutput) -> list[str]:
    """Plain-text lines the CLI prints after the analysis summary."""
    lines: list[str] = []
    if out.job is not None and out.config is not None:
        steps = [s for r in out.job.ranks.values() for s in r.get("step_s", [])]
        mean = sum(steps) / len(steps) if steps else float("nan")
        loss = next((r["loss"] for r in out.job.ranks.values() if r.get("loss") is not None), None)
        lines.append(f"demo job: dp={out.config.dp} x pp={out.config.pp}, {out.config.steps} traced steps of "
                     f"{mean:.3f} s, {out.job.wall_s:.1f} s in all" + (f", final loss {loss:.3f}" if loss else ""))
        lines += act_lines(out.job, out.config)
        lines += check_lines(out)
    return lines


def check_lines(out: DemoOutput) -> list[str]:
    """One line per injected cause: found, NOT found, or no check; with ``--act``, judged on the steps
    before the controller's first action (the line before them says which)."""
    assert out.config is not None
    if not out.config.injections:
        return []
    result, lines, pre = out.analysis, [], out.pre_action
    if pre is not None:
        lo, hi = pre.trace_steps
        where = (f"  checks on {pre.steps.label} (trace steps {lo}-{hi}), before the controller's first action: "
                 "the analysis above covers every step, also those after the work was moved")
        if pre.analysis is None:
            return [where, f"  [check] not judged: {pre.why_not}"]
        result = pre.analysis
        lines.append(where)
    for text, ok in expectations(result, out.config.injections):
        mark = "found" if ok else ("NOT found" if ok is not None else "check")
        lines.append(f"  [{mark}] {text}")
    return lines


def mean_step_s(job: JobResult) -> list[float]:
    """The wall step time of each traced step, mean over the ranks."""
    return [sum(x) / len(x) for x in zip(*(r["step_s"] for r in job.ranks.values()), strict=True)]


def changes_job(action: dict[str, Any]) -> bool:
    """A drain is a request to the scheduler; every other action changes how the job runs."""
    return action["kind"] != "drain"


def span(steps: list[float], lo: int, hi: int) -> Span:
    return Span(lo=lo, hi=hi, step_s=sum(steps[lo:hi + 1]) / (hi + 1 - lo))


def around(steps: list[float], actions: list[dict[str, Any]], step: int) -> tuple[Span, Span | None]:
    """The one definition of "before" and "after" an action taken at the end of ``step``: the steps
    since the previous action that changed the job (or the first traced step) up to ``step``, and the
    steps after it up to the next such action (or the last step); no after span when it was the last."""
    cuts = sorted({a["step"] for a in actions if changes_job(a)})
    prev = max((c for c in cuts if c < step), default=-1)
    nxt = min((c for c in cuts if c > step), default=len(steps) - 1)
    return span(steps, prev + 1, step), (span(steps, step + 1, nxt) if step + 1 < len(steps) else None)


def first_action_step(job: JobResult) -> int | None:
    """The step of the controller's first action that changed the job (None: none did)."""
    first = next((r for r in job.ranks.values() if r.get("actions") is not None), None)
    return min((a["step"] for a in (first or {}).get("actions") or [] if changes_job(a)), default=None)


def act_effect(job: JobResult) -> dict[str, Any] | None:
    """The first sample shift's effect on the wall step time (mean over ranks): the steps before it
    (as ``around`` has them, the span each action's line shows) against every step after it."""
    first = next((r for r in job.ranks.values() if r.get("actions") is not None), None)
    if first is None:
        return None
    shift = next((a for a in first["actions"] if a["kind"] == "rebalance"), None)
    steps = mean_step_s(job)
    if shift is None or shift["step"] + 1 >= len(steps):
        return {"actions": first["actions"], "first_shift_step": None}
    before, _ = around(steps, first["actions"], shift["step"])
    after = span(steps, shift["step"] + 1, len(steps) - 1)
    return {"actions": first["actions"], "first_shift_step": shift["step"], "before": before, "after": after,
            "step_s_before": before.step_s, "step_s_after": after.step_s, "speedup": before.step_s / after.step_s}


def act_lines(job: JobResult, cfg: JobConfig) -> list[str]:
    """What the runtime controller did (``--act``), one line per action and the shift's effect; every
    figure compares the spans ``around`` defines, and each says which steps it compares."""
    eff = act_effect(job) if cfg.act else None
    if eff is None:
        return []
    steps = mean_step_s(job)
    lines = [f"  act: {len(eff['actions'])} action(s)"
             + (f" (written to {cfg.actions_path})" if cfg.actions_path else "")
             + f"; steps counted from the first traced step (trace step = step + {cfg.warmup_steps})"]
    for a in eff["actions"]:
        ba = ""
        if changes_job(a):
            before, after = around(steps, eff["actions"], a["step"])
            ba = f"; step time {before.step_s:.3f} s ({before.label})" + (
                f" -> {after.step_s:.3f} s ({after.label})" if after is not None else "")
        lines.append(f"    step {a['step']}: {a['kind']} DP ranks {a['ranks']}: {a['reason']}{ba}")
    if eff["first_shift_step"] is not None:
        b, f = eff["before"], eff["after"]
        lines.append(f"  act: after the first shift (step {eff['first_shift_step']}), {f.label} ran "
                     f"x{eff['speedup']:.2f} faster than {b.label}: {b.step_s:.3f} -> {f.step_s:.3f} s "
                     "(wall, mean over ranks)")
    return lines


def pre_action(trace: Path, job: JobResult, cfg: JobConfig) -> PreAction | None:
    """``--act``: analyze the steps before the controller's first action that changed the job (None:
    no such action)."""
    from laggard.analysis.pipeline import analyze
    from laggard.io import load_job

    step = first_action_step(job) if cfg.act else None
    if step is None:
        return None
    out = PreAction(steps=span(mean_step_s(job), 0, step), warmup_steps=cfg.warmup_steps)
    lo, hi = out.trace_steps
    try:
        with warnings.catch_warnings():  # the whole trace's analysis has said what there is to warn of
            warnings.simplefilter("ignore")
            out.analysis = analyze(load_job(trace, steps=f"{lo}-{hi}"), diagnose=False)
    except LaggardError as e:
        out.why_not = f"trace steps {lo}-{hi} could not be analyzed ({e})"
    return out


def demo_config(*, quick: bool, dp: int, pp: int, steps: int | None, microbatches: int, seed: int,
                injections: list[Injection], trace_dir: Path, act: bool = False,
                actions_path: Path | None = None) -> JobConfig:
    kw: dict[str, Any] = {"dp": dp, "pp": pp, "microbatches": microbatches, "seed": seed,
                          "injections": injections, "trace_dir": str(trace_dir), "act": act,
                          "actions_path": str(actions_path) if act and actions_path is not None else None}
    if steps is not None:
        kw["steps"] = steps
    return JobConfig.quick(**kw) if quick else JobConfig(**kw)
