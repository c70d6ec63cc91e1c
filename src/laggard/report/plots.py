"""Charts for the HTML report: matplotlib figures rendered to small, self-contained SVG strings.

Every chart is one function returning SVG text ready to inline in HTML: text stays text
(``svg.fonttype = 'none'``, no embedded glyphs), ids are deterministic and prefixed per chart so
several charts can share one page, and the XML prolog and metadata are dropped. Figures use
matplotlib's object API on the Agg canvas (no pyplot, no global state); matplotlib is imported
lazily, inside the functions, so ``import laggard.report.plots`` is cheap.
"""

from __future__ import annotations

import functools
import io
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import numpy as np

from laggard.errors import LaggardError

if TYPE_CHECKING:
    from matplotlib.colors import Colormap
    from matplotlib.figure import Figure

# palette shared with the page's CSS
INK = "#1f2933"
MUTED = "#616e7c"
GRID = "#d9dee4"
BLUE = "#2f6db3"
GREEN = "#3c8d5a"
ORANGE = "#e07b24"
RED = "#c8382c"
GREY = "#9aa5b1"
COMPUTE = "#2f6db3"
COMM = "#e07b24"
HEAT_COLOURS = ("#f3f5f7", "#fde4a8", "#f6a04d", "#dc4b2f", "#8c1010")
# colour scales of slowdowns (S_w, S per step) start at HEAT_LO, the value of no slowdown, never at
# the data's smallest value: a grid of 1.115-1.149 is a mild slowdown everywhere, not white to red
HEAT_LO = 1.0
# ...and span at least [1, 1 + MIN_SPAN]: a worker that alone makes the step 1.5x as long is the
# darkest red, while the 1.0-1.15 healthy workers of a shared host read stays in the pale first third
MIN_SPAN = 0.5
_RC = {
    "svg.fonttype": "none",
    "svg.hashsalt": "laggard",
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Liberation Sans", "Arial", "Helvetica"],
    "font.size": 9,
    "axes.edgecolor": GREY,
    "axes.labelcolor": INK,
    "axes.titlesize": 10,
    "axes.titleweight": "bold",
    "axes.titlecolor": INK,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "xtick.color": MUTED,
    "ytick.color": MUTED,
    "xtick.labelcolor": INK,
    "ytick.labelcolor": INK,
    "legend.frameon": False,
    "legend.fontsize": 8,
}


def _mpl() -> None:
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        raise LaggardError("the HTML report needs matplotlib: pip install 'laggard[report]'") from None


_P = ParamSpec("_P")
_R = TypeVar("_R")


def styled(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run a chart function with the report's matplotlib style (a local rc context)."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        _mpl()
        import matplotlib

        with matplotlib.rc_context(_RC):
            return fn(*args, **kwargs)

    return wrapper


def new_figure(width_in: float, height_in: float) -> Figure:
    """A figure on the Agg canvas (constrained layout); call it inside a :func:`styled` function."""
    _mpl()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=96, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def figure_svg(fig: Figure, prefix: str, *, titles: Mapping[str, str] | None = None) -> str:
    """The figure as inline SVG: ids prefixed with ``prefix-``, no prolog/metadata, scalable.

    ``titles`` maps an artist gid to a tooltip, added as the SVG ``<title>`` of that group.
    """
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context(_RC):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None}, transparent=True)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.S)
    svg = re.sub(r'\bid="([^"]+)"', rf'id="{prefix}-\1"', svg)
    svg = re.sub(r"url\(#([^)]+)\)", rf"url(#{prefix}-\1)", svg)
    svg = re.sub(r'xlink:href="#([^"]+)"', rf'xlink:href="#{prefix}-\1"', svg)
    svg = svg.replace("<svg ", f'<svg class="chart-svg" role="img" aria-label="{prefix}" ', 1)
    if titles:
        from html import escape

        def add_title(m: re.Match[str]) -> str:
            tip = titles.get(m.group(1))
            return m.group(0) if tip is None else f"{m.group(0)}<title>{escape(tip)}</title>"

        svg = re.sub(rf'<g id="{re.escape(prefix)}-([^"]+)">', add_title, svg)
    return svg


@functools.cache
def heat_cmap() -> Colormap:
    """The heatmap's colour map: pale grey at S = 1 through amber to dark red."""
    _mpl()
    from matplotlib.colors import LinearSegmentedColormap

    return LinearSegmentedColormap.from_list("laggard-heat", list(HEAT_COLOURS)).with_extremes(bad="#ffffff")


def heat_vmax(values: np.ndarray | Sequence[float]) -> float:
    """Upper end of the colour scale: the largest value, but at least HEAT_LO + MIN_SPAN."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return max(HEAT_LO + MIN_SPAN, float(v.max()) if len(v) else HEAT_LO)


def heat_range(values: np.ndarray | Sequence[float]) -> tuple[float, float]:
    """The colour scale of slowdown-like ``values``: (HEAT_LO, :func:`heat_vmax`); values under 1
    (noise: ideal durations are averages) take the palest colour."""
    return HEAT_LO, heat_vmax(values)


def heat_colour(value: float, vmax: float) -> str:
    """The heatmap colour of ``value`` (scale [HEAT_LO, vmax]) as #rrggbb, for HTML tables."""
    from matplotlib.colors import to_hex

    if not np.isfinite(value):
        return "#ffffff"
    x = min(max((value - HEAT_LO) / max(vmax - HEAT_LO, 1e-12), 0.0), 1.0)
    return str(to_hex(heat_cmap()(x)))


def text_on(colour: str) -> str:
    """Black or white, whichever reads better on ``colour`` (#rrggbb)."""
    r, g, b = (int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return "#ffffff" if 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.5 else INK


@styled
def heatmap_svg(
    grid: np.ndarray,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    *,
    cell_ids: Sequence[Sequence[str]],
    tooltips: Sequence[Sequence[str]] | None = None,
    highlight: Sequence[tuple[int, int]] = (),
    bands: Sequence[tuple[int, str]] = (),
    annotate: bool | None = None,
    xlabel: str = "pipeline stage",
    ylabel: str = "DP rank",
    cbar_label: str = "S_w",
    prefix: str = "heat",
) -> str:
    """A rows x columns heatmap on the :func:`heat_range` scale, one SVG group per cell (gid ``cell_ids``).

    NaN cells are drawn empty (hatched). ``highlight`` cells get a dark outline (gid ``hot-...``
    derived from the cell id); ``bands`` (column, gid) outline whole columns. Values are written in the
    cells when ``annotate`` (default: small grids).
    """
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    grid = np.asarray(grid, dtype=float)
    nr, nc = grid.shape
    if annotate is None:
        annotate = nr <= 40 and nc <= 24
    cell_h = 0.46 if annotate else max(0.12, min(0.3, 7.0 / max(nr, 1)))
    cell_w = min(1.1, 6.4 / max(nc, 1))
    label_w = 0.35 + 0.065 * max((len(s) for s in row_labels), default=4)
    fig = new_figure(max(4.8, label_w + nc * cell_w + 1.5), 0.95 + nr * cell_h)
    ax = fig.add_subplot()
    cmap = heat_cmap()
    norm = Normalize(*heat_range(grid), clip=True)
    titles = _heat_cells(ax, grid, cmap, norm, cell_ids, tooltips, annotate=annotate)
    _heat_outlines(ax, nr, cell_ids, highlight, bands, lw=2.2 if annotate else 1.3)
    _heat_axes(ax, nr, nc, row_labels, col_labels, xlabel=xlabel, ylabel=ylabel)
    cb = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, fraction=0.08, pad=0.02, aspect=25,
                      shrink=1.0 if nr > 4 else 0.95)
    cb.set_label(cbar_label)
    cb.outline.set_visible(False)
    cb.ax.tick_params(labelsize=7)
    return figure_svg(fig, prefix, titles=titles)


def _heat_cells(ax: Any, grid: np.ndarray, cmap: Any, norm: Any, cell_ids: Sequence[Sequence[str]],
                tooltips: Sequence[Sequence[str]] | None, *, annotate: bool) -> dict[str, str]:
    """One patch per cell (gid its cell id; NaN: empty, hatched), its value written in it when
    ``annotate``; returns the cells' tooltips by gid."""
    from matplotlib.patches import Rectangle

    titles: dict[str, str] = {}
    nr, nc = grid.shape
    for r in range(nr):
        for c in range(nc):
            v = grid[r, c]
            if np.isfinite(v):
                patch = Rectangle((c, r), 1, 1, facecolor=cmap(norm(v)), edgecolor="#ffffff", linewidth=0.8)
            else:
                patch = Rectangle((c, r), 1, 1, facecolor="#ffffff", edgecolor=GRID, hatch="///", linewidth=0.5)
            patch.set_gid(cell_ids[r][c])
            ax.add_patch(patch)
            if tooltips is not None:
                titles[cell_ids[r][c]] = tooltips[r][c]
            if annotate and np.isfinite(v):
                colour = text_on(_hex(cmap(norm(v))))
                ax.text(c + 0.5, r + 0.5, f"{v:.2f}", ha="center", va="center", fontsize=9, color=colour)
    return titles


def _heat_outlines(ax: Any, nr: int, cell_ids: Sequence[Sequence[str]], highlight: Sequence[tuple[int, int]],
                   bands: Sequence[tuple[int, str]], *, lw: float) -> None:
    """Dark outlines: around each ``highlight`` cell (gid ``hot-...``) and each band's whole column."""
    from matplotlib.patches import Rectangle

    for r, c in highlight:
        outline = Rectangle((c + 0.04, r + 0.04), 0.92, 0.92, fill=False, edgecolor=INK, linewidth=lw)
        outline.set_gid("hot-" + cell_ids[r][c].removeprefix("cell-"))
        ax.add_patch(outline)
    for c, gid in bands:
        band = Rectangle((c + 0.03, 0.03), 0.94, nr - 0.06, fill=False, edgecolor=INK, linewidth=lw + 0.4)
        band.set_gid(gid)
        ax.add_patch(band)


def _heat_axes(ax: Any, nr: int, nc: int, row_labels: Sequence[str], col_labels: Sequence[str], *, xlabel: str,
               ylabel: str) -> None:
    """Row labels down the left, column labels along the top, no ticks or spines."""
    ax.set_xlim(0, nc)
    ax.set_ylim(nr, 0)
    ax.set_aspect("auto")
    ax.set_xticks(np.arange(nc) + 0.5, list(col_labels), fontsize=8 if nc <= 24 else 6)
    ax.set_yticks(np.arange(nr) + 0.5, list(row_labels), fontsize=8 if nr <= 40 else 6)
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.tick_params(length=0)
    for s in ax.spines.values():
        s.set_visible(False)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)


def _hex(rgba: tuple[float, ...]) -> str:
    from matplotlib.colors import to_hex

    return str(to_hex(rgba))


@styled
def per_step_svg(
    steps: Sequence[int],
    slowdown: Sequence[float],
    traced_s: Sequence[float],
    replayed_s: Sequence[float],
    ideal_s: Sequence[float],
    *,
    overall: float,
    width_in: float = 10.4,
    prefix: str = "steps",
) -> str:
    """Two panels over the steps: step times (traced, replayed, ideal) and the per-step slowdown.

    Steps are drawn evenly spaced in trace order, labelled with their numbers; gaps in the
    numbering are marked with faint vertical lines.
    """
    num = np.asarray(steps, dtype=np.int64)
    n = len(num)
    x = np.arange(n)
    marker = "o" if n <= 120 else None
    fig = new_figure(width_in, 4.6)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[1.1, 1])
    kw = {"marker": marker, "markersize": 3.0, "linewidth": 1.3}
    top.plot(x, traced_s, color=GREY, label="traced", **kw)
    top.plot(x, replayed_s, color=BLUE, label="replayed (measured durations)", **kw)
    top.plot(x, ideal_s, color=GREEN, linestyle="--", label="ideal (no stragglers)", **kw)
    top.set_ylabel("step time (s)")
    top.set_ylim(bottom=0)
    top.grid(True, axis="y", color=GRID, linewidth=0.6)
    top.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=3, borderaxespad=0.2)
    s = np.asarray(slowdown, dtype=float)
    bottom.plot(x, s, color=RED, label="S of the step", **kw)
    if np.isfinite(overall):
        bottom.axhline(overall, color=INK, linewidth=0.9, linestyle=":", label=f"S overall = {overall:.3f}")
    else:
        overall = 1.0
    bottom.axhline(1.0, color=GREY, linewidth=0.8)
    finite = s[np.isfinite(s)]
    hi = max(float(finite.max()) if len(finite) else 1.0, overall)
    lo = min(float(finite.min()) if len(finite) else 1.0, 1.0)
    pad = max(0.02, 0.1 * (hi - lo))
    bottom.set_ylim(lo - pad, hi + pad)
    bottom.set_ylabel("slowdown S")
    bottom.grid(True, axis="y", color=GRID, linewidth=0.6)
    bottom.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=2, borderaxespad=0.2)
    gaps = np.flatnonzero(np.diff(num) > 1) if n > 1 else np.zeros(0, dtype=np.int64)
    if 0 < len(gaps) <= 6:
        for g in gaps:
            for ax in (top, bottom):
                ax.axvline(g + 0.5, color=GRID, linewidth=0.8, linestyle="-", zorder=0)
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    bottom.xaxis.set_major_locator(MaxNLocator(nbins=14, integer=True, min_n_ticks=1))
    bottom.xaxis.set_major_formatter(FuncFormatter(lambda t, _p: str(num[int(t)]) if 0 <= int(t) < n else ""))
    bottom.set_xlim(-0.5, n - 0.5)
    if len(gaps) > 6:
        bottom.set_xlabel("step (the traced steps, evenly spaced in trace order)")
    else:
        bottom.set_xlabel("step" + (" (vertical lines mark gaps in the numbering)" if len(gaps) else ""))
    return figure_svg(fig, prefix)


def _label_bars(ax: Any, labels: Sequence[str], v: np.ndarray, *, horizontal: bool, annotate: bool, span: float,
                font_size: float) -> None:
    """Each bar's value at its end, or (too many bars) the three highest with their labels."""
    if annotate:
        align = {"va": "center"} if horizontal else {"ha": "center", "va": "bottom"}
        for p, val in enumerate(v):
            if np.isfinite(val):
                end = max(val, 1.0) + (0.008 if horizontal else 0.01) * span
                ax.text(*((end, p) if horizontal else (p, end)), f"{val:.3f}", fontsize=font_size, color=INK, **align)
    elif len(v):
        # too many bars to label them all: label the three highest
        for p in np.argsort(-np.where(np.isfinite(v), v, -np.inf), kind="stable")[:3]:
            if np.isfinite(v[p]) and v[p] > 1.0:
                xy = (v[p], p) if horizontal else (p, v[p])
                ax.annotate(f"{labels[p]}: {v[p]:.3f}", xy, xytext=(4, 2), textcoords="offset points",
                            fontsize=7.5, color=INK, va="bottom" if not horizontal else "center")


def _bars_legend(ax: Any, legend: Mapping[str, str] | None, reference_label: str) -> None:
    """Colour patches for ``legend`` and the dotted reference line, above the axes."""
    handles: list = []
    if legend:
        from matplotlib.patches import Patch

        handles = [Patch(facecolor=c, label=lab) for c, lab in legend.items()]
    if reference_label:
        from matplotlib.lines import Line2D

        handles.append(Line2D([], [], color=INK, linestyle=":", linewidth=0.9, label=reference_label))
    if handles:
        ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=len(handles),
                  borderaxespad=0.2)


@styled
def bars_svg(
    labels: Sequence[str],
    values: Sequence[float],
    *,
    horizontal: bool,
    colours: Sequence[str] | None = None,
    legend: Mapping[str, str] | None = None,
    reference: float | None = None,
    reference_label: str = "",
    value_label: str = "slowdown",
    category_label: str = "",
    annotate: bool | None = None,
    width_in: float = 10.4,
    prefix: str = "bars",
) -> str:
    """Bars of slowdown-like values drawn from the baseline 1 (so a bar's length is the excess).

    ``legend`` maps colour -> label; ``reference`` draws a dotted line (e.g. the overall S).
    """
    v = np.asarray(values, dtype=float)
    n = len(v)
    if reference is not None and not np.isfinite(reference):
        reference = None
    if annotate is None:
        annotate = n <= 40
    cols = list(colours) if colours is not None else [BLUE] * n
    finite = v[np.isfinite(v)]
    hi = max([1.0, *finite.tolist(), *([reference] if reference is not None and np.isfinite(reference) else [])])
    lo = min([1.0, *finite.tolist()])
    span = max(hi - lo, 0.02)
    pos = np.arange(n)
    excess = np.where(np.isfinite(v), v - 1.0, 0.0)
    label_fs = 8 if n <= 16 else 7
    if horizontal:
        fig = new_figure(width_in, 0.9 + 0.26 * max(n, 2))
        ax = fig.add_subplot()
        ax.barh(pos, excess, left=1.0, color=cols, height=0.68)
        ax.set_yticks(pos, list(labels), fontsize=8.5)
        ax.set_ylim(n - 0.5, -0.5)
        ax.set_xlim(lo - 0.03 * span, hi + (0.1 if annotate else 0.03) * span)
    else:
        fig = new_figure(width_in, 3.2)
        ax = fig.add_subplot()
        ax.bar(pos, excess, bottom=1.0, color=cols, width=0.68 if n <= 64 else 0.9)
        if n <= 32:
            ax.set_xticks(pos, list(labels), fontsize=8.5)
        else:
            from matplotlib.ticker import FuncFormatter, MaxNLocator

            ax.xaxis.set_major_locator(MaxNLocator(nbins=10, integer=True))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda t, _p: labels[int(t)] if 0 <= int(t) < n else ""))
        ax.set_xlim(-0.6, n - 0.4)
        ax.set_ylim(lo - 0.03 * span, hi + (0.12 if annotate else 0.04) * span)
    # the rest is the same for both orientations, on the value axis (x when horizontal) or the category axis
    value_line = ax.axvline if horizontal else ax.axhline
    value_line(1.0, color=INK, linewidth=0.8)
    if reference is not None:
        value_line(reference, color=INK, linewidth=0.9, linestyle=":")
    (ax.set_xlabel if horizontal else ax.set_ylabel)(value_label)
    if category_label:
        (ax.set_ylabel if horizontal else ax.set_xlabel)(category_label)
    ax.grid(True, axis="x" if horizontal else "y", color=GRID, linewidth=0.6)
    ax.tick_params(axis="y" if horizontal else "x", length=0)
    _label_bars(ax, labels, v, horizontal=horizontal, annotate=annotate, span=span, font_size=label_fs)
    _bars_legend(ax, legend, reference_label if reference is not None else "")
    return figure_svg(fig, prefix)


__all__ = [
    "bars_svg",
    "figure_svg",
    "heat_colour",
    "heat_range",
    "heat_vmax",
    "heatmap_svg",
    "new_figure",
    "per_step_svg",
    "text_on",
]
