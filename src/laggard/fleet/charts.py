"""The fleet report's charts: inline SVG with the per-job report's style (laggard.report.plots)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from laggard.report.plots import BLUE, COMM, COMPUTE, GREY, GRID, INK, RED, figure_svg, new_figure, styled


@styled
def cdf_svg(slowdown: np.ndarray, waste: np.ndarray, *, threshold: float, prefix: str = "cdf") -> str:
    """Two panels: the CDF of the slowdown (with the straggling threshold) and of the waste."""
    fig = new_figure(10.4, 3.3)
    left, right = fig.subplots(1, 2)
    for ax, vals, label, colour in ((left, slowdown, "slowdown S", BLUE), (right, 100 * waste, "waste (%)", RED)):
        v = np.sort(np.asarray(vals, dtype=float))
        if len(v):
            y = np.arange(1, len(v) + 1) / len(v)
            ax.step(np.concatenate([[v[0]], v]), np.concatenate([[0.0], y]), where="post", color=colour, linewidth=1.5)
        ax.set_xlabel(label)
        ax.set_ylabel("share of jobs")
        ax.set_ylim(0, 1.02)
        ax.grid(True, color=GRID, linewidth=0.6)
    left.axvline(threshold, color=INK, linestyle=":", linewidth=0.9)
    if len(slowdown):
        share = float(np.mean(np.asarray(slowdown) >= threshold))
        left.set_title(f"{100 * share:.1f}% of jobs at S >= {threshold:g}")
    return figure_svg(fig, prefix)


@styled
def size_svg(gpus: np.ndarray, slowdown: np.ndarray, *, corr: float | None, prefix: str = "size") -> str:
    """Slowdown against job size (GPUs, log scale)."""
    fig = new_figure(10.4, 3.4)
    ax = fig.add_subplot()
    rng = np.random.default_rng(0)  # jitter on x so jobs of one size do not hide each other
    x = np.asarray(gpus, dtype=float) * np.exp(rng.uniform(-0.08, 0.08, len(gpus)))
    ax.scatter(x, slowdown, s=12, color=BLUE, alpha=0.6, linewidths=0)
    ax.set_xscale("log", base=2)
    ax.axhline(1.0, color=GREY, linewidth=0.8)
    ax.set_xlabel("job size (GPUs)")
    ax.set_ylabel("slowdown S")
    ax.grid(True, color=GRID, linewidth=0.6)
    ax.set_title("rank correlation " + (f"{corr:+.2f}" if corr is not None else "n/a (too few sizes)"))
    return figure_svg(fig, prefix)


@styled
def hbars_svg(labels: Sequence[str], values: Sequence[float], *, xlabel: str, colours: Sequence[str] | None = None,
              prefix: str = "hbars") -> str:
    """Horizontal bars from 0 with their values written at the end."""
    n = len(values)
    fig = new_figure(10.4, 0.8 + 0.3 * max(n, 2))
    ax = fig.add_subplot()
    pos = np.arange(n)
    v = np.asarray(values, dtype=float)
    ax.barh(pos, v, color=list(colours) if colours else BLUE, height=0.66)
    ax.set_yticks(pos, list(labels), fontsize=8.5)
    ax.set_ylim(n - 0.5, -0.5)
    hi = float(v.max()) if n and v.max() > 0 else 1.0
    ax.set_xlim(0, hi * 1.18)
    for p, val in zip(pos, v, strict=True):
        ax.text(val + 0.01 * hi, p, f"{val:,.3g}", va="center", fontsize=8, color=INK)
    ax.set_xlabel(xlabel)
    ax.grid(True, axis="x", color=GRID, linewidth=0.6)
    ax.tick_params(axis="y", length=0)
    return figure_svg(fig, prefix)


KIND_COLOURS = {"compute": COMPUTE, "communication": COMM, "neither": GREY}
