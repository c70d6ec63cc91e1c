"""``laggard collectives ...`` and ``laggard bench allreduce``: thin, light at import (no torch/numpy here;
each command imports what it needs)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from laggard.collectives.schedule import StragglarSchedule

app = typer.Typer(help="Straggler-aware AllReduce (StragglAR): schedules, verifier, cost model, simulation.",
                  no_args_is_help=True, add_completion=False, rich_markup_mode=None)
bench_app = typer.Typer(help="Benchmarks on real local processes.", no_args_is_help=True,
                        add_completion=False, rich_markup_mode=None)

JsonOpt = Annotated[Path | None, typer.Option("--json", help="Write the result as JSON to this file ('-' for stdout).")]
SizeOpt = Annotated[float, typer.Option("--size-mb", help="AllReduce size in MiB.")]
AlphaOpt = Annotated[float | None, typer.Option("--alpha-us", help=(
    "Model: per-message latency in microseconds (default: NVLink-class GPU, 5 us)."))]
BwOpt = Annotated[float | None, typer.Option("--bandwidth-gbps", help=(
    "Model: per-link bandwidth in GB/s (default 150)."))]
GammaOpt = Annotated[float | None, typer.Option("--reduce-gbps", help=(
    "Model: local reduction speed in GB/s (default: free)."))]
LinksOpt = Annotated[float | None, typer.Option("--links", help=(
    "Model: transfers the machine carries at full speed at once (default: unlimited)."))]
CalOpt = Annotated[bool, typer.Option("--calibrate", help=(
    "Measure the model parameters with local gloo processes first (takes a few seconds)."))]
CalRanksOpt = Annotated[int, typer.Option("--calibrate-ranks", help=(
    "Processes for --calibrate (contention is measured among them)."))]


def parse_ranks(spec: str, *, maximum: int = 4096) -> list[int]:
    """``8``, ``4-64`` or ``4,8,16`` (combinable: ``4-8,16``) -> sorted distinct rank counts."""
    from laggard.errors import LaggardError
    from laggard.util.ranges import expand, parse_spans

    spans = parse_spans(spec, flag="--ranks", example="4-8,16")
    if not spans:
        raise LaggardError("--ranks: no rank count given")
    lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
    if lo < 2 or hi > maximum:  # checked before expanding, so a huge range fails at once
        raise LaggardError(f"--ranks: rank counts must be in 2..{maximum}, got {lo if lo < 2 else hi}")
    out = expand(spans)
    if len(out) > 1024:
        raise LaggardError(f"--ranks: at most 1024 rank counts at once, got {len(out)}")
    return sorted(out)


def _json_to_stdout(obj: Any, out: Path | None) -> bool:
    """Write ``obj`` as JSON if --json was given; True when it went to stdout (then print nothing else)."""
    if out is None:
        return False
    from laggard.report.jsonout import dump_json

    dump_json(obj, out, flag="--json")
    return str(out) == "-"


def _size_bytes(size_mb: float) -> int:
    from laggard.errors import LaggardError

    if not (math.isfinite(size_mb) and 0 < size_mb <= 1 << 20):
        raise LaggardError(f"--size-mb must be in (0, 1048576], got {size_mb:g}")
    return int(size_mb * 2**20)


def _params(alpha_us: float | None, bandwidth_gbps: float | None, reduce_gbps: float | None,
            links: float | None, calibrate: bool, calibrate_ranks: int):
    from laggard.collectives.cost import CostParams
    from laggard.errors import LaggardError

    if calibrate:
        if not 2 <= calibrate_ranks <= 64:
            raise LaggardError(f"--calibrate-ranks must be in 2..64, got {calibrate_ranks}")
        from laggard.collectives.calibrate import calibrate as run_calibration

        base = run_calibration(calibrate_ranks)
    else:
        base = CostParams()
    kw: dict[str, Any] = {}
    for name, v in (("--alpha-us", alpha_us), ("--bandwidth-gbps", bandwidth_gbps),
                    ("--reduce-gbps", reduce_gbps), ("--links", links)):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise LaggardError(f"{name} must be a positive number, got {v:g}")
    if alpha_us is not None:
        kw["alpha_s"] = alpha_us * 1e-6
    if bandwidth_gbps is not None:
        kw["beta_s_per_byte"] = 1 / (bandwidth_gbps * 1e9)
    if reduce_gbps is not None:
        kw["gamma_s_per_byte"] = 1 / (reduce_gbps * 1e9)
    if links is not None:
        kw["num_links"] = links
    if kw:
        import dataclasses

        kw["source"] = base.source + " + command-line overrides"
        return dataclasses.replace(base, **kw)
    return base


@app.command()
def verify(
    ranks: Annotated[str, typer.Option("--ranks", help="Rank count(s): N, A-B or a comma list, e.g. 4-64.")],
    json_out: JsonOpt = None,
) -> None:
    """Synthesise StragglAR schedules and check them exactly (integer simulation); print rounds vs n-2+log2(n).

    The lower bound is n-2+ceil(log2(n)) (n-1 swaps, then the last chunk doubles from 2 holders)."""
    from laggard.collectives.verify import verify_stragglar
    from laggard.errors import check_output

    check_output(json_out, "--json")
    counts = parse_ranks(ranks, maximum=1024)
    results = [verify_stragglar(n) for n in counts]
    payload = [r.to_json() for r in results]
    if not _json_to_stdout(payload[0] if len(payload) == 1 else payload, json_out):
        typer.echo("above bound: rounds beyond the lower bound n-2+ceil(log2(n)) (0: optimal; more is slower, not\n"
                   "wrong); verified: the schedule's exact simulation checks out (FAILED lists what did not)")
        typer.echo(f"{'ranks':>5} {'rounds':>6} {'n-2+log2(n)':>11} {'lower bound':>11} {'above bound':>11} "
                   f"{'verified':>8}")
        for r in results:
            bound = f"{r.num_ranks - 2 + math.log2(r.num_ranks):.2f}".rstrip("0").rstrip(".")
            over = r.num_rounds - r.optimal_rounds
            typer.echo(f"{r.num_ranks:>5} {r.num_rounds:>6} {bound:>11} {r.optimal_rounds:>11} "
                       f"{'0 (optimal)' if over <= 0 else f'+{over}':>11} {'ok' if r.ok else 'FAILED':>8}")
            for e in r.errors[:3]:
                typer.echo(f"      {e}")
    if not all(r.ok for r in results):
        raise typer.Exit(1)


@app.command()
def schedule(
    ranks: Annotated[int, typer.Option("--ranks", help="Number of ranks (>= 2).")],
    json_out: JsonOpt = None,
) -> None:
    """Print StragglAR's phase-2 rounds (S = straggler; a<+>b:cK is a swap of chunk K, a->b:cK a copy)."""
    from laggard.collectives.schedule import format_schedule, stragglar_schedule
    from laggard.errors import check_output

    check_output(json_out, "--json")
    if not 2 <= ranks <= 256:
        from laggard.errors import LaggardError

        raise LaggardError(f"--ranks must be in 2..256 to print a schedule, got {ranks}")
    sched = stragglar_schedule(ranks)
    if json_out is not None and _json_to_stdout(_schedule_json(ranks, sched), json_out):
        return
    typer.echo(f"StragglAR, {ranks} ranks: on-time ranks 0..{ranks - 2}, straggler S; {ranks - 1} chunks; "
               f"construction: {sched.method}")
    typer.echo(f"phase 1: ring ReduceScatter among the on-time ranks, {sched.phase1.num_rounds} rounds "
               f"(rank i ends with the on-time sum of chunk i)")
    typer.echo(f"phase 2: {sched.num_rounds} rounds (lower bound {sched.optimal_rounds})")
    for line in format_schedule(sched.phase2, straggler=sched.straggler):
        typer.echo(line)


def _schedule_json(ranks: int, sched: StragglarSchedule) -> dict[str, Any]:
    """The --json of ``schedule``: phase-2 transfers round by round."""
    p2 = sched.phase2
    rounds = [[{"src": int(p2.src[j]), "dst": int(p2.dst[j]), "chunk": int(p2.chunk[j]),
                "reduce": bool(p2.reduce[j])} for j in range(sl.start, sl.stop)] for sl in p2.round_slices()]
    return {"ranks": ranks, "straggler": sched.straggler, "method": sched.method,
            "phase1_rounds": sched.phase1.num_rounds, "rounds": len(rounds),
            "optimal_rounds": sched.optimal_rounds, "phase2": rounds}


@app.command()
def model(
    ranks: Annotated[int, typer.Option("--ranks", help="Number of ranks (>= 2).")],
    size_mb: SizeOpt = 64.0,
    delay_ms: Annotated[float, typer.Option("--delay-ms", help="Straggler delay behind the other ranks, ms.")] = 0.0,
    alpha_us: AlphaOpt = None,
    bandwidth_gbps: BwOpt = None,
    reduce_gbps: GammaOpt = None,
    links: LinksOpt = None,
    calibrate: CalOpt = False,
    calibrate_ranks: CalRanksOpt = 2,
    json_out: JsonOpt = None,
) -> None:
    """Cost-model times of ring, RHD and StragglAR after the straggler arrives, and the break-even delay d*."""
    from laggard.collectives import cost
    from laggard.collectives.schedule import check_num_ranks
    from laggard.errors import LaggardError

    check_num_ranks(ranks, what="--ranks")
    if not (math.isfinite(delay_ms) and delay_ms >= 0):
        raise LaggardError(f"--delay-ms must be >= 0, got {delay_ms:g}")
    size = _size_bytes(size_mb)
    p = _params(alpha_us, bandwidth_gbps, reduce_gbps, links, calibrate, calibrate_ranks)
    d = delay_ms / 1000
    res = {
        "ranks": ranks, "size_bytes": size, "delay_s": d, "params": p.to_json(),
        "ring_s": cost.ring_time_s(ranks, size, p), "rhd_s": cost.rhd_time_s(ranks, size, p),
        "stragglar_s": cost.stragglar_time_s(ranks, size, p, delay_s=d),
        "stragglar_phase1_s": cost.stragglar_phase1_time_s(ranks, size, p),
        "stragglar_phase2_s": cost.stragglar_phase2_time_s(ranks, size, p),
        "break_even_delay_s": cost.break_even_delay_s(ranks, size, p, "best"),
    }
    if _json_to_stdout(res, json_out):
        return
    typer.echo(f"{ranks} ranks, {size_mb:g} MiB, straggler {delay_ms:g} ms late; params: {p.source}")
    for k in ("ring_s", "rhd_s", "stragglar_s"):
        typer.echo(f"  {k[:-2]:<10} {res[k] * 1e3:10.3f} ms after the straggler arrives")
    typer.echo(f"  StragglAR phase 1 {res['stragglar_phase1_s'] * 1e3:.3f} ms (hidden if the delay is longer), "
               f"phase 2 {res['stragglar_phase2_s'] * 1e3:.3f} ms")
    be = res["break_even_delay_s"]
    typer.echo(f"  break-even delay d* = {'never wins' if math.isinf(be) else f'{be * 1e3:.3f} ms'} "
               "(vs the faster of ring and RHD)")


@app.command()
def simulate(
    ranks: Annotated[str, typer.Option("--ranks", help=(
        "Rank counts, e.g. 8,64,256,1024 (non powers of two up to 256)."))] = "8,64,256,1024",
    size_mb: SizeOpt = 256.0,
    dist: Annotated[str, typer.Option("--dist", help=(
        "Arrival-time distribution, laggard simulate syntax, e.g. "
        "lognormal:base=1.0,mean=-0.7,sigma=0.9."))] = "lognormal:base=1.0,mean=-0.7,sigma=0.9",
    time_scale_ms: Annotated[float, typer.Option("--time-scale-ms", help=(
        "Milliseconds per unit of the distribution."))] = 10.0,
    persistent_delay_ms: Annotated[float, typer.Option("--persistent-delay-ms", help=(
        "Extra delay of one fixed rank every step (a persistent straggler), ms."))] = 0.0,
    trials: Annotated[int, typer.Option("--trials", help="Trials (consecutive steps) per rank count.")] = 2000,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    alpha_us: AlphaOpt = None,
    bandwidth_gbps: BwOpt = None,
    reduce_gbps: GammaOpt = None,
    links: LinksOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Expected AllReduce completion of ring, RHD, StragglAR and the adaptive switch at scale (cost model)."""
    from laggard.collectives.sim import simulate_at_scale

    counts = parse_ranks(ranks, maximum=4096)
    p = _params(alpha_us, bandwidth_gbps, reduce_gbps, links, False, 2)
    res = simulate_at_scale(counts, _size_bytes(size_mb), p, dist, time_scale_s=time_scale_ms / 1000,
                            num_trials=trials, persistent_delay_s=persistent_delay_ms / 1000, seed=seed)
    if _json_to_stdout({"dist": dist, "time_scale_s": time_scale_ms / 1000, "params": p.to_json(),
                        "results": [r.to_json() for r in res]}, json_out):
        return
    names = list(res[0].mean_exposed_s)
    typer.echo(f"mean exposed communication (completion - last arrival), ms; {size_mb:g} MiB; "
               f"arrivals {dist} x {time_scale_ms:g} ms")
    typer.echo(f"{'ranks':>6} " + " ".join(f"{k:>18}" for k in names) + f" {'gap':>8} {'d*':>8}")
    for r in res:
        be = "inf" if math.isinf(r.break_even_delay_s) else f"{r.break_even_delay_s * 1e3:.3f}"
        typer.echo(f"{r.num_ranks:>6} " + " ".join(f"{r.mean_exposed_s[k] * 1e3:18.3f}" for k in names)
                   + f" {r.mean_gap_s * 1e3:8.3f} {be:>8}")


@bench_app.command("allreduce")
def bench_allreduce(
    ranks: Annotated[int, typer.Option("--ranks", help="Number of local processes (2..64).")] = 8,
    size_mb: SizeOpt = 64.0,
    delay_ms: Annotated[float, typer.Option("--delay-ms", help="Injected delay of the straggler, ms.")] = 1000.0,
    straggler: Annotated[int | None, typer.Option("--straggler", help="Rank that is late (default: the last).")] = None,
    repeats: Annotated[int, typer.Option("--repeats", help="Timed repeats per algorithm.")] = 5,
    algorithms: Annotated[str, typer.Option("--algorithms", help=(
        "Comma list of stragglar, ring, torch."))] = "stragglar,ring,torch",
    no_calibrate: Annotated[bool, typer.Option("--no-calibrate", help=(
        "Skip measuring the model parameters (no prediction)."))] = False,
    json_out: JsonOpt = None,
) -> None:
    """AllReduce with an injected straggler on real gloo processes: time from its arrival to completion,
    for StragglAR, our p2p ring and torch's all_reduce, beside the cost model's prediction."""
    from laggard.collectives.bench import BenchConfig, run_bench

    cfg = BenchConfig(num_ranks=ranks, size_mb=size_mb, delay_ms=delay_ms, straggler=straggler, repeats=repeats,
                      algorithms=tuple(a.strip() for a in algorithms.split(",") if a.strip()),
                      calibrate=not no_calibrate)
    from laggard.cli.options import progress_callback

    # the ranks' start (torch imported, the group joined) takes seconds before rank 0 reports a phase
    with progress_callback(f"starting {ranks} ranks", "all-reduces") as on_progress:
        res = run_bench(cfg, on_progress=on_progress)
    if _json_to_stdout(res, json_out):
        return
    typer.echo(f"{ranks} ranks, {size_mb:g} MiB, rank {cfg.straggler_rank} {delay_ms:g} ms late, "
               f"{repeats} repeats; result {'correct' if res['correct'] else 'WRONG'}")
    for algo, s in res["algorithms"].items():
        typer.echo(f"  {algo:<10} median {s['median_s'] * 1e3:9.1f} ms  min {s['min_s'] * 1e3:9.1f} ms  "
                   "(after arrival)")
    for base in ("ring", "torch"):
        if f"ratio_vs_{base}" in res:
            typer.echo(f"  StragglAR / {base}: {res[f'ratio_vs_{base}']:.3f}")
    if "predicted" in res:
        pc, pt = res["predicted"]["contended"], res["predicted"]["textbook"]
        typer.echo(f"  model StragglAR / ring: {pc['ratio_vs_ring']:.3f} (with measured contention), "
                   f"{pt['ratio_vs_ring']:.3f} (textbook alpha-beta)")
    if "phase1_hidden_fraction" in res:
        typer.echo(f"  phase 1 done before the straggler arrived in {res['phase1_hidden_fraction']:.0%} of repeats")
    if not res["correct"]:
        raise typer.Exit(1)


def register(parent: typer.Typer) -> None:
    parent.add_typer(app, name="collectives")
    parent.add_typer(bench_app, name="bench")
