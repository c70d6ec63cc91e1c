"""Noise-aware naming: how consistent a named target's excess is, against the job's own noise.

Per step, a target (a rank, a stage, a link) has a ratio: its time over its reference in that step
(a worker's compute speed over its fast stage peers', a stage's compute over the other stages', a
link's transfers over its op type's other links'; for host time, 1 + its excess over the other
ranks' / the ideal step). The job's noise is the step-to-step spread of the same ratio for the other
targets: each series minus its own median (a target that is steadily a little slower adds nothing),
pooled, as a robust sigma (1.4826 x the median absolute deviation), at least ``noise_floor``. For a
worker it is one rank's spread widened for a reference of few peers (``cell_sigma``,
``ratio_sigma``), and so for a stage of a two-stage pipeline (there is no third stage to measure it
on). A step is slow when its ratio is over 1 + ``noise_step_k`` sigmas. A target is

- *consistent* when it is slow in at least ``noise_consistent_share`` of the steps and its median
  ratio is ``noise_median_k`` sigmas over 1 (sigmas of one step, not standard errors of the median:
  on a busy host healthy ranks differ steadily by about the step-to-step noise, and a rank that
  runs well behind the fastest of its peers on shared cores is no slow GPU);
- *transient*, as a run, when its slow steps form one contiguous run of steps (a straggler that
  recovers, or one that starts late): its median ratio in the run ``noise_median_k`` sigmas over 1,
  outside it the median under that, at most half the steps slow and fewer than
  ``noise_transient_min_steps`` far out (one is a blip; more are bursts), the run at least and the
  rest more than ``noise_run_share`` of the steps (and ``noise_transient_min_steps``: a steady
  straggler's unlucky step or two at one end is no recovery), and so many steps in a row as slow as
  the run's least slow one unlikely at the others' rate of such steps (the chance of a run that
  long among n steps under ``noise_transient_p``). A consistent target is said to be one where its
  slow steps are such a run; one that is not consistent, only where the detector asks (it was
  nominated by a run, not by its median step). It is named with its steps by every detector;
- *transient* when it is not, but has at least ``noise_transient_min_steps`` steps
  ``noise_transient_k`` sigmas over 1, more of them than the others' rate of such steps gives by
  chance (binomial tail under ``noise_transient_p``): bursts of host work, a link that stalls now
  and then; not the tail every link of a busy host has. Where its far steps stand higher than that
  bar, "such steps" are also counted at ``noise_transient_level`` of their excess (a few of the
  others' blips just past the bar do not hide a stall ten times their size). Where the far steps
  are evenly spaced (three or more, two steps apart or more: work every N steps, a checkpoint, an
  evaluation, a log flush), the tail is multiplied by the chance that so many steps drawn at random
  from those judged fall evenly spaced (``noise_periodic``): few stalls against a short reference
  (one peer's steps) are then told from chance by where they fall, not only by how many there are.
  Its slow steps are those far steps, and their period is said;
- within the noise otherwise: a detector does not name it (a rank riding along in a multi-rank
  finding is dropped from it);
- unjudged when it has a reference in no step (the only link of its op type): the detector's rule
  stands.

The detectors build the per-step series (``ratios`` from values and references per step) and call
``judge`` for each target they would name; ``Consistency`` is plain data (``laggard.results``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from laggard.diagnose.config import DiagnoseConfig
from laggard.engine.selection import nan_median
from laggard.results.diagnosis import Consistency

MAD_SIGMA = 1.4826  # MAD x this is the sigma of a normal distribution


def ratios(value: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """``value / ref`` per cell; NaN where either is missing or the reference is not positive."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = value / ref
    return np.where(np.isfinite(out) & (ref > 0), out, np.nan)


def row_median(m: np.ndarray) -> np.ndarray:
    """The median of each column of ``m`` over its rows, NaN ignored (NaN where a column has none)."""
    m = np.atleast_2d(m)
    fin = np.isfinite(m)
    if fin.all():
        return np.median(m, axis=0) if len(m) else np.full(m.shape[1], np.nan)
    out = np.full(m.shape[1], np.nan)
    ok = fin.any(axis=0)
    if ok.any():
        out[ok] = nan_median(m[:, ok], 0)
    return out


def deviations(series: np.ndarray) -> np.ndarray:
    """Each row (a target's per-step ratios) minus its own median; NaN stays NaN."""
    series = np.atleast_2d(series)
    ok = np.isfinite(series).any(axis=1)
    med = np.full(len(series), np.nan)
    if ok.any():
        med[ok] = nan_median(series[ok], 1)
    return series - med[:, None]


def sigma(dev: np.ndarray, cfg: DiagnoseConfig) -> float:
    """The robust sigma of the deviations (NaN ignored), at least ``noise_floor``; the floor alone
    when there are fewer than 2 deviations."""
    d = dev[np.isfinite(dev)]
    if len(d) < 2:
        return cfg.noise_floor
    return max(MAD_SIGMA * float(np.median(np.abs(d - np.median(d)))), cfg.noise_floor)


def cell_sigma(values: np.ndarray, rows: np.ndarray, cfg: DiagnoseConfig, *, whole_for_two: bool = False) -> float:
    """The robust sigma of one target's per-step value about its own median, relative (value / its
    median - 1), once what every target's step shares is divided out (each step's median over all
    rows), pooled over ``rows`` (a mask or indices). ``whole_for_two``: with two targets nothing is
    divided out, since a step's median of two is their mean and one target's series over it mirrors
    the other's (a target slow every other step would widen its own yardstick to its excess); the
    other's spread taken whole also holds what the step shares: an upper bound."""
    with np.errstate(divide="ignore", invalid="ignore"):
        shared = row_median(values)[None, :] if len(values) > 2 or not whole_for_two else 1.0
        norm = values / shared
        own = np.full(len(values), np.nan)
        ok = np.isfinite(norm).any(axis=1)
        own[ok] = nan_median(norm[ok], 1)
        rel = norm / own[:, None] - 1.0
    return sigma(rel[rows], cfg)


def ratio_sigma(cell: float, num_ref: int) -> float:
    """The sigma of a per-step ratio of one target to the median of ``num_ref`` others, each with
    relative sigma ``cell``: var ~ cell^2 (1 + v), v = 1/m up to m = 2 (a mean), pi / (2m) above (a
    median). Against one peer the ratio is noisier than against the median of seven."""
    m = max(num_ref, 1)
    return cell * math.sqrt(1.0 + (1.0 / m if m <= 2 else math.pi / (2 * m)))


@dataclass(frozen=True, slots=True)
class JobNoise:
    """The noise a target is judged against: ``sigma`` of the other targets' step-to-step deviations,
    and ``far_rate``, the rate of their steps far outside it (over 1 + ``noise_transient_k`` sigma).

    The rate is the Jeffreys estimate (far + 1/2) / (steps + 1), not the bare share: none in the 32
    steps of two reference ranks is no proof that such steps never happen, and a share of 0 made any
    two far steps "transient" (on a busy host healthy ranks are descheduled now and then, far outside
    the noise: references that showed none in their few steps must not make two such steps name a
    rank)."""

    sigma: float
    far_rate: float = 0.0
    others: np.ndarray | None = field(default=None, compare=False, repr=False)  # their ratios (finite)

    @staticmethod
    def of(sigma: float, others: np.ndarray, cfg: DiagnoseConfig) -> JobNoise:
        """``sigma``, with the far rate of the other targets' per-step ratios ``others`` (NaN ignored)."""
        r = others[np.isfinite(others)]
        far = int(np.sum(r > 1.0 + cfg.noise_transient_k * sigma))
        return JobNoise(sigma=sigma, far_rate=(far + 0.5) / (len(r) + 1) if len(r) else 0.0, others=r)

    def rate_over(self, level: float) -> float | None:
        """The Jeffreys rate of the other targets' steps over ``level`` (None without their ratios)."""
        if self.others is None or not len(self.others):
            return None
        return (int(np.sum(self.others > level)) + 0.5) / (len(self.others) + 1)


def noise_for(ratio: np.ndarray, i: int | None, cfg: DiagnoseConfig, pool: np.ndarray | None = None) -> JobNoise:
    """The job's noise for judging row ``i`` of the per-step ratios (targets x steps; None: a target
    that is no row of them): from the ``pool`` rows (the targets no detector flagged; default every
    row) less row ``i``; from every other row when the pool has none; from row ``i``'s own
    step-to-step spread when no other row has any (the floor when ``i`` is None)."""
    dev = deviations(ratio)
    others = np.arange(len(ratio)) != (-1 if i is None else i)
    for rows in ([others & pool] if pool is not None else []) + [others]:
        # two targets at least: one alone is a poor yardstick of what the others' steps do
        if np.isfinite(dev[rows]).any(axis=1).sum() >= min(2, int(others.sum())) and np.isfinite(dev[rows]).sum() >= 2:
            return JobNoise.of(sigma(dev[rows], cfg), ratio[rows], cfg)
    return JobNoise(sigma=sigma(dev[i] if i is not None else dev[:0], cfg))


def binom_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    p = min(max(p, 0.0), 1.0)
    return float(sum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k, n + 1)))


def judge(target: str, basis: str, ratio: np.ndarray, excess_s: np.ndarray, steps: np.ndarray, job: JobNoise,
          cfg: DiagnoseConfig, *, runs: bool = False) -> Consistency:
    """One target's consistency (see the module) from its per-step ratios, excess (seconds) and step
    numbers (NaN ratios: steps it has no reference in, skipped). A consistent target slow in one run of
    steps is said to be transient in that run; ``runs``: a target that is not consistent may be so too
    (for one a detector nominated by a run of slow steps, not by its median step: a steady straggler on
    a noisy host dips under the noise in some steps, and its slow steps then run together by chance)."""
    ok = np.isfinite(ratio)
    r, ex, st = ratio[ok], np.nan_to_num(excess_s[ok]), steps[ok]
    n, noise = len(r), job.sigma
    slow = r > 1.0 + cfg.noise_step_k * noise
    med = float(np.median(r)) if n else float("nan")
    consistent = n > 0 and slow.sum() >= cfg.noise_consistent_share * n and med >= 1.0 + cfg.noise_median_k * noise
    run = _run(r, slow, job, cfg) if consistent or runs else None
    consistent = consistent and run is None
    far = run if run is not None else None if consistent else _transient(r, st, job, cfg)
    transient = far is not None
    period = period_of(st[far]) if transient and run is None else 0
    pattern = "consistent" if consistent else "transient" if transient else "noise" if n else "unjudged"
    if transient:
        slow = far
    over = slow if transient else np.ones(n, dtype=bool)  # the steps its ratio and excess are read over
    sel = r[over]
    return Consistency(
        target=target, basis=basis, pattern=pattern, steps_total=n, slow_steps=[int(x) for x in st[slow]],
        ratio=float(np.median(sel)) if len(sel) else float("nan"),
        ratio_spread=MAD_SIGMA * float(np.median(np.abs(sel - np.median(sel)))) if len(sel) else float("nan"),
        noise=float(noise), excess_s=float(np.median(ex[over])) if len(sel) else 0.0, run=run is not None,
        period=period,
    )


def longest_run(flags: np.ndarray) -> tuple[int, int]:
    """(start, length) of the longest run of true ``flags`` (the first such run; (0, 0) when none)."""
    best, start, length = (0, 0), 0, 0
    for i, f in enumerate(flags.tolist()):
        if f:
            start, length = (i, 1) if length == 0 else (start, length + 1)
            if length > best[1]:
                best = (start, length)
        else:
            length = 0
    return best


def run_tail(length: int, n: int, q: float) -> float:
    """P(the longest run of true values among ``n`` independent Bernoulli(``q``) draws is at least
    ``length``): one minus the chance that every run stays shorter (a walk over the current run's length)."""
    if length <= 0:
        return 1.0
    if length > n:
        return 0.0
    q = min(max(q, 0.0), 1.0)
    p = np.zeros(length)  # p[j]: no run of ``length`` so far, the current run j long
    p[0] = 1.0
    for _ in range(n):
        nxt = np.zeros(length)
        nxt[0] = p.sum() * (1.0 - q)
        nxt[1:] = p[:-1] * q
        p = nxt
    return float(max(1.0 - p.sum(), 0.0))


def _run(r: np.ndarray, slow: np.ndarray, job: JobNoise, cfg: DiagnoseConfig) -> np.ndarray | None:
    """The steps of a target slow in one contiguous run and healthy outside it (see the module), as a
    mask of ``r``; None where it is not such a target. The run is unlikely when so many steps in a row
    as slow as its least slow one are, at the others' rate of such steps."""
    n = len(r)
    start, length = longest_run(slow)
    outside = n - length
    least = max(cfg.noise_transient_min_steps, cfg.noise_run_share * n)
    if length < max(least, 2) or outside <= least:
        return None
    mask = np.zeros(n, dtype=bool)
    mask[start : start + length] = True
    bar = 1.0 + cfg.noise_median_k * job.sigma
    rest = r[~mask]
    if float(np.median(rest)) >= bar or slow[~mask].sum() > cfg.noise_consistent_share * outside \
            or (rest > 1.0 + cfg.noise_transient_k * job.sigma).sum() >= cfg.noise_transient_min_steps:
        return None  # slow outside the run too (a steady straggler's dips cut its run), or bursts there
    if float(np.median(r[mask])) < bar:
        return None
    # the chance of a step as slow as the run's least slow one: the others' rate of such steps, or a
    # normal tail's without their ratios
    level = float(r[mask].min())
    q = job.rate_over(level)
    q = 0.5 * math.erfc((level - 1.0) / (job.sigma * math.sqrt(2.0))) if q is None else q
    return mask if run_tail(length, n, q) < cfg.noise_transient_p else None


def period_of(steps: np.ndarray) -> int:
    """The common difference of the step numbers ``steps`` (ascending) where three or more of them
    are evenly spaced two or more steps apart (every N-th step); 0 otherwise (steps in a row are a run,
    not a period)."""
    if len(steps) < 3:
        return 0
    d = np.diff(np.asarray(steps, dtype=np.int64))
    return int(d[0]) if d[0] >= 2 and bool((d == d[0]).all()) else 0


def periodic_count(k: int, steps: np.ndarray) -> int:
    """How many ways ``k`` of the step numbers ``steps`` (ascending, distinct) can fall evenly spaced
    two or more steps apart: the k-term arithmetic progressions of difference >= 2 among them."""
    n = len(steps)
    if k < 3 or n < k:
        return 0
    st = np.asarray(steps, dtype=np.int64)
    if st[-1] - st[0] == n - 1:  # every step from the first to the last: count them in closed form
        top = (n - 1) // (k - 1)
        return sum(n - (k - 1) * d for d in range(2, top + 1))
    have = set(st.tolist())
    return sum(all(a + j * d in have for j in range(1, k))
               for a in st.tolist() for d in range(2, (int(st[-1]) - a) // (k - 1) + 1))


def _rare(mask: np.ndarray, steps: np.ndarray, rate: float, cfg: DiagnoseConfig) -> bool:
    """Whether the far steps ``mask`` (of those numbered ``steps``) are at least the minimum and
    unlikely at the others' ``rate``: their count's binomial tail, times, where they are evenly spaced,
    the chance that so many steps drawn at random fall so (``noise_periodic``). Under the null, far
    steps at independent positions, P(count >= k and evenly spaced) <= tail(k) x A(k) / C(n, k), the
    share of k-step sets that are evenly spaced falling as k grows."""
    k, n = int(mask.sum()), len(mask)
    if k < cfg.noise_transient_min_steps:
        return False
    p = binom_tail(k, n, rate)
    if p >= cfg.noise_transient_p and cfg.noise_periodic and period_of(steps[mask]):
        p *= periodic_count(k, steps) / math.comb(n, k)
    return p < cfg.noise_transient_p


def _transient(r: np.ndarray, st: np.ndarray, job: JobNoise, cfg: DiagnoseConfig) -> np.ndarray | None:
    """The steps that make a target transient (None: it is not): far outside the noise, more of them
    than the others' rate of such steps gives by chance; over the ``noise_transient_k`` sigma bar, or,
    where the target's far steps stand higher, over ``noise_transient_level`` of their excess (the
    others' rate counted at that level: a few of their blips just past the bar do not hide a stall
    ten times their size); ``st``: their step numbers."""
    bar = 1.0 + cfg.noise_transient_k * job.sigma
    far = r > bar
    if _rare(far, st, job.far_rate, cfg):
        return far
    if not far.any():
        return None
    level = 1.0 + cfg.noise_transient_level * (float(np.median(r[far])) - 1.0)
    rate = job.rate_over(level) if level > bar else None
    if rate is None:
        return None
    high = r > level
    return high if _rare(high, st, rate, cfg) else None


def stands_out(c: Consistency, *, transient_ok: bool = True) -> bool:
    """Whether a target may be named: consistent, slow in one contiguous run of steps (any cause can
    start or stop: a throttled GPU that cools, a link that recovers), or transient in bursts where the
    cause can be (``transient_ok``); one with no reference in any step (the only link of its op type)
    cannot be judged here, and the detector's own rule stands."""
    return c.pattern in ("consistent", "unjudged") or (c.pattern == "transient" and (transient_ok or c.run))


__all__ = ["JobNoise", "binom_tail", "cell_sigma", "deviations", "judge", "longest_run", "noise_for", "period_of",
           "periodic_count", "ratio_sigma", "ratios", "row_median", "run_tail", "sigma", "stands_out"]
