"""Fuzz every `laggard` command and flag (Hypothesis): bad input is one line and exit 2, never a traceback.

The commands and their flags are read from the CLI itself (click's tree), so a new command or flag
is fuzzed without touching this file. Each flag's values are drawn by its type and name: paths
(missing, a directory, empty, truncated or corrupt Parquet/JSON/YAML, an existing file, under a file,
unwritable), numbers (negative, NaN, inf, huge, text), selectors, step ranges, formats, layouts.

The CLI runs in-process through ``laggard.cli.base.main`` (what the console script calls after
``lean_process``): an exception escaping it is what a user would see as a traceback. Commands that
run for long (training, servers, real multi-process benchmarks) only get arguments that fail while
parsing. Examples the fuzzer once found to fail are kept in ``REGRESSIONS`` and run every time.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import click
import pytest
import typer

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is in the dev extra: pip install -e '.[dev]'")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.conftest import DATA, ND, run_cli  # noqa: E402

# Commands that train, serve or start real process groups: only arguments that fail while parsing.
PARSE_ONLY = {"demo", "monitor serve", "monitor relay", "bench allreduce"}
# Values that would start long or external work however valid the rest is.
NEVER = {("fleet", "--engine"): {"ray"}, ("fleet", "--ray-address"): None, ("collectives model", "--calibrate"): None}
# Where a command's default runs for long (many trials, a process per CPU), this value is given
# unless the example draws the option itself: the fuzz test is about input, not throughput.
QUICK = {("simulate tail", "--trials"): "50", ("simulate policy", "--trials"): "50",
         ("simulate policy", "--steps"): "20", ("collectives simulate", "--trials"): "50",
         ("collectives simulate", "--ranks"): "8", ("fleet", "--workers"): "0", ("dessim", "--steps"): "2"}
# Examples per command: the whole test stays under a minute on a busy 2-core machine; fleet (a
# run per example) and monitor push (retries an unreachable collector for ~2 s) cost the most.
# LAGGARD_FUZZ_SCALE=10 for a longer hunt.
EXAMPLES = {"*": 30, "fleet": 10, "monitor push": 6}
# An example taking longer than this is a failure too (a flag that makes a command run away).
EXAMPLE_LIMIT_S = 60
MAX_LINE_CHARS = 600

# ---------------------------------------------------------------- the files the paths name

# Hypothesis draws the first values of a list most often: a good value first, so that most
# examples get past the file checks and reach the option being fuzzed.
INPUTS = ("tiny", "st", "kineto", "missing", "dir", "empty", "empty_json", "trunc_parquet", "corrupt_parquet",
          "trunc_json", "bad_json", "bad_yaml", "text", "proc", "exists_dir", "dash")
# (outputs never name the input fixtures: `fresh` restores only what outputs may change)
OUTPUTS = ("out_new", "out_new_dir", "dash", "exists_json", "exists_dir", "under_file", "proc", "missing")
INPUT_PARAMS = {"path", "paths", "trace", "from_trace", "meta", "rank_map"}


def _make_files(root: Path) -> dict[str, str]:
    from laggard.groundtruth.synth import SynthConfig, synthesize
    from laggard.optable.ops import write_native

    st_bytes = (ND / "trace-ST.parquet").read_bytes()
    (root / "dir").mkdir()
    (root / "empty.parquet").write_bytes(b"")
    (root / "empty.json").write_bytes(b"")
    (root / "trunc.parquet").write_bytes(st_bytes[: len(st_bytes) // 2])
    (root / "corrupt.parquet").write_bytes(b"PAR1" + b"\x00garbage" * 50 + b"PAR1")
    kj = (DATA / "kineto" / "ddp_gloo" / "rank0.json.gz").read_bytes()
    (root / "trunc.json.gz").write_bytes(kj[: len(kj) // 3])
    (root / "bad.json").write_text('{"traceEvents": [{"ph": "X", "name": ')
    (root / "bad.yaml").write_text("dp_size: [1, 2\n")
    (root / "notes.txt").write_text("hello\n")
    (root / "file").write_text("x")
    (root / "exists.json").write_text("{}")
    (root / "exists_dir").mkdir()
    write_native(synthesize(SynthConfig(dp=2, pp=2, steps=3, microbatches=2)), root / "tiny")
    shutil.copy(ND / "trace-ST.parquet", root / "trace-ST.parquet")
    shutil.copy(ND / "meta-ST.yaml", root / "meta-ST.yaml")
    return {
        "missing": str(root / "no" / "such.parquet"), "dir": str(root / "dir"), "empty": str(root / "empty.parquet"),
        "empty_json": str(root / "empty.json"), "trunc_parquet": str(root / "trunc.parquet"),
        "corrupt_parquet": str(root / "corrupt.parquet"), "trunc_json": str(root / "trunc.json.gz"),
        "bad_json": str(root / "bad.json"), "bad_yaml": str(root / "bad.yaml"), "text": str(root / "notes.txt"),
        "under_file": str(root / "file" / "out.json"), "proc": "/proc/laggard-fuzz/x.json",
        "exists_json": str(root / "exists.json"), "exists_dir": str(root / "exists_dir"),
        "out_new": str(root / "out" / "new.json"), "out_new_dir": str(root / "newdir"),
        "tiny": str(root / "tiny"), "st": str(root / "trace-ST.parquet"), "meta": str(root / "meta-ST.yaml"),
        "kineto": str(DATA / "kineto" / "ddp_gloo"), "dash": "-",
    }


# ---------------------------------------------------------------- values by type and flag name

INTS = ("2", "-1", "0", "1", "2", "3", "-7", "nan", "inf", "abc", "", "1e3", "2147483648", "99999999999999", "9" * 30)
FLOATS = ("0.5", "-1", "0", "1", "2", "nan", "inf", "-inf", "1e308", "1e-300", "abc", "", "-0.0", "0x10")
SELECTORS = ("all", "garbage", "rank=abc", "rank=1", "kind!=", "kind!=comm", "A,,B", "stage=", "=3", "stage=1",
             "worker=dp0:pp", "worker=dp0:pp1", "worker=dp9:pp9", "optype=forward-compute", "comm", "compute",
             "stage=1:fast", "stage=1:0.5", "stage=1:-1", "stage=1:nan", "rank=1,,rank=2", "step=1-", "dp=1e9",
             "step=0", ":", ",", "rank=99999999999999999999")
STEPS = ("1-2", "", "-", "5-1", "a-b", "1--2", "99999999999999999999", "-5", "1,,2", "0-0", "0", "1-2", "0-999999", ",")
FORMATS = ("auto", "native", "ndtimeline", "kineto", "xml", "")
LAYOUTS = ("dp=4", "dp=2,pp=2", "dp=0", "dp=-1,pp=2", "pp=2,pp=2", "x=1", "dp=1e9,pp=1", "", ",", "dp=2,pp=2,tp=1")
INJECT = ("slow-worker:rank=1,factor=2", "slow-worker:rank=abc", "slow-worker:factor=nan", "nope", "slow-worker:",
          ":", "slow-worker:rank=1,rank=2", "stage-imbalance:stage=9,factor=2", "slow-worker:factor=-1")
DISTS = ("lognormal:base=1.0,mean=-0.7,sigma=0.9", "garbage", "lognormal:sigma=nan", "constant", "pareto:alpha=-1",
         "uniform:low=2,high=1", "trace", "mixture:", "exponential:scale=inf", "")
RANKS = ("4", "8", "0", "-1", "1", "abc", "8,64", "1,,2", "2,4", "99999999999", "")
POLICIES = ("none", "garbage", "backup:k=1", "backup:k=-1", "timeout:s=nan", "")
TEXT = ("", "x", "abc", "-", "nan", "::", "a,,b", "kind!=", "=", "\x7f", "-1")

_BY_NAME: dict[str, tuple[str, ...]] = {
    "--fix": SELECTORS, "--zero": SELECTORS, "--scale": SELECTORS, "--peer": SELECTORS, "--even": SELECTORS,
    "--despike": SELECTORS, "--format": FORMATS, "--layout": LAYOUTS, "--inject": INJECT, "--cause": INJECT,
    "--dist": DISTS, "--ranks": RANKS, "--workers": RANKS, "--policy": POLICIES, "--optype": SELECTORS,
    "--layers-per-stage": ("1,1", "2,2", "a,b", "-1,3", "", "1,,1", "0,0"), "--engine": ("local", "bogus", ""),
    "--algorithms": ("stragglar,ring", "bogus", ""), "--url": ("http://127.0.0.1:9", "not a url", ""),
}


def _values(cmd: str, param: click.Parameter) -> st.SearchStrategy[str]:
    name = param.opts[0]
    never = NEVER.get((cmd, name)) or set()
    if param.name in INPUT_PARAMS or isinstance(param.type, click.Path) or "Path" in type(param.type).__name__:
        keys = INPUTS if param.name in INPUT_PARAMS else OUTPUTS
        if name == "--meta":
            keys = ("meta", *keys[3:])
        return st.sampled_from(keys).map(lambda k: "@" + k)
    if name == "--steps" and isinstance(param.type, click.types.StringParamType):
        pool: tuple[str, ...] = STEPS
    elif name in _BY_NAME and isinstance(param.type, click.types.StringParamType):
        pool = _BY_NAME[name]
    elif isinstance(param.type, click.types.IntParamType):
        return st.one_of(st.sampled_from(INTS), st.integers(-3, 12).map(str))
    elif isinstance(param.type, click.types.FloatParamType):
        return st.one_of(st.sampled_from(FLOATS), st.floats(-2, 4, allow_nan=False).map(repr))
    else:
        pool = TEXT
    return st.sampled_from([v for v in pool if v not in never])


def _commands() -> dict[str, click.Command]:
    from laggard.cli.base import app

    out: dict[str, click.Command] = {}

    def walk(c: click.Command, prefix: list[str]) -> None:
        if isinstance(c, click.Group):
            for n, sub in c.commands.items():
                walk(sub, [*prefix, n])
        else:
            out[" ".join(prefix)] = c

    walk(typer.main.get_command(app), [])
    return out


COMMANDS = _commands()


@st.composite
def argvs(draw: st.DrawFn, name: str) -> list[str]:
    """A command line: the command ``name``, its arguments, and a few of its options with drawn values."""
    cmd = COMMANDS[name]
    argv = name.split()
    if name in PARSE_ONLY:  # a value click rejects, or a flag that does not exist
        ints = [p for p in cmd.params if isinstance(p.type, click.types.IntParamType) and p.opts[0].startswith("--")]
        if ints and draw(st.booleans()):
            return [*argv, draw(st.sampled_from(ints)).opts[0], draw(st.sampled_from(("abc", "", "1.5", "nan")))]
        return [*argv, draw(st.sampled_from(("--no-such-flag", "--help-me", "-Z")))]
    for p in cmd.params:
        if isinstance(p, click.Argument):
            n = draw(st.integers(0 if not p.required else 1, 2 if p.nargs == -1 else 1))
            argv += [draw(_values(name, p)) for _ in range(n)]
    options = [p for p in cmd.params if isinstance(p, click.Option) and NEVER.get((name, p.opts[0]), ()) is not None]
    chosen = draw(st.lists(st.sampled_from(options), max_size=4, unique_by=lambda p: p.name)) if options else []
    required = [p for p in options if p.required and p not in chosen]
    for p in required + chosen:
        if p.is_flag:
            argv.append(p.opts[0] if p.default is not True or not p.secondary_opts else p.secondary_opts[0])
            continue
        argv += [p.opts[0], draw(_values(name, p))]
    for (c, opt), value in QUICK.items():
        if c == name and opt not in argv:
            argv += [opt, value]
    if draw(st.integers(0, 30)) == 30:
        argv.append("--no-such-flag")
    return argv


# ---------------------------------------------------------------- the property


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("fuzz")
    paths = _make_files(root)
    cwd = os.getcwd()
    work = root / "cwd"  # commands with default output paths (fleet-out, out/demo) write here
    work.mkdir()
    os.chdir(work)
    yield paths
    os.chdir(cwd)


def fresh(files: dict[str, str]) -> None:
    """New output paths each time: out/ and exists_dir/ exist and are empty, exists.json holds '{}',
    newdir/, no/ and the working directory's default outputs (fleet-out, ...) are gone."""
    for d in (Path(files["out_new"]).parent, Path(files["exists_dir"])):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
    for d in (Path(files["out_new_dir"]), Path(files["missing"]).parent):
        shutil.rmtree(d, ignore_errors=True)
    Path(files["exists_json"]).write_text("{}")
    for p in Path.cwd().iterdir():
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()


def _on_alarm(signum, frame):  # noqa: ANN001
    raise TimeoutError(f"the command ran for over {EXAMPLE_LIMIT_S} s")


def check(argv: list[str], files: dict[str, str], capfd: pytest.CaptureFixture[str]) -> None:
    """Run ``laggard ARGV`` in-process: no exception escapes, exit 0 or 2, a failure is one short line."""
    args = [files[a[1:]] if a.startswith("@") and a[1:] in files else a for a in argv]
    fresh(files)
    capfd.readouterr()
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(EXAMPLE_LIMIT_S)
    try:
        code = run_cli(*args)
    except BaseException as e:  # what the console script would show as a traceback
        err = capfd.readouterr().err
        raise AssertionError(f"laggard {' '.join(argv)}: {type(e).__name__}: {e}\n{err[-2000:]}") from e
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    out, err = capfd.readouterr()
    where = f"laggard {' '.join(argv)} -> exit {code}\n{err[-2000:]}"
    assert "Traceback (most recent call last)" not in out + err, where
    assert code in (0, 2), where
    if code == 2:
        lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("laggard: warning: ")]
        assert len(lines) == 1 and lines[0].startswith("laggard: error: "), where
        assert len(lines[0]) <= MAX_LINE_CHARS, where


# Examples the fuzzer found (each fixed since): kept so they never come back.
BIG = "9" * 30
REGRESSIONS: list[list[str]] = [
    ["collectives", "simulate", "--seed", "-1", "--trials", "50", "--ranks", "8"],  # numpy ValueError
    ["synth", "--out", "@out_new_dir", "--seed", "-1"],
    ["dessim", "@out_new_dir", "--seed", "-1", "--steps", "2"],
    ["synth", "--out", "@out_new_dir", "--dp", BIG],  # OverflowError
    ["synth", "--out", "@out_new_dir", "--steps", BIG, "--dp", BIG],  # ValueError: maximum allowed size
    ["synth", "--out", "@out_new_dir", "--dp", "2147483648"],  # MemoryError
    ["dessim", "@out_new_dir", "--dp", "2147483648", "--pp", BIG, "--steps", "2"],  # ValueError: dimension
    ["dessim", "@out_new_dir", "--vpp", "2147483648", "--steps", "2"],  # MemoryError (4 TiB)
    ["dessim", "@text"],  # was 'cannot read or write ...: File exists' after the simulation
    ["synth", "--out", "@dash"],  # wrote a directory named '-'
    ["fleet", "@corrupt_parquet", "--out", "@out_new_dir", "--workers", "99999999999999", "--quiet"],  # OverflowError
    ["monitor", "push", "@st", "--url", "http://127.0.0.1:9", "--speed", "1e-300"],  # OverflowError in sleep
]


@pytest.mark.parametrize("argv", REGRESSIONS, ids=lambda a: " ".join(a)[:60])
def test_regressions(argv: list[str], files: dict[str, str], capfd: pytest.CaptureFixture[str]) -> None:
    check(argv, files, capfd)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_no_traceback_on_any_command_line(command: str, files: dict[str, str],
                                          capfd: pytest.CaptureFixture[str]) -> None:
    """Each command gets its own examples (a share of one pool would leave some with a handful)."""
    examples = round(EXAMPLES.get(command, EXAMPLES["*"]) * float(os.environ.get("LAGGARD_FUZZ_SCALE", "1")))

    @settings(max_examples=max(examples, 1), deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(argv=argvs(command))
    def one(argv: list[str]) -> None:
        check(argv, files, capfd)

    one()


def test_every_command_is_fuzzed() -> None:
    assert {"analyze", "whatif", "convert", "synth", "partition", "fit-cost", "hang", "fleet", "dessim",
            "simulate tail", "simulate policy", "collectives verify", "monitor push"} <= set(COMMANDS)


@pytest.mark.parametrize("argv", [["analyze", "@trunc_parquet"], ["whatif", "@tiny", "--fix", "rank=abc"],
                                  ["synth", "--out", "@out_new_dir", "--dp", BIG]])
def test_console_script_says_the_same(argv: list[str], files: dict[str, str],
                                      capfd: pytest.CaptureFixture[str]) -> None:
    """The in-process run stands for the console script: a sample gives the same exit code and line."""
    import subprocess
    import sys

    args = [files[a[1:]] if a.startswith("@") else a for a in argv]
    fresh(files)
    code = run_cli(*args)
    line = capfd.readouterr().err.strip().splitlines()[-1]
    fresh(files)
    exe = Path(sys.executable).with_name("laggard")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "from laggard.cli.base import entry; entry()"]
    res = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in res.stderr
    assert (res.returncode, res.stderr.strip().splitlines()[-1]) == (code, line)
