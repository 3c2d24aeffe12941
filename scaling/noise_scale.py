"""The gradient noise scale, defined once: its estimator from gradient norms at two batch sizes, and its interval.

McCandlish, Kaplan, Amodei et al. 2018 ("An Empirical Model of Large-Batch Training", appendix A.1). A
gradient estimated from a batch of B samples drawn i.i.d. has expected squared norm

    E |G_B|² = |G|² + tr(Σ) / B

(|G|²: the true gradient's squared norm; tr(Σ): the trace of one sample's gradient covariance). Two
squared norms of the same step's gradient at two batch sizes, S at B_small and L at B_big > B_small,
give per step the unbiased estimates

    |G|²   ≈ G_i = (B_big · L − B_small · S) / (B_big − B_small)
    tr(Σ)  ≈ T_i = (S − L) / (1 / B_small − 1 / B_big)

and the simple noise scale B_simple = tr(Σ) / |G|², the batch size beyond which a larger batch buys
less than proportionally fewer steps. Each G_i, T_i is unbiased but very noisy (G_i is often negative),
so numerator and denominator are averaged separately over the sampled steps before dividing:
B_simple = mean(T) / mean(G). Its biases, stated:
- a ratio of means is biased by O(1/n) in the number of steps n (the mean of G in the denominator):
  small once the interval below is narrow against the estimate;
- |G|² and tr(Σ) drift during training (|G|² falls as the loss does), so over a window the figure is
  the |G|²-weighted average of the noise scale over it, not its value at any one step;
- the samples of a batch come without replacement from a finite dataset, not i.i.d.: tr(Σ) is
  under-estimated by the factor (1 − B/N) at dataset size N, negligible while B ≪ N;
- B_simple is invariant to the scale of the loss (|G|² and tr(Σ) scale alike): a job that sums its
  loss over micro-batches instead of averaging gets the same noise scale, |G|² and tr(Σ) in its units.

Where the two norms come from (scaling/instrument/timing.py and meter.py, the backends' timers): at N workers a
rank's gradient before its collective (B_small: its samples in the step; the epoch's figure takes each step's mean
over the ranks, as unbiased and less noisy) and the averaged one after it (B_big: the global batch; DDP's
all-reduced buckets, Horovod's averaged gradients, FSDP2's reduce-scattered shards summed over the ranks); at 1
worker two consecutive batches of the calibration window, one alone and both accumulated.

The interval is by batch means: the n per-step (T_i, G_i) in order, in k ≤ `BLOCKS` contiguous blocks
(neighbouring steps are correlated through the parameters they share); the ratio's standard error by
the delta method over the blocks' means, a Student t quantile at k − 1 degrees of freedom. Where the
interval of mean(G) reaches zero the noise scale has no upper bound (`high` is infinite): the gradient
is not told from its noise on those steps. Pure arithmetic, no imports: the instrument, the analysis
and the projection read it.
"""

from __future__ import annotations

import math

BLOCKS = 10  # batch means over at most this many contiguous blocks of sampled steps
MIN_STEPS = 4  # fewer sampled steps give an estimate without an interval

# Student t, two-sided 95%, by degrees of freedom (1..30); the normal 1.96 beyond
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
    2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(dof: int) -> float:
    """The two-sided 95% Student t quantile at `dof` degrees of freedom."""
    return _T975[dof - 1] if 1 <= dof <= len(_T975) else 1.96


def samples_growth(batch: float, anchor: float, noise_scale: float) -> float:
    """Samples (epochs) to a target at `batch` over those at `anchor` (McCandlish et al.: E = E_min (1 + B/B_noise)):
    (1 + B / B_noise) / (1 + B0 / B_noise); 1 at an infinite noise scale. scaling/projection/tta.py builds the
    projection's epochs to target on it, the sweep's tables their expected TTA-to-throughput gap."""
    if math.isinf(noise_scale):
        return 1.0
    return (1.0 + batch / noise_scale) / (1.0 + anchor / noise_scale)


def step_terms(small_sq: float, big_sq: float, batch_small: float, batch_big: float) -> tuple[float, float]:
    """One step's unbiased (tr(Σ), |G|²) from its gradient's squared norms at two batch sizes (module docstring)."""
    if not batch_big > batch_small > 0:
        raise ValueError(f"need 0 < batch_small < batch_big, got {batch_small} and {batch_big}")
    trace = (small_sq - big_sq) / (1.0 / batch_small - 1.0 / batch_big)
    grad_sq = (batch_big * big_sq - batch_small * small_sq) / (batch_big - batch_small)
    return trace, grad_sq


def ratio_interval(blocks: list[tuple[float, float, float]]) -> dict:
    """The noise scale over blocks, each (weight, mean tr(Σ), mean |G|²) — steps, epochs — with its 95% interval.

    The ratio of weighted means (module docstring), its interval by the delta method over the blocks'
    means: `noise_scale`, `noise_scale_low`, `noise_scale_high` (NaN without an interval: one block, or
    none), `grad_trace`, `grad_sq` (the weighted means), `noise_blocks`. With mean |G|² ≤ 0 there is
    no estimate (NaN): the gradient is below its noise over the blocks.
    """
    blocks = [(w, t, g) for w, t, g in blocks if w > 0 and math.isfinite(t) and math.isfinite(g)]
    nan = float("nan")
    out = {"noise_scale": nan, "noise_scale_low": nan, "noise_scale_high": nan, "grad_trace": nan, "grad_sq": nan}
    out["noise_blocks"] = len(blocks)
    if not blocks:
        return out
    total = sum(w for w, _, _ in blocks)
    trace = sum(w * t for w, t, _ in blocks) / total
    grad_sq = sum(w * g for w, _, g in blocks) / total
    out.update(grad_trace=trace, grad_sq=grad_sq)
    if grad_sq <= 0:
        return out
    ratio = trace / grad_sq
    out["noise_scale"] = ratio
    k = len(blocks)
    if k < 2:
        return out
    # blocks weighted by their share of the steps: the delta method for a ratio of weighted means
    shares = [w / total for w, _, _ in blocks]
    var_ratio = sum(s * s * (t - ratio * g) ** 2 for s, (_, t, g) in zip(shares, blocks)) * k / (k - 1)
    var_grad = sum(s * s * (g - grad_sq) ** 2 for s, (_, _, g) in zip(shares, blocks)) * k / (k - 1)
    t = t975(k - 1)
    half = t * math.sqrt(var_ratio) / grad_sq
    out["noise_scale_low"] = ratio - half
    # the denominator's own interval reaching zero: no upper bound
    out["noise_scale_high"] = ratio + half if grad_sq - t * math.sqrt(var_grad) > 0 else math.inf
    return out


def estimate(steps: list[tuple[float, float, float, float]], blocks: int = BLOCKS) -> dict:
    """The noise scale over sampled steps, each (|G_small|², |G_big|², B_small, B_big), in the order run.

    `ratio_interval` over at most `blocks` contiguous blocks of steps (batch means), plus `noise_steps`.
    Fewer than `MIN_STEPS` steps: the estimate without an interval.
    """
    terms = [step_terms(*step) for step in steps]
    n = len(terms)
    k = min(blocks, n // 2) if n >= MIN_STEPS else min(n, 1)
    cut = [round(i * n / k) for i in range(k + 1)] if k else [0]
    chunks = [terms[a:b] for a, b in zip(cut, cut[1:])]
    out = ratio_interval([(len(c), sum(t for t, _ in c) / len(c), sum(g for _, g in c) / len(c)) for c in chunks if c])
    out["noise_steps"] = n
    return out
