"""Plots of the simulations: E[max] and p99 against the number of workers, policy comparison bars.

Figures are built on matplotlib's object API with the Agg canvas (no pyplot, no global state), so
they work headless and from threads. ``save_figure`` writes PNG (or SVG); ``figure_svg`` returns
SVG text for the HTML report; ``tail_svg`` / ``policy_svg`` do both steps for a result.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

from laggard.errors import LaggardError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from laggard.simulate.policies import PolicyResult
    from laggard.simulate.tail import TailResult

_FORMATS = (".png", ".svg")


def _new_figure(width_in: float, height_in: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def tail_figure(result: TailResult) -> Figure:
    """E[max] and p99 of the barrier against K (log scale), with the closed form where known."""
    fig = _new_figure(6.4, 4.0)
    ax = fig.add_subplot()
    ks = [r.num_workers for r in result.rows]
    ax.plot(ks, [r.mean for r in result.rows], "o-", color="#1f6fb4", label="E[max] (simulated)")
    ax.plot(ks, [r.p99 for r in result.rows], "s--", color="#d1495b", label="p99 of the barrier")
    exact = [(r.num_workers, r.exact_mean) for r in result.rows if r.exact_mean is not None]
    if exact:
        ax.plot([k for k, _ in exact], [v for _, v in exact], "k:", lw=1, label="E[max] (exact)")
    ax.axhline(result.single_worker_mean, color="grey", lw=0.8, ls="-.", label="mean of one worker")
    if result.reference_workers:
        ax.axvline(result.reference_workers, color="#6a994e", lw=0.8, label="measured job size")
        measured = result.source.get("measured_barrier_s")
        if measured is not None:
            ax.plot([result.reference_workers], [measured], "*", ms=11, color="#6a994e",
                    label="measured barrier")
    if len(set(ks)) > 1:
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.minorticks_off()
    ax.set_xlabel("workers K")
    unit = "s" if result.spec.startswith("trace:") else "time units"
    ax.set_ylabel(f"barrier time ({unit})")
    ax.set_title(_short(result.dist), fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def policy_figure(result: PolicyResult) -> Figure:
    """Mean and p99 step time per policy, with the cost written under each bar."""
    import numpy as np

    fig = _new_figure(max(6.4, 1.1 * len(result.rows) + 1.5), 4.2)
    ax = fig.add_subplot()
    x = np.arange(len(result.rows))
    means = [r.mean for r in result.rows]
    p99s = [r.p99 for r in result.rows]
    ax.bar(x - 0.2, means, width=0.4, color="#1f6fb4", label="mean step")
    ax.bar(x + 0.2, p99s, width=0.4, color="#d1495b", alpha=0.8, label="p99 step")
    labels = []
    for r in result.rows:
        cost = []
        if r.compute_multiplier > 1.005:
            cost.append(f"{r.compute_multiplier:.3g}x compute")
        if r.gradient_lost > 0:
            cost.append(f"-{r.gradient_lost:.1%} grad")
        if r.staleness is None:
            cost.append("stale: unbounded")
        elif r.staleness:
            cost.append(f"stale <= {r.staleness}")
        labels.append(r.policy + ("\n" + "\n".join(cost) if cost else ""))
    ax.set_xticks(x, labels, fontsize=7)
    for xi, r in zip(x, result.rows, strict=True):
        if r.barrier_cut:
            ax.annotate(f"{-r.barrier_cut:+.0%}", (xi - 0.2, r.mean), ha="center", va="bottom", fontsize=7)
    unit = "s" if result.spec.startswith("trace:") else "time units"
    ax.set_ylabel(f"step time ({unit})")
    ax.set_title(f"K = {result.num_workers}: {_short(result.dist)}", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _short(text: str, limit: int = 90) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def figure_svg(fig: Figure) -> str:
    """The figure as SVG text (deterministic ids, no date) for embedding in HTML."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "laggard", "svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write the figure as PNG (or SVG, by the file suffix)."""
    p = Path(path)
    if p.suffix.lower() not in _FORMATS:
        raise LaggardError(f"--plot {p}: the file name must end in {' or '.join(_FORMATS)}")
    if p.parent and not p.parent.exists():
        raise LaggardError(f"--plot {p}: directory {p.parent} does not exist")
    if p.suffix.lower() == ".svg":
        p.write_text(figure_svg(fig))
    else:
        fig.savefig(p, format="png")
    return p


def tail_svg(result: TailResult) -> str:
    return figure_svg(tail_figure(result))


def policy_svg(result: PolicyResult) -> str:
    return figure_svg(policy_figure(result))
