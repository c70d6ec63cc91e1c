"""``laggard simulate``: tail at scale and synchronisation policies (thin; the work is in the library).

Kept light at import time: numpy, matplotlib and the simulation modules load inside the commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from collections.abc import Callable

    from matplotlib.figure import Figure
    from rich.console import Console

    from laggard.simulate.dists import Distribution

app = typer.Typer(
    help="Simulate stragglers: how the barrier grows with the job, and which policy cuts the tail at what cost.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

DistOpt = Annotated[
    str | None,
    typer.Option("--dist", help="Worker-time distribution, e.g. 'lognormal:base=1.0,mean=-0.7,sigma=0.9' "
                 "(the default, also called 'textbook'), 'exponential:rate=1', 'gaussian:mean=1,std=0.05', "
                 "'pareto:scale=1,alpha=3', 'constant:value=1', 'uniform:low=0.5,high=1.5', "
                 "'mixture:W*DIST(k=v,...)+W*DIST(...)' (rare big delays: 0.99*gaussian(mean=1,std=0.05)"
                 "+0.01*constant(value=5); quote it in the shell), 'trace:PATH'."),
]
TraceOpt = Annotated[
    Path | None,
    typer.Option("--from-trace", help="Take per-worker step times (sum of compute ops per rank and step) from "
                 "this trace and project the job to other sizes; --workers then accepts '4x', '16x'."),
]
TailTrialsOpt = Annotated[int | None, typer.Option("--trials", help="Monte-Carlo trials (simulated steps) per job "
                         "size (default 200000).")]
PolicyTrialsOpt = Annotated[int | None, typer.Option("--trials", help="Monte-Carlo trials (simulated steps) per "
                           "policy (default 20000).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed (default 0): the same seed gives the same numbers.",
                                      show_default=False)]
JsonOpt = Annotated[Path | None, typer.Option("--json", help="Write the result as JSON to this file ('-' for stdout).")]
PlotOpt = Annotated[Path | None, typer.Option("--plot", help="Write a plot to this file (.png or .svg).")]
ThreadsOpt = Annotated[int | None, typer.Option("--threads", help="Threads for the simulation (default: all cores).")]


def _error(msg: str) -> Exception:
    from laggard.errors import LaggardError

    return LaggardError(msg)


def _distribution(dist: str | None, from_trace: Path | None, threads: int | None) -> tuple[Distribution, int | None]:
    """The worker-time distribution of --dist or --from-trace, and the trace's number of workers (else None)."""
    from laggard.simulate.dists import TEXTBOOK, parse_dist

    if threads is not None and not 1 <= threads <= 256:
        raise _error(f"--threads: need an integer in 1..256, got {threads}")
    if dist is not None and from_trace is not None:
        raise _error("give --dist or --from-trace, not both")
    if from_trace is not None:
        from laggard.simulate.empirical import trace_distribution

        d = trace_distribution(from_trace, where="--from-trace")
        return d, d.num_workers
    return parse_dist(dist if dist is not None else TEXTBOOK, where="--dist"), None


def parse_workers(text: str, reference: int | None, *, where: str = "--workers") -> list[int]:
    """``1,2,4,16`` or, with a trace of ``reference`` workers, ``1x,4x,16x`` (multiples of it)."""
    out = []
    for item in text.split(","):
        item = item.strip().lower()
        if not item:
            raise _error(f"{where} {text!r}: empty entry")
        relative = item.endswith("x") and item[:-1].replace(".", "", 1).isdigit()
        if relative and reference is None:
            raise _error(f"{where} {text!r}: relative sizes such as {item!r} need --from-trace")
        try:
            k = round(float(item[:-1]) * reference) if relative and reference else int(item)
        except ValueError:
            raise _error(f"{where} {text!r}: {item!r} is not a worker count "
                         "(e.g. 64, or 4x with --from-trace)") from None
        if k < 1:
            raise _error(f"{where} {text!r}: worker counts must be >= 1, got {item}")
        out.append(k)
    return out


def _finish(result: Any, d: Distribution, figure: Callable[[Any], Figure], plot: Path | None, json_out: Path | None,
            show: Callable[[Any], None]) -> None:
    """Note the trace the result came from, then write the plot, the JSON and (unless the JSON went to
    stdout) the table."""
    from laggard.simulate.empirical import EmpiricalTrace

    if isinstance(d, EmpiricalTrace):
        result.source = dict(d.info)
    if plot is not None:
        from laggard.simulate.plots import save_figure

        save_figure(figure(result), plot)
    if json_out is not None:
        from laggard.report.jsonout import dump_json

        dump_json(result.to_json(), json_out, flag="--json")
        if str(json_out) == "-":
            return
    show(result)


def _print_lines(console: Console, *lines: str) -> None:
    for line in lines:
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def _fmt(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def _trace_notes(source: dict[str, Any] | None) -> list[str]:
    """What the trace behind a result measured (nothing for a parametric distribution)."""
    if not source:
        return []
    notes = [
        f"trace: {source['num_workers']} workers x {source['num_samples']} steps; per-worker time = {source['what']}",
        f"measured: mean worker {source['measured_mean_s']:.4g} s, barrier (slowest worker per step) "
        f"{source['measured_barrier_s']:.4g} s",
        f"persistent spread between workers {source['offset_spread_s']:.3g} s (slowest: rank "
        f"{source['slowest_worker_rank']}), step-to-step noise std {source['noise_std_s']:.3g} s",
    ]
    if source["offset_spread_s"] > 5 * max(source["noise_std_s"], 1e-12):
        notes.append("the barrier is set by persistent slow workers, not by noise: growing the job "
                     "keeps their share and adds little; fixing them is what pays")
    return notes


@app.command()
def tail(
    dist: DistOpt = None,
    workers: Annotated[str | None, typer.Option("--workers", help="Job sizes K, comma-separated "
                       "(default 1,2,4,16,64,256,1024; with --from-trace 1x,2x,4x,8x,16x).")] = None,
    trials: TailTrialsOpt = None,
    seed: SeedOpt = 0,
    json_out: JsonOpt = None,
    plot: PlotOpt = None,
    from_trace: TraceOpt = None,
    threads: ThreadsOpt = None,
) -> None:
    """E[max] and p99 of the barrier as the job grows, and the slowdown vs one worker."""
    from laggard.errors import check_output

    check_output(plot, "--plot")
    check_output(json_out, "--json")
    from laggard.simulate.plots import tail_figure
    from laggard.simulate.tail import DEFAULT_TRIALS, DEFAULT_WORKERS, tail_at_scale

    d, ref = _distribution(dist, from_trace, threads)
    if workers is None:
        ks = [ref * m for m in (1, 2, 4, 8, 16)] if ref else list(DEFAULT_WORKERS)
    else:
        ks = parse_workers(workers, ref)
    from laggard.cli.options import progress_callback

    with progress_callback("simulating job sizes", "sizes") as on_progress:
        result = tail_at_scale(d, ks, num_trials=trials if trials is not None else DEFAULT_TRIALS, seed=seed,
                               threads=threads, reference_workers=ref, on_progress=on_progress)
    _finish(result, d, tail_figure, plot, json_out, _print_tail)


def _print_tail(result: Any) -> None:
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    show_exact = any(r.exact_mean is not None for r in result.rows)
    table = Table(title=escape(f"Tail at scale: {result.dist}"), title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("workers", justify="right", no_wrap=True)
    table.add_column(escape("E[max]"), justify="right", no_wrap=True)
    table.add_column("p99", justify="right", no_wrap=True)
    table.add_column("slowdown vs 1", justify="right", no_wrap=True)
    if result.reference_workers:
        table.add_column(f"vs {result.reference_workers} (measured)", justify="right", no_wrap=True)
    if show_exact:
        table.add_column(escape("exact E[max]"), justify="right", no_wrap=True)
    for r in result.rows:
        cells = [str(r.num_workers), _fmt(r.mean), _fmt(r.p99), f"{r.slowdown:.3f}x"]
        if result.reference_workers:
            cells.append(f"{r.vs_reference:.4f}x")
        if show_exact:
            cells.append(_fmt(r.exact_mean))
        table.add_row(*cells)
    console = Console()
    console.print(table)
    _print_lines(console, f"{result.num_trials} trials per size, seed {result.seed}; mean of one worker "
                 f"{result.single_worker_mean:.4g}", *_trace_notes(result.source))


@app.command()
def policy(
    dist: DistOpt = None,
    workers: Annotated[str | None, typer.Option("--workers", help="Job size K (with --from-trace also e.g. "
                       "'4x'; default: the trace's size, else 256).")] = None,
    policies: Annotated[list[str] | None, typer.Option("--policy", help="A policy to compare (repeat): bsp, "
                        "backup:B, speculate[:MULT,QUANTILE], drop:M, overdecomp:P, ssp:S, async. Default: "
                        "bsp backup:1 speculate drop:1 overdecomp:4 ssp:3 async.")] = None,
    trials: PolicyTrialsOpt = None,
    steps: Annotated[int | None, typer.Option("--steps", help="Steps per simulated run for ssp and async "
                     "(runs = trials / steps).")] = None,
    seed: SeedOpt = 0,
    json_out: JsonOpt = None,
    plot: PlotOpt = None,
    from_trace: TraceOpt = None,
    threads: ThreadsOpt = None,
) -> None:
    """Compare synchronisation policies: mean and p99 step time, idle fraction, and what each costs."""
    from laggard.errors import check_output

    check_output(plot, "--plot")
    check_output(json_out, "--json")
    from laggard.simulate.plots import policy_figure
    from laggard.simulate.policies import DEFAULT_POLICIES, DEFAULT_STEPS, DEFAULT_TRIALS, compare_policies

    d, ref = _distribution(dist, from_trace, threads)
    if workers is None:
        k = ref or 256
    else:
        ks = parse_workers(workers, ref)
        if len(ks) != 1:
            raise _error(f"--workers {workers!r}: policy compares at one job size; give one number")
        k = ks[0]
    from laggard.cli.options import progress_callback

    with progress_callback("simulating policies", "policies") as on_progress:
        result = compare_policies(d, k, policies or list(DEFAULT_POLICIES),
                                  num_trials=trials if trials is not None else DEFAULT_TRIALS,
                                  num_steps=steps if steps is not None else DEFAULT_STEPS, seed=seed, threads=threads,
                                  on_progress=on_progress)
    _finish(result, d, policy_figure, plot, json_out, _print_policies)


def _print_policies(result: Any) -> None:
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(f"Policies at K = {result.num_workers}: {result.dist}"), title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("policy", "mean", "p99", "vs BSP", "idle", "compute", "grad\nlost", "stale"):
        table.add_column(name, justify="left" if name == "policy" else "right", no_wrap=True)
    for r in result.rows:
        table.add_row(
            r.policy, _fmt(r.mean), _fmt(r.p99), f"{-r.barrier_cut:+.1%}" if r.verdict != "baseline" else "-",
            f"{r.idle_fraction:.1%}", f"{r.compute_multiplier:.3g}x", f"{r.gradient_lost:.2%}",
            "\u221e" if r.staleness is None else str(r.staleness),
        )
    console = Console()
    console.print(table)
    width = max(len(r.policy) for r in result.rows)
    _print_lines(console, *(f"  {r.policy:<{width}}  {r.verdict}" for r in result.rows if r.verdict != "baseline"))
    _print_lines(console, f"{result.num_trials} trials, seed {result.seed}; ssp/async: "
                 "wall-clock per step over runs of "
                 f"{result.num_steps} steps", *_trace_notes(result.source))


def register(parent: typer.Typer) -> None:
    parent.add_typer(app, name="simulate")
