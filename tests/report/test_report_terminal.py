"""Terminal summaries fit an 80-column terminal: no line over 80, no word of a finding broken
across lines, and every suggested command printed whole (backslash continuations) so it runs."""

from __future__ import annotations

import io
import re
import shlex
import subprocess

import pytest
from rich.console import Console

from laggard.report.findings import command_lines
from laggard.report.terminal import print_summary
from laggard.results.analysis import Analysis


def _render(res: Analysis, width: int = 80) -> str:
    con = Console(width=width, record=True, file=io.StringIO(), highlight=False)
    print_summary(res, con)
    return con.export_text()


def _words_intact(text: str, sentence: str) -> list[str]:
    """Words of ``sentence`` that do not appear whole in ``text`` (a word folded across lines)."""
    tokens = set(re.split(r"[\s│┃]+", text))
    return [w for w in sentence.split() if w not in tokens]


@pytest.mark.parametrize("name", ["AR", "ST"])
def test_summary_fits_80_columns(name: str, analyses: dict[str, Analysis]) -> None:
    res = analyses[name]
    text = _render(res)
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= 80, [ln for ln in lines if len(ln) > 80]
    assert res.diagnosis is not None and res.diagnosis.findings
    for f in res.diagnosis.findings:
        assert _words_intact(text, f.evidence) == [] and _words_intact(text, f.fix_text) == []
        # the command, joined back as a shell would, is the finding's command exactly
        i = next(k for k, ln in enumerate(lines) if ln.startswith("laggard whatif"))
        cmd_lines = [lines[i]]
        while cmd_lines[-1].endswith(" \\"):
            i += 1
            cmd_lines.append(lines[i])
        joined = " ".join(ln.removesuffix(" \\").strip() for ln in cmd_lines)
        assert shlex.split(joined) == shlex.split(f.command)
    assert "op type" in text and "worst workers" in text
    # op types and workers are two tables, one under the other: no row holds an op type and a rank
    shown = [ln for ln in lines if any(ln.startswith(name[:20]) for name in res.by_optype)]
    assert shown and all(len(ln.split()) == 2 for ln in shown), shown


def test_command_lines_run_in_bash() -> None:
    cmd = ("laggard whatif 'my traces/trace ST.parquet' --scale stage=3,optype=backward-compute:0.704357 "
           "--scale stage=3,optype=forward-compute:0.48064 --peer rank=0,kind=compute --steps 10-20")
    lines = command_lines(cmd, width=60)
    assert len(lines) > 1 and all(len(ln) <= 60 for ln in lines)
    script = "printf '%s\\n' " + "\n".join(lines).removeprefix("laggard whatif ")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == shlex.split(cmd)[2:]


def test_wrong_wrapping_is_caught(analyses: dict[str, Analysis]) -> None:
    """The checks above fail on output that folds words (a console narrower than the longest word)."""
    res = analyses["ST"]
    text = _render(res, width=40)
    f = res.diagnosis.findings[0]
    assert _words_intact(text, f.evidence + " " + f.fix_text) != []


def test_a_job_that_ran_on_cpus_counts_rank_hours_not_gpu_hours(analyses: dict[str, Analysis]) -> None:
    """A `laggard run` trace of gloo ranks on the CPU (its job.json: host clock timing, every rank's
    host known and naming no GPU) says rank-hours on CPU ranks; a GPU job's trace still says GPU-hours."""
    import warnings
    from pathlib import Path

    from laggard.analysis.pipeline import analyze
    from laggard.errors import LaggardWarning
    from laggard.io import load_job
    from laggard.optable.hosts import cpu_job

    trace = Path(__file__).parents[1] / "data" / "corpus" / "zc_loader_w2_clean" / "trace"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaggardWarning)
        res = analyze(load_job(trace))
    text = _render(res)
    assert "rank-hours wasted" in text and "(2 CPU ranks)" in text and "GPU-hours" not in text
    assert "GPU-hours wasted" in _render(analyses["AR"])
    gpu = {**res.meta.extra, "hosts": [{**h, "gpu_name": "NVIDIA H100"} for h in res.meta.extra["hosts"]]}
    assert cpu_job(res.meta.extra) and not cpu_job(gpu) and not cpu_job({**res.meta.extra, "hosts": []})
