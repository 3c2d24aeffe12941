"""Epochs to target at any global batch: the samples-to-target model of large-batch training, and its sources.

McCandlish, Kaplan, Amodei et al. 2018 ("An Empirical Model of Large-Batch Training"): with the learning rate
suited to each batch size, the samples a run needs to reach a target grow with the global batch B as

    E(B) = E_min · (1 + B / B_noise)

(and its optimizer steps fall as S(B) = S_min · (1 + B_noise / B)): up to about the noise scale B_noise a
larger batch needs hardly more samples (perfect scaling), far beyond it as many steps as ever (no more
speedup). So from one run at batch B0 that reached the target in E0 epochs and measured its noise scale
(scaling/noise_scale.py, in summary.json), the epochs to target at any B are

    epochs(B) = E0 · (1 + B / B_noise) / (1 + B0 / B_noise)

Its interval propagates both: the noise scale's 95% interval (a smaller noise scale, more epochs at B > B0)
and E0's, the epochs between the evaluation before the target and the one that reached it (the target was
crossed somewhere between: the run's `eval_every`), or what repeats measured. Both enter monotonically, so
the interval's ends are the formula at the ends of each.

Where epochs to target were measured at several batches (`--epochs-to-target`, or a sweep's runs), a row at
a measured batch takes the measurement, a row between two measured batches their interpolation in
log2(batch) (`epochs_at`), and a row beyond them the model anchored at the nearest measured
batch below it; without a noise scale, rows beyond the measured batches keep today's rule (the last two
points' slope). Each row says which set it: `epochs_source`.

The learning-rate rule across batch sizes is an input, since the model holds for a rate suited to each batch:
- `linear` (Goyal et al. 2017, the lab's configs: peak rate ∝ global batch, after a warm-up) tracks the best
  rate only while B ≪ B_noise: the optimal rate itself saturates, ε_opt(B) = ε_max / (1 + B_noise / B)
  (McCandlish et al., eq. 2.7), so beyond the noise scale the linear rule overshoots and training can slow or
  diverge (the quickstart diverged at batch 1024 under it: docs/method.md). Rows with B above the noise
  scale's upper bound are outside the model's support;
- `tuned` (a rate tuned per batch, or a rule that follows ε_opt): supported at any batch;
- `sqrt`, `constant` or any other: the model's assumption is not met beyond the run's own batch B0: those rows
  are outside its support.
A row outside the support keeps the model's figure and says so (`beyond_support`, and a caveat).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from scaling import noise_scale
from scaling.errors import UsageError

LR_RULES = ("linear", "tuned", "sqrt", "constant")
# the columns a projection with time to accuracy adds beside TTA_COLUMNS
MODEL_COLUMNS = (
    "epochs_to_target_lo",
    "epochs_to_target_hi",
    "epochs_source",
    "beyond_support",
    "tta_s_lo",
    "tta_s_hi",
    "speedup_tta_lo",
    "speedup_tta_hi",
)
SUPPORT_CAVEAT = (
    "rows marked beyond support: the learning-rate rule is not one the samples-to-target model holds for at that "
    "batch (scaling/projection/tta.py); measure a run there before trusting its time to accuracy"
)


@dataclass(frozen=True)
class NoiseScale:
    """A measured gradient noise scale with its 95% interval (`high` infinite: no upper bound)."""

    value: float
    low: float
    high: float

    def __post_init__(self):
        if not (self.value > 0 and math.isfinite(self.value)):
            raise ValueError(f"a noise scale must be positive and finite, got {self.value}")
        if not (0 <= self.low <= self.value <= self.high):
            raise ValueError(f"noise scale interval must hold it: {self.low} <= {self.value} <= {self.high}")


@dataclass(frozen=True)
class SamplesToTarget:
    """What the model needs: the noise scale, one measured point (batch B0, epochs E0 with its interval) and the
    learning-rate rule (module docstring)."""

    noise: NoiseScale
    batch: int
    epochs: float
    epochs_low: float
    epochs_high: float
    lr_rule: str = "linear"

    def __post_init__(self):
        if self.lr_rule not in LR_RULES:
            raise ValueError(f"lr_rule must be one of {', '.join(LR_RULES)}, got {self.lr_rule!r}")
        if not (self.batch >= 1 and 0 < self.epochs_low <= self.epochs <= self.epochs_high):
            raise ValueError(
                f"need batch >= 1 and 0 < epochs_low <= epochs <= epochs_high, got {self.batch}, "
                f"{self.epochs_low} <= {self.epochs} <= {self.epochs_high}"
            )


TTA_COLUMNS = ("epochs_to_target", "epochs_extrapolated", "tta_s", "speedup_tta")
TTA_CAVEAT = (
    "TTA beyond the measured global batches extrapolates epochs-to-target: large-batch training "
    "may need many more epochs, or not reach the target at all, beyond what was measured"
)

growth = noise_scale.samples_growth  # epochs(batch) / epochs(anchor) by the model


def epochs_by_model(model: SamplesToTarget, batch: int, anchor: tuple[int, float, float, float] | None = None):
    """(epochs, low, high) at `batch` from the model anchored at `anchor` (batch, epochs, low, high; default the
    model's own run). The low end takes the larger noise scale where B > B0 (less growth), the smaller where
    B < B0."""
    b0, e0, e0_lo, e0_hi = anchor or (model.batch, model.epochs, model.epochs_low, model.epochs_high)
    noise = model.noise
    ends = [growth(batch, b0, n) for n in (noise.low if noise.low > 0 else 1e-300, noise.high)]
    return e0 * growth(batch, b0, noise.value), e0_lo * min(ends), e0_hi * max(ends)


def supported(model: SamplesToTarget, batch: int) -> bool:
    """Whether the learning-rate rule keeps the model's assumption at `batch` (module docstring)."""
    if model.lr_rule == "tuned":
        return True
    if model.lr_rule == "linear":
        return batch <= max(model.batch, model.noise.high)
    return batch <= model.batch


def epochs_rows(batches: list[int], measured: Mapping[int, float] | None, model: SamplesToTarget | None) -> list[dict]:
    """Per global batch: `epochs_to_target` with `_lo`/`_hi`, `epochs_source`, `epochs_extrapolated` and
    `beyond_support` (module docstring). `measured`: {batch: epochs} where measured (may be None); between
    (and, without a model, beyond) measured points `epochs_at`'s rule."""
    points = dict(measured or {})
    if model is not None:
        points.setdefault(model.batch, model.epochs)
    rows = []
    for batch in batches:
        row = {"beyond_support": False}
        if batch in points and (model is None or batch != model.batch or batch in (measured or {})):
            e = points[batch]
            row.update(epochs_to_target=e, epochs_to_target_lo=e, epochs_to_target_hi=e, epochs_extrapolated=False)
            row["epochs_source"] = "measured"
            if model is not None and batch == model.batch:
                row.update(epochs_to_target_lo=model.epochs_low, epochs_to_target_hi=model.epochs_high)
        elif model is not None and batch == model.batch:
            row.update(
                epochs_to_target=model.epochs,
                epochs_to_target_lo=model.epochs_low,
                epochs_to_target_hi=model.epochs_high,
                epochs_extrapolated=False,
                epochs_source="measured (the run)",
            )
        elif points and min(points) < batch < max(points) and len(points) > 1:
            e, _ = epochs_at(points, batch)
            row.update(epochs_to_target=e, epochs_to_target_lo=e, epochs_to_target_hi=e, epochs_extrapolated=False)
            row["epochs_source"] = "interpolated between measured batches"
        elif model is not None:
            below = [b for b in points if b <= batch]
            b0 = max(below) if below else min(points)
            anchor = (
                (model.batch, model.epochs, model.epochs_low, model.epochs_high)
                if b0 == model.batch and b0 not in (measured or {})
                else (b0, points[b0], points[b0], points[b0])
            )
            e, lo, hi = epochs_by_model(model, batch, anchor)
            row.update(epochs_to_target=e, epochs_to_target_lo=lo, epochs_to_target_hi=hi, epochs_extrapolated=True)
            row["epochs_source"] = f"noise-scale model from batch {b0}"
            row["beyond_support"] = not supported(model, batch)
        elif points:
            e, extrapolated = epochs_at(points, batch)
            row.update(epochs_to_target=e, epochs_to_target_lo=e, epochs_to_target_hi=e)
            row.update(epochs_extrapolated=extrapolated, epochs_source="extrapolated along the measured points")
        else:
            raise ValueError("epochs to target need measured points or a samples-to-target model")
        rows.append(row)
    return rows


def add_tta(df, measured: Mapping[int, float] | None, model: SamplesToTarget | None) -> list[str]:
    """The projection's rows (`global_batch`, `time_per_epoch_s`, the first row the baseline) given time to
    accuracy in place: `epochs_to_target` (with `_lo`, `_hi`, `epochs_source`, `epochs_extrapolated`,
    `beyond_support`), `tta_s` and `speedup_tta` with their intervals (the speedup's ends pair the baseline's
    and the row's opposite ends: a bound, as the two share their noise scale). Returns the caveats."""
    rows = epochs_rows([int(b) for b in df["global_batch"]], measured, model)
    for name in rows[0]:
        df[name] = [row[name] for row in rows]
    per_epoch = df["time_per_epoch_s"]
    for suffix in ("", "_lo", "_hi"):
        df["tta_s" + suffix] = df["epochs_to_target" + suffix] * per_epoch
    base = df.iloc[0]
    df["speedup_tta"] = base["tta_s"] / df["tta_s"]
    df["speedup_tta_lo"] = base["tta_s_lo"] / df["tta_s_hi"]
    df["speedup_tta_hi"] = base["tta_s_hi"] / df["tta_s_lo"]
    return [SUPPORT_CAVEAT] if df["beyond_support"].any() else []


def describe(model: SamplesToTarget) -> str:
    """The model's inputs in one line (a projection's note)."""
    noise = model.noise
    high = "no upper bound" if math.isinf(noise.high) else f"{noise.high:,.0f}"
    return (
        f"samples-to-target model: noise scale {noise.value:,.0f} [{noise.low:,.0f}, {high}], "
        f"{model.epochs:g} epochs [{model.epochs_low:g}, {model.epochs_high:g}] to target at global batch "
        f"{model.batch:,}, learning-rate rule {model.lr_rule}"
    )


def parse_epochs_table(text: str | Mapping | None) -> dict[int, float] | None:
    """'256:3,512:4' or {256: 3, 512: 4} (a sweep's: results.SweepDir.epochs_to_target) -> {global batch: epochs
    to target}."""
    if text is None:
        return None
    if isinstance(text, Mapping):
        items = list(text.items())
    else:
        items = []
        for part in str(text).split(","):
            batch, sep, epochs = part.partition(":")
            if not sep:
                raise UsageError(
                    f"--epochs-to-target takes GLOBAL_BATCH:EPOCHS pairs, e.g. 256:30,1024:32, got {text!r}"
                )
            items.append((batch.strip(), epochs.strip()))
    table = {}
    for batch, epochs in items:
        try:
            b, e = int(batch), float(epochs)
        except (TypeError, ValueError):
            raise UsageError(f"epochs-to-target: {batch!r}:{epochs!r} is not GLOBAL_BATCH:EPOCHS") from None
        if b < 1 or not (e > 0 and math.isfinite(e)):
            raise UsageError(f"epochs-to-target: batch must be >= 1 and epochs > 0, got {batch}:{epochs}")
        table[b] = e
    if not table:
        raise UsageError("epochs-to-target: empty table")
    return table


def epochs_at(table: Mapping[int, float], global_batch: int) -> tuple[float, bool]:
    """(epochs to target at `global_batch`, whether it was extrapolated); rule in rows.py's module docstring:
    linear in log2(batch) between measured points, along the last two points' slope beyond them."""
    points = sorted((math.log2(b), e) for b, e in table.items())
    x = math.log2(global_batch)
    floor = min(e for _, e in points)
    if len(points) == 1:
        return points[0][1], global_batch != 2 ** points[0][0]
    if points[0][0] <= x <= points[-1][0]:
        for (x0, e0), (x1, e1) in zip(points, points[1:]):
            if x0 <= x <= x1:
                return (e0 + (e1 - e0) * (x - x0) / (x1 - x0) if x1 > x0 else e0), False
    (x0, e0), (x1, e1) = (points[-2], points[-1]) if x > points[-1][0] else (points[0], points[1])
    return max(floor, e0 + (e1 - e0) * (x - x0) / (x1 - x0)), True


@dataclass
class TTAPlan:
    """The time-to-accuracy stage's answer: the columns it added, its notes and caveats, and the model's
    inputs in one line (`describe`; None without a model)."""

    columns: list[str]
    notes: list[str]
    caveats: list[str]
    model_text: str | None = None


def plan_tta(df, epochs_to_target, model: SamplesToTarget | None) -> TTAPlan:
    """The time-to-accuracy stage of a projection (rows.py's table, in place); nothing without measured epochs
    (`epochs_to_target`: pairs, a mapping or None) or a model."""
    measured = parse_epochs_table(epochs_to_target)
    if measured is None and model is None:
        return TTAPlan([], [], [])
    caveats = add_tta(df, measured, model)
    notes = []
    if measured is not None:
        points = ", ".join(f"{b}: {e:g}" for b, e in sorted(measured.items()))
        notes.append(f"epochs to target measured at global batch {{{points}}}")
    text = describe(model) if model is not None else None
    if text is not None:
        notes.append(text)
    if (df["epochs_extrapolated"] & ~df["epochs_source"].str.startswith("noise-scale")).any():
        caveats.append(TTA_CAVEAT)
    return TTAPlan([*TTA_COLUMNS, *MODEL_COLUMNS], notes, caveats, text)
