"""`laggard run`: launch a training script as torchrun does, traced in every rank, then analyze it.

The launch is torch's own (``torch.distributed.run``: the same rendezvous, restarts and signal
handling as ``torchrun``), with each rank's entry point replaced by ``python -m
laggard.tracer.auto.boot SCRIPT ARGS`` and the tracing settings (``laggard.tracer.auto.env``) in the
environment the workers inherit, so that the script is traced without importing laggard. torch is
imported inside the command only: it costs ~3 s, and every other command starts without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from laggard.errors import LaggardError

BOOT_MODULE = "laggard.tracer.auto.boot"
DEFAULT_ROOT = "laggard-run"  # the default --out is DEFAULT_ROOT/<script stem>-<YYYYmmdd-HHMMSS>
# torchrun's values of --nproc-per-node that are not a count (torch.distributed.run.determine_local_world_size)
NPROC_WORDS = ("auto", "cpu", "gpu", "xpu")
# the signals torchrun's launcher takes over in this process (its --signals-to-handle default); given back after
LAUNCHER_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")

OUT_HELP = (f"Directory to write the trace to (default: {DEFAULT_ROOT}/<script stem>-<YYYYmmdd-HHMMSS>/ under the "
            "current directory). It is created; one that already holds a trace is refused. With --nnodes > 1, "
            "give one every node shares.")


def run(
    script: Annotated[str, typer.Argument(metavar="SCRIPT", show_default=False,
                                          help="The training script (or, with -m, the module) every rank runs.")],
    script_args: Annotated[list[str] | None, typer.Argument(
        metavar="[ARGS]...", show_default=False,
        help="The script's own arguments (everything after SCRIPT goes to the script).")] = None,
    nproc_per_node: Annotated[str | None, typer.Option(
        "--nproc-per-node", "--nproc_per_node", metavar="N",
        help="Ranks per node: a positive integer, or auto, cpu, gpu, xpu as torchrun takes (default 1).")] = None,
    nnodes: Annotated[str | None, typer.Option(
        "--nnodes", metavar="N|MIN:MAX", help="Number of nodes, or the elastic range MIN:MAX (default 1).")] = None,
    node_rank: Annotated[int | None, typer.Option(
        "--node-rank", "--node_rank", help="This node's rank (static rendezvous).")] = None,
    master_addr: Annotated[str | None, typer.Option(
        "--master-addr", "--master_addr", help="Address of the rank-0 node (static rendezvous).")] = None,
    master_port: Annotated[int | None, typer.Option(
        "--master-port", "--master_port", help="Port on the rank-0 node (static rendezvous).")] = None,
    rdzv_backend: Annotated[str | None, typer.Option(
        "--rdzv-backend", "--rdzv_backend", help="Rendezvous backend (torchrun's: static, c10d, etcd, ...).")] = None,
    rdzv_endpoint: Annotated[str | None, typer.Option(
        "--rdzv-endpoint", "--rdzv_endpoint", help="Rendezvous endpoint, HOST[:PORT].")] = None,
    rdzv_id: Annotated[str | None, typer.Option(
        "--rdzv-id", "--rdzv_id", help="Rendezvous id, the same on every node of the job.")] = None,
    standalone: Annotated[bool, typer.Option(
        "--standalone", help="One node, with a local rendezvous on a free port (as torchrun --standalone).")] = False,
    max_restarts: Annotated[int | None, typer.Option(
        "--max-restarts", "--max_restarts", help="Restarts of the worker group after a failure (default 0).")] = None,
    monitor_interval: Annotated[float | None, typer.Option(
        "--monitor-interval", "--monitor_interval",
        help="Seconds between the launcher's checks of its workers (default 0.1).")] = None,
    module: Annotated[bool, typer.Option(
        "--module", "-m", help="SCRIPT is a module name, run as `python -m SCRIPT`.")] = False,
    out: Annotated[Path | None, typer.Option("--out", "-o", help=OUT_HELP, show_default=False)] = None,
    name: Annotated[str | None, typer.Option(
        "--name", help="The job's name in job.json (default: the script's stem).")] = None,
    monitor_url: Annotated[str | None, typer.Option(
        "--monitor-url", help=("Also stream every rank's ops live to this `laggard monitor` collector "
                               "(several comma-separated: failed over in turn)."))] = None,
    token: Annotated[str | None, typer.Option("--token", help="The collector's token (with --monitor-url).")] = None,
    no_analyze: Annotated[bool, typer.Option(
        "--no-analyze", help="Only write the trace: do not load or analyze it at the end.")] = False,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="No launcher log lines and no analysis summary (the trace is still loaded and "
                              "checked, so its warnings show); the script's output, errors and where the trace "
                              "is still print.")] = False,
) -> None:
    """Run a training script as torchrun does, traced in every rank with no change to it, then print
    what `laggard analyze` prints for the trace. The exit code is the script's (128+N for a rank
    killed by signal N)."""
    import sys

    target = _check_target(script, module)
    count = _check_nproc(nproc_per_node)
    min_nodes, max_nodes = _check_nnodes(nnodes)
    _check_options(max_restarts=max_restarts, monitor_interval=monitor_interval, token=token,
                   monitor_url=monitor_url)
    stem = script.rsplit(".", 1)[-1] if module else Path(script).stem
    if max_nodes > 1 and out is None:
        raise LaggardError(f"--nnodes {nnodes}: give --out, a directory every node shares (each node would "
                           "make its own default one)")
    trace_dir = _prepare_out(out, stem, fresh=max_nodes == 1)
    world = count * min_nodes if count is not None and min_nodes == max_nodes else None

    flags = _torchrun_flags(nproc_per_node=nproc_per_node, nnodes=nnodes, node_rank=node_rank,
                            master_addr=master_addr, master_port=master_port, rdzv_backend=rdzv_backend,
                            rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id, standalone=standalone,
                            max_restarts=max_restarts, monitor_interval=monitor_interval)
    boot_args = [*(["-m", script] if module else [script]), *(script_args or [])]
    from laggard.tracer.auto.env import AutoEnv

    env = AutoEnv(trace_dir=str(trace_dir), name=name or stem, monitor_url=monitor_url, token=token).to_env()
    if not quiet:
        ranks = f"{world} rank(s)" if world is not None else "the job's ranks"
        print(f"laggard: running {target} on {ranks}; the trace goes to {trace_dir}", file=sys.stderr, flush=True)
    code, failure = _launch(flags, boot_args, env, trace_dir, quiet=quiet)
    _after_run(trace_dir, failure, world, analyze=not no_analyze, quiet=quiet)
    if code:
        raise typer.Exit(code)


def _after_run(trace_dir: Path, failure: str | None, world: int | None, *, analyze: bool, quiet: bool) -> None:
    """Where the trace is, its analysis (what `laggard analyze` prints) and what is wrong with it."""
    traced = _has_ops(trace_dir)
    _say_where(trace_dir, failure, traced)
    analyzed = _analyze(trace_dir, quiet=quiet) if traced and analyze else False
    for line in _trace_problems(trace_dir, world, analyzed):
        _warn(line)


def _check_options(*, max_restarts: int | None, monitor_interval: float | None, token: str | None,
                   monitor_url: str | None) -> None:
    """One line for a launcher option out of range, or a token without its collector."""
    if max_restarts is not None and max_restarts < 0:
        raise LaggardError(f"--max-restarts must be >= 0 (got {max_restarts})")
    if monitor_interval is not None and not monitor_interval > 0:
        raise LaggardError(f"--monitor-interval must be a positive number of seconds (got {monitor_interval})")
    if token and not monitor_url:
        raise LaggardError("--token is for the collector of --monitor-url; give --monitor-url too")


def _say_where(trace_dir: Path, failure: str | None, traced: bool) -> None:
    """Where the trace is after the launch: with what failed, or a warning when nothing was traced."""
    import sys

    if failure is not None:
        where = "the trace so far is in" if traced else "nothing was traced into"
        print(f"laggard: {failure}; {where} {trace_dir}", file=sys.stderr, flush=True)
    elif traced:
        typer.echo(f"laggard: the trace is in {trace_dir}")
    else:
        _warn(f"{trace_dir}: no ops were traced (no training step ended on any rank)")


def _warn(message: str) -> None:
    import warnings

    from laggard.errors import LaggardWarning

    warnings.warn(message, LaggardWarning, stacklevel=2)


def _check_target(script: str, module: bool) -> str:
    """What the ranks run, checked before anything starts: a script file (or a directory or zip with
    __main__.py, as `python` takes), or with -m a module found on the path `python -m` searches."""
    import os

    if not module:
        p = Path(script)
        if p.is_dir():
            if not (p / "__main__.py").is_file():
                raise LaggardError(f"{script}: a directory without __main__.py, not a script")
        elif not p.is_file():
            raise LaggardError(f"{script}: no such script" + ("" if p.exists() else " (file not found)"))
        elif not os.access(p, os.R_OK):
            raise LaggardError(f"{script}: not readable")
        return script
    if not script or script.startswith(".") or not all(part.isidentifier() for part in script.split(".")):
        raise LaggardError(f"-m {script}: not a module name")
    if not _module_exists(script):
        raise LaggardError(f"-m {script}: no module named {script!r} (looked where `python -m` would)")
    return f"-m {script}"


def _module_exists(name: str) -> bool:
    """Whether ``name`` can be found on the path `python -m` searches (the current directory first),
    without running any of its packages' ``__init__`` (the launcher must not import the user's code)."""
    import importlib.machinery
    import importlib.util
    import os
    import sys

    first, *rest = name.split(".")
    if first in sys.builtin_module_names:
        return not rest
    spec = importlib.machinery.PathFinder.find_spec(first, [os.getcwd(), *sys.path[1:]])
    if spec is None:
        try:  # frozen or meta-path modules (none of them run anything to be found)
            spec = importlib.util.find_spec(first)
        except (ImportError, ValueError):
            return False
    for part in rest:
        if spec is None or not spec.submodule_search_locations:
            return False
        spec = importlib.machinery.PathFinder.find_spec(part, list(spec.submodule_search_locations))
    return spec is not None


def _check_nproc(value: str | None) -> int | None:
    """The ranks per node, when a count (None for torchrun's words, resolved by torchrun)."""
    if value is None:
        return 1
    if value in NPROC_WORDS:
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise LaggardError(f"--nproc-per-node must be a positive integer or one of {', '.join(NPROC_WORDS)} "
                           f"(got {value!r})")
    return n


def _check_nnodes(value: str | None) -> tuple[int, int]:
    if value is None:
        return 1, 1
    parts = value.split(":")
    try:
        lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (0, 0)
    except ValueError:
        lo = hi = 0
    if not 0 < lo <= hi:
        raise LaggardError(f"--nnodes must be N or MIN:MAX, positive integers with MIN <= MAX (got {value!r})")
    return lo, hi


def _prepare_out(out: Path | None, stem: str, *, fresh: bool) -> Path:
    """The trace directory, created, with a probe file written and removed in it: an output that cannot
    be written fails here, before any rank starts (a rank that cannot write loses its trace silently).
    ``fresh``: refuse one that holds a trace already (not for a multi-node job, whose other nodes' ranks
    may have started writing into it)."""
    import os
    import time

    from laggard.errors import check_output
    from laggard.optable.tracedir import JOB_FILE, rank_of

    if out is None:
        base = Path(DEFAULT_ROOT) / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
        out, n = base, 1
        while out.exists():  # two runs in one second
            n += 1
            out = base.with_name(f"{base.name}-{n}")
    check_output(out, "--out", directory=True)
    if fresh and out.is_dir() and any(p.name == JOB_FILE or rank_of(p.name) is not None for p in out.iterdir()):
        raise LaggardError(f"--out {out}: already holds a trace; give a new directory (the ranks would mix "
                           "their shards with the old ones)")
    probe = out / f".laggard-probe-{os.getpid()}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise LaggardError(f"--out {out}: cannot write there ({e.strerror or e})") from None
    return out.resolve()  # the ranks may change directory


def _torchrun_flags(**given: object) -> list[str]:
    """torchrun's flags for the options given (one not given keeps torchrun's default, or its PET_* variable)."""
    flags = []
    for key, value in given.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        flags.append(flag if value is True else f"{flag}={value}")
    return flags


def _launch(flags: list[str], boot_args: list[str], env: dict[str, str], trace_dir: Path, *,
            quiet: bool) -> tuple[int, str | None]:
    """Run the job through ``torch.distributed.run.run``: the exit code and, for a failed job, what failed.
    This process's environment, signal handlers and torch's log levels are given back afterwards."""
    import logging
    import os
    import signal

    try:
        import torch.distributed.run as torchrun
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.elastic.rendezvous.api import RendezvousError
    except ImportError as e:
        raise LaggardError(f"laggard run needs PyTorch with torch.distributed ({e}); "
                           "pip install 'laggard[torch]'") from None
    args = torchrun.get_args_parser().parse_args([*flags, "--module", BOOT_MODULE])
    # set after parsing: argparse never sees the script's arguments, so none of them is taken for a flag
    args.training_script_args = boot_args

    saved_env = dict(os.environ)
    saved_signals = {s: signal.getsignal(getattr(signal, s)) for s in LAUNCHER_SIGNALS if hasattr(signal, s)}
    loggers = [lg for n, lg in logging.Logger.manager.loggerDict.items()
               if n.startswith("torch.distributed") and isinstance(lg, logging.Logger)]
    saved_levels = [(lg, lg.level) for lg in loggers]
    if quiet:
        for lg in loggers:  # the failure itself is still logged (ERROR), and said again below
            lg.setLevel(logging.ERROR)
    os.environ.update(env)  # torchrun's workers inherit this process's environment
    try:
        torchrun.run(args)
        return 0, None
    except ChildFailedError as e:
        rank, failure = _first_failure(e.failures, trace_dir)
        if failure.exitcode < 0:
            sig = _signal_name(-failure.exitcode)
            return 128 - failure.exitcode, f"rank {rank} was killed by {sig} (exit code {128 - failure.exitcode})"
        return failure.exitcode, f"the script exited with code {failure.exitcode} on rank {rank}"
    except SignalException as e:
        signum = int(e.sigval)
        return 128 + signum, f"stopped by {_signal_name(signum)}"
    except (RendezvousError, RuntimeError, ValueError) as e:
        text = str(e).strip().splitlines()
        raise LaggardError(f"the launcher failed: {type(e).__name__}: {text[0] if text else ''}") from None
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        for s, handler in saved_signals.items():
            if handler is not None:
                signal.signal(getattr(signal, s), handler)
        for lg, level in saved_levels:
            lg.setLevel(level)


def _first_failure(failures: dict, trace_dir: Path) -> tuple[int, Any]:
    """The failure that stopped the job. torchrun's is the earliest, but its timestamps are whole seconds,
    taken when its monitor (every 0.1 s) finds a rank dead, so the rank that failed first and the ones it
    took down with it often tie. Of those tied: a rank killed by a signal (other than the SIGTERM torchrun
    stops the rest with) before one that exited with a code (a peer's collective fails once a rank is
    gone), before a SIGTERM; of ranks that exited, the one whose trace closed first (its state file)."""
    import signal

    from laggard.optable.tracedir import read_states

    states = read_states(trace_dir)

    def key(item: tuple[int, tuple[int, Any]]) -> tuple:
        i, (rank, f) = item
        kind = 2 if f.exitcode == -signal.SIGTERM else 0 if f.exitcode < 0 else 1
        closed = states.get(rank, {}).get("updated_unix_s") if kind == 1 else None
        return f.timestamp, kind, closed if isinstance(closed, int | float) else float("inf"), i

    return min(enumerate(failures.items()), key=key)[1]


def _signal_name(signum: int) -> str:
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _has_ops(trace_dir: Path) -> bool:
    from laggard.optable.tracedir import SHARD_RE

    return trace_dir.is_dir() and any(SHARD_RE.match(p.name) for p in trace_dir.iterdir())


def _analyze(trace_dir: Path, *, quiet: bool) -> bool:
    """What `laggard analyze DIR` prints; a trace that cannot be analyzed is a warning (the script's exit
    code stands). Whether it was loaded (its loader then warned about missing or dead ranks)."""
    from laggard.cli.analyze import analyze

    try:
        analyze([trace_dir], quiet=quiet)
    except LaggardError as e:
        _warn(f"cannot analyze the trace: {e}")
        return False
    return True


def _trace_problems(trace_dir: Path, world: int | None, analyzed: bool) -> list[str]:
    """What the trace lacks, where no load said it: the tracer's own checks (``check_trace``) when it
    was not loaded, and the ranks the launch started that left no file at all when job.json does not
    give the world size (the loader compares with that)."""
    import json

    from laggard.optable.tracedir import JOB_FILE, check_trace, rank_of

    lines = [] if analyzed else [line if line.startswith(f"{trace_dir}:") else f"{trace_dir}: {line}"
                                 for line in check_trace(trace_dir)]
    try:
        job_world = json.loads((trace_dir / JOB_FILE).read_text()).get("world_size")
    except (OSError, ValueError, AttributeError):
        job_world = None
    if isinstance(job_world, int) or world is None:
        return lines
    seen = {r for p in trace_dir.iterdir() if (r := rank_of(p.name)) is not None} if trace_dir.is_dir() else set()
    missing = sorted(set(range(world)) - seen)
    if missing and len(missing) == world:
        lines.append(f"{trace_dir}: none of the {world} ranks started left a trace (stopped before tracing began?)")
    elif missing:
        shown = ", ".join(str(r) for r in missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        lines.append(f"{trace_dir}: no trace from rank(s) {shown} of the {world} started; "
                     "what was traced covers the other ranks only")
    return lines


def register(app: typer.Typer) -> None:
    # options stop at SCRIPT: what follows it is the script's (`laggard run -n 2 train.py --out x` gives --out x
    # to train.py), as torchrun parses
    app.command("run", context_settings={"allow_interspersed_args": False})(run)
