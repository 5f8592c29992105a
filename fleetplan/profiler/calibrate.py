"""Calibration of the analytic estimator: fit its efficiency factors to measured rows, per device.

For every device in a measured table, `fit` finds the factors x = (e_c, e_m, o_pre, o_dec) minimising

    sum over rows r, metrics m in {TTFT, TBT}:  log(estimated_m(r; x) / measured_m(r))^2

with the estimator's own equations (`prefill_ms` and `decode_ms` of fleetplan/profiler/analytic.py, evaluated
on all of the device's rows at once) and bounds e_c, e_m in [0.01, 1], o_pre, o_dec >= 0
(scipy.optimize.least_squares, trust-region reflective, from a few starting points so that the
max(compute, memory) kinks cannot trap it). Only p50 latencies enter that fit. The all-reduce factors
(e_i, alpha) stay at the base calibration. The spread is the least-squares fit of
log(p_q / p50) = log(1 + j_q) over every TTFT and TBT pair that gives both,
j_q = exp(mean log(p_q / p50)) - 1, or the base value where no row does.

Each device's fit reports its error over the rows used: RMS and max of |estimated / measured - 1|, for TTFT
and TBT separately, and the parameters the rows do not constrain (those are reset to the base value).

Siblings: `Calibration.efficiency(device)` gives an `Efficiency` for `estimate_rows`. A measured device gets
its own factors; an unmeasured one gets those of the measured device of its `kind` whose spec sheet is
nearest (|log F/F'| + |log B/B'| over peak TFLOPS and memory bandwidth). Profile an A100, estimate an H100:
the spec sheet carries the hardware difference, the factors carry the software stack's efficiency.

Published figures: `fit_figures` fits one factor set to `Figure`s, single latencies as a source printed them
(a TTFT, a decode step, or a static batch's end-to-end time, each with its own model, device spec, tp, batch
and lengths), with the same least squares. `PUBLIC_FIGURES` are the cited figures the default A100, H100 and
Trainium factors were fitted to, and the 70B figures the estimator is checked against (docs/profiles.md).
"""

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import msgspec
import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from fleetplan.models.base import Base
from fleetplan.models.errors import InputError
from fleetplan.models.hardware import HARDWARE, HardwareSpec
from fleetplan.models.workload import CATALOG, ModelSpec
from fleetplan.profiler import tables
from fleetplan.profiler.analytic import Efficiency, KindFactors, _Shape, _shape, decode_ms, prefill_ms

# The parameters `fit` fits by default, every parameter it can fit, and the scale below which a Jacobian
# column means "not constrained". Shares of a peak (*_eff) are bounded to [0.01, 1], the rest to >= 0.
PARAMETERS = ("compute_eff", "mem_eff", "prefill_overhead_ms", "decode_overhead_ms")
FITTABLE = (
    "compute_eff",
    "mem_eff",
    "comm_eff",
    "step_us",
    "prefill_overhead_ms",
    "prefill_layer_ms",
    "decode_overhead_ms",
)
_TYPICAL = 0.1  # a change of this size in any parameter should move some residual
_STARTS = ((0.1, 0.3), (0.5, 0.3), (0.9, 0.8), (0.3, 0.9))  # (e_c, e_m) besides the base factors


class DeviceFit(Base):
    """One device's fitted factors and how well they reproduce its rows (errors as fractions, not %).

    ttft_rms, ttft_max: RMS and max of |estimated / measured - 1| over the rows with a p50 TTFT (ttft_rows);
    likewise tbt_*. `unconstrained` names the parameters the rows do not determine (reset to the base value).
    `jitter_measured` says whether j90 / j99 came from the rows' percentiles (False: the base values).
    """

    device: str
    spec: HardwareSpec
    factors: KindFactors
    models: list[str]
    rows: int
    ttft_rows: int
    tbt_rows: int
    ttft_rms: float
    ttft_max: float
    tbt_rms: float
    tbt_max: float
    cost: float
    unconstrained: list[str] = []
    jitter_measured: bool = False


class Calibration(Base):
    """Fitted factors per measured device, on top of `base` (whose other kinds and reserve are kept)."""

    base: Efficiency
    devices: dict[str, DeviceFit]
    output_tokens: int = 128

    def source_for(self, device: str, hardware: dict[str, HardwareSpec] | None = None) -> DeviceFit:
        """The measured device whose factors `device` uses: itself, or its nearest measured sibling."""
        if device in self.devices:
            return self.devices[device]
        specs = HARDWARE if hardware is None else hardware
        if device not in specs:
            msg = f"unknown device {device!r}; known: {sorted(specs)}"
            raise InputError(msg, field="device")
        hw = specs[device]
        siblings = [fit for fit in self.devices.values() if fit.spec.kind == hw.kind]
        if not siblings:
            measured = {name: fit.spec.kind for name, fit in sorted(self.devices.items())}
            msg = f"no measured device of kind {hw.kind!r} to calibrate {device!r} from; measured: {measured}"
            raise InputError(msg, field="device")

        def distance(fit: DeviceFit) -> tuple[float, str]:
            compute = abs(math.log(hw.bf16_tflops / fit.spec.bf16_tflops))
            memory = abs(math.log(hw.memory_bw_gbs / fit.spec.memory_bw_gbs))
            return compute + memory, fit.device

        return min(siblings, key=distance)

    def efficiency(
        self, device: str | None = None, hardware: dict[str, HardwareSpec] | None = None
    ) -> Efficiency:
        """An `Efficiency` for `estimate_rows`.

        With `device`: its kind gets the factors of `source_for(device)` (the device itself if measured, else
        the nearest measured sibling of its kind); tag "calibrated-<that device>". Without: every measured
        kind gets the factors of its measured device, or of the one with the most rows where several were
        measured (ties by name); tag "calibrated". Kinds nobody measured keep the base factors.
        """
        kinds = dict(self.base.kinds)
        if device is not None:
            fit = self.source_for(device, hardware)
            kinds[fit.spec.kind] = fit.factors
            tag = f"calibrated-{fit.device}"
        else:
            chosen: dict[str, DeviceFit] = {}
            for fit in sorted(self.devices.values(), key=lambda f: (-f.rows, f.device)):
                chosen.setdefault(fit.spec.kind, fit)
            kinds.update({kind: fit.factors for kind, fit in chosen.items()})
            tag = "calibrated"
        # The base's per-device factors (e.g. the default A100's) would win over the calibrated kind: drop
        # those of every kind calibrated here, so measured factors reach every device of their kind.
        specs = HARDWARE if hardware is None else hardware
        replaced = {kind for kind, factors in kinds.items() if factors is not self.base.kinds.get(kind)}
        devices = {
            name: factors
            for name, factors in self.base.devices.items()
            if not (name in specs and specs[name].kind in replaced)
        }
        return msgspec.structs.replace(self.base, kinds=kinds, devices=devices, tag=tag)


def _frame(table_or_frame: Any) -> pd.DataFrame:
    """A normalised frame (tables.normalize checks keys and latencies) from a ProfileTable or a DataFrame."""
    if isinstance(table_or_frame, tables.ProfileTable):
        return table_or_frame.frame
    if isinstance(table_or_frame, pd.DataFrame):
        return tables.normalize(table_or_frame)
    msg = f"expected a ProfileTable or a pandas DataFrame, got {type(table_or_frame).__name__}"
    raise InputError(msg, field="profiles")


def _stacked_shape(models: list[ModelSpec]) -> _Shape:
    """One `_Shape` whose fields are per-row arrays: the estimator's functions are elementwise, so they
    evaluate rows of different models in one call."""
    shapes = [_shape(model) for model in models]
    return _Shape(*(np.array([getattr(s, f) for s in shapes], dtype=float) for f in _Shape._fields))


def _resolve(
    frame: pd.DataFrame, hardware: dict[str, HardwareSpec], models: dict[str, ModelSpec]
) -> dict[str, ModelSpec]:
    """Every device and model of the table is known and the estimator can model it; else InputError."""
    unknown_devices = sorted(set(frame.device) - set(hardware))
    if unknown_devices:
        known = sorted(hardware)
        msg = f"unknown device(s) {unknown_devices}: no spec sheet to calibrate against; known: {known}"
        raise InputError(msg, field="profiles.device")
    unknown_models = sorted(set(frame.model) - set(models))
    if unknown_models:
        msg = f"unknown model(s) {unknown_models}; known: {sorted(models)}"
        raise InputError(msg, field="profiles.model")
    for name in sorted(set(frame.model)):
        try:
            _shape(models[name])
        except ValueError as error:
            raise InputError(str(error), field="profiles.model") from error
    return models


def _jitter(rows: pd.DataFrame, q: int, default: float) -> tuple[float, bool]:
    """exp(mean log(p_q / p50)) - 1 over every TTFT and TBT pair the rows give, or `default` if none."""
    logs = []
    for metric in ("ttft", "tbt"):
        ratio = rows[f"{metric}_ms_p{q}"].to_numpy(float) / rows[f"{metric}_ms_p50"].to_numpy(float)
        logs.append(np.log(ratio[np.isfinite(ratio)]))
    pooled = np.concatenate(logs)
    if pooled.size == 0:
        return default, False
    return float(np.expm1(pooled.mean())), True


def _check_parameters(parameters: Sequence[str]) -> tuple[str, ...]:
    names = tuple(parameters)
    unknown = [name for name in names if name not in FITTABLE]
    if unknown or not names or len(set(names)) != len(names):
        msg = f"parameters {list(names)}: give distinct names from {list(FITTABLE)}"
        raise InputError(msg, field="parameters")
    return names


def _start(base: KindFactors, parameters: tuple[str, ...]) -> KindFactors:
    """The starting factors: with one model's rows a per-call and a per-layer prefill cost are the same thing,
    so a fitted per-call cost replaces the base's per-layer cost unless that is fitted too."""
    if "prefill_overhead_ms" in parameters and "prefill_layer_ms" not in parameters:
        return msgspec.structs.replace(base, prefill_layer_ms=0.0)
    return base


def _solve(
    residuals: Callable[[np.ndarray], np.ndarray], start: KindFactors, parameters: tuple[str, ...]
) -> tuple[np.ndarray, float, list[str]]:
    """Bounded least squares of `residuals` over `parameters`, from the start and a few other (e_c, e_m):
    the best x (parameters no residual depends on reset to the start value), its cost, and those names."""
    shares = np.array([name.endswith("_eff") for name in parameters])
    lower = np.where(shares, 0.01, 0.0)
    upper = np.where(shares, 1.0, np.inf)
    base_x = np.array([getattr(start, name) for name in parameters], dtype=float)
    candidates = [base_x]
    for values in _STARTS:
        candidate = base_x.copy()
        for name, value in zip(("compute_eff", "mem_eff"), values, strict=True):
            if name in parameters:
                candidate[parameters.index(name)] = value
        candidates.append(candidate)
    best = None
    for candidate in candidates:
        x0 = np.clip(candidate, lower + 1e-3, np.minimum(upper, 1e6) - 1e-3)  # strictly inside the bounds
        result = least_squares(
            residuals,
            x0,
            bounds=(lower, upper),
            method="trf",
            x_scale=np.full(len(parameters), _TYPICAL),
            xtol=1e-12,
            ftol=1e-12,
            gtol=1e-12,
            max_nfev=2000,
        )
        if best is None or result.cost < best.cost - 1e-15:
            best = result
    assert best is not None
    sensitivity = np.linalg.norm(best.jac, axis=0) * _TYPICAL
    unconstrained = [name for name, s in zip(parameters, sensitivity, strict=True) if s < 1e-6]
    x = best.x.copy()
    for i, name in enumerate(parameters):
        # Any value in a flat direction fits as well: take the base one, unless that leaves the flat region.
        if name in unconstrained:
            trial = x.copy()
            trial[i] = base_x[i]
            if 0.5 * np.sum(residuals(trial) ** 2) <= best.cost * (1 + 1e-9) + 1e-15:
                x = trial
    return x, float(best.cost), unconstrained


class _DeviceRows(NamedTuple):
    """One device's rows as the estimator's per-row arrays, split by the metric each row measured (p50)."""

    ttft_shape: _Shape
    ttft_at: tuple[np.ndarray, np.ndarray, np.ndarray]  # tp, batch, prompt of the rows with a TTFT
    ttft_ms: np.ndarray  # their measured p50 TTFT
    tbt_shape: _Shape
    tbt_at: tuple[np.ndarray, np.ndarray, np.ndarray]  # tp, batch, decode context of the rows with a TBT
    tbt_ms: np.ndarray  # their measured p50 TBT

    def predict(self, hw: HardwareSpec, f: KindFactors) -> tuple[np.ndarray, np.ndarray]:
        """Estimated TTFT and TBT (ms) of the rows that measured each, under the factors `f`."""
        ttft = prefill_ms(self.ttft_shape, hw, f, *self.ttft_at)
        return ttft, decode_ms(self.tbt_shape, hw, f, *self.tbt_at)


def _device_rows(
    device: str, rows: pd.DataFrame, models: dict[str, ModelSpec], output_tokens: int
) -> _DeviceRows:
    """The device's rows as `_DeviceRows`; InputError when no row gives a p50 TTFT or TBT."""
    shape = _stacked_shape([models[m] for m in rows.model])
    tp, batch, prompt = (rows[c].to_numpy(float) for c in ("tp", "batch", "prompt_tokens"))
    context = prompt + output_tokens / 2
    ttft_meas, tbt_meas = rows.ttft_ms_p50.to_numpy(float), rows.tbt_ms_p50.to_numpy(float)
    has_ttft, has_tbt = np.isfinite(ttft_meas), np.isfinite(tbt_meas)
    if not (has_ttft.any() or has_tbt.any()):
        msg = f"device {device!r}: no row gives ttft_ms_p50 or tbt_ms_p50, nothing to calibrate against"
        raise InputError(msg, field="profiles")
    # The shape's fields are per-row arrays: subset them with the rows each metric uses.
    return _DeviceRows(
        ttft_shape=_Shape(*(field[has_ttft] for field in shape)),
        ttft_at=(tp[has_ttft], batch[has_ttft], prompt[has_ttft]),
        ttft_ms=ttft_meas[has_ttft],
        tbt_shape=_Shape(*(field[has_tbt] for field in shape)),
        tbt_at=(tp[has_tbt], batch[has_tbt], context[has_tbt]),
        tbt_ms=tbt_meas[has_tbt],
    )


def _with_jitter(fitted: KindFactors, rows: pd.DataFrame, start: KindFactors) -> tuple[KindFactors, bool]:
    """`fitted` with j90 and j99 from the rows' percentiles (else `start`'s), and whether rows gave any."""
    j90, seen90 = _jitter(rows, 90, start.j90)
    j99, seen99 = _jitter(rows, 99, start.j99)
    return msgspec.structs.replace(fitted, j90=j90, j99=j99), seen90 or seen99


def _fit_errors(data: _DeviceRows, ttft: np.ndarray, tbt: np.ndarray) -> dict[str, Any]:
    """DeviceFit's error fields: rows used, RMS and max of |estimated / measured - 1|, per metric."""

    def rms(err: np.ndarray) -> float:
        return float(np.sqrt(np.mean(err**2))) if err.size else math.nan

    def peak(err: np.ndarray) -> float:
        return float(err.max()) if err.size else math.nan

    ttft_err = np.abs(ttft / data.ttft_ms - 1)
    tbt_err = np.abs(tbt / data.tbt_ms - 1)
    return {
        "ttft_rows": int(data.ttft_ms.size),
        "tbt_rows": int(data.tbt_ms.size),
        "ttft_rms": rms(ttft_err),
        "ttft_max": peak(ttft_err),
        "tbt_rms": rms(tbt_err),
        "tbt_max": peak(tbt_err),
    }


def _fit_device(
    device: str,
    rows: pd.DataFrame,
    hw: HardwareSpec,
    models: dict[str, ModelSpec],
    start: KindFactors,
    output_tokens: int,
    fit_jitter: bool,
    parameters: tuple[str, ...] = PARAMETERS,
) -> DeviceFit:
    """Least squares on log(estimated / measured) of the device's p50 TTFT and TBT."""
    data = _device_rows(device, rows, models, output_tokens)
    start = _start(start, parameters)

    def factors(x: np.ndarray) -> KindFactors:
        return msgspec.structs.replace(
            start, **{name: float(v) for name, v in zip(parameters, x, strict=True)}
        )

    log_ttft, log_tbt = np.log(data.ttft_ms), np.log(data.tbt_ms)

    def residuals(x: np.ndarray) -> np.ndarray:
        ttft, tbt = data.predict(hw, factors(x))
        return np.concatenate([np.log(ttft) - log_ttft, np.log(tbt) - log_tbt])

    x, cost, unconstrained = _solve(residuals, start, parameters)
    fitted, jitter_measured = factors(x), False
    if fit_jitter:
        fitted, jitter_measured = _with_jitter(fitted, rows, start)
    ttft, tbt = data.predict(hw, factors(x))
    return DeviceFit(
        device=device,
        spec=hw,
        factors=fitted,
        models=sorted(set(rows.model)),
        rows=len(rows),
        cost=cost,
        unconstrained=unconstrained,
        jitter_measured=jitter_measured,
        **_fit_errors(data, ttft, tbt),
    )


def fit(
    table_or_frame: tables.ProfileTable | pd.DataFrame,
    hardware: dict[str, HardwareSpec] | None = None,
    models: dict[str, ModelSpec] | None = None,
    base: Efficiency | None = None,
    *,
    output_tokens: int = 128,
    fit_jitter: bool = True,
    parameters: Sequence[str] = PARAMETERS,
) -> Calibration:
    """Fit e_c, e_m, o_pre, o_dec (and j90, j99 from the percentiles) per device of the measured rows.

    `output_tokens` must be the output length the rows were measured with: a decode step reads a mean
    context of prompt + output / 2 tokens, as in `estimate_rows`. Every device must be in `hardware`
    (default HARDWARE) and every model in `models` (default CATALOG) with its architecture, else InputError.
    Each device's fit starts from `base` (default `Efficiency()`) factors of the device (or its kind).
    `parameters` (names from FITTABLE) replaces the default set; the rest stay at the base values, except
    that a fitted per-call prefill cost replaces the base's per-layer one (`prefill_layer_ms` = 0) unless
    that is fitted too.
    """
    names = _check_parameters(parameters)
    frame = _frame(table_or_frame)
    if frame.empty:
        raise InputError("no rows to calibrate against", field="profiles")
    specs = HARDWARE if hardware is None else hardware
    catalog = _resolve(frame, specs, CATALOG if models is None else models)
    eff = base or Efficiency()
    fits = {}
    for device, rows in frame.groupby("device", sort=True):
        hw = specs[str(device)]
        try:
            start = eff.factors(hw)
        except ValueError as error:
            raise InputError(str(error), field="profiles.device") from error
        fits[str(device)] = _fit_device(
            str(device), rows.reset_index(drop=True), hw, catalog, start, output_tokens, fit_jitter, names
        )
    return Calibration(base=eff, devices=fits, output_tokens=output_tokens)


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.2f}"


def report(calibration: Calibration) -> str:
    """A Markdown table, one line per device: rows, TTFT and TBT error (RMS / max, %), fitted factors."""
    header = (
        "| Device | Kind | Rows | TTFT rms % | TTFT max % | TBT rms % | TBT max % "
        "| e_c | e_m | o_pre ms | o_dec ms | j90 | j99 |"
    )
    lines = [header, "|" + "---|" * 13]
    notes = []
    for name, fit in sorted(calibration.devices.items()):
        f = fit.factors
        jitter = "" if fit.jitter_measured else "*"
        lines.append(
            f"| {name} | {fit.spec.kind} | {fit.rows} | {_pct(fit.ttft_rms)} | {_pct(fit.ttft_max)} "
            f"| {_pct(fit.tbt_rms)} | {_pct(fit.tbt_max)} | {f.compute_eff:.3f} | {f.mem_eff:.3f} "
            f"| {f.prefill_overhead_ms:.3f} | {f.decode_overhead_ms:.3f} "
            f"| {f.j90:.3f}{jitter} | {f.j99:.3f}{jitter} |"
        )
        if fit.unconstrained:
            notes.append(
                f"{name}: the rows do not constrain {', '.join(fit.unconstrained)} (left at the base value)"
            )
    if any(not fit.jitter_measured for fit in calibration.devices.values()):
        notes.append("* no p90/p99 measured: base spread kept")
    notes.append(
        f"Fitted on p50 by least squares of log(estimated / measured); e_i and alpha from base "
        f"{calibration.base.tag!r}; decode context = prompt + {calibration.output_tokens} / 2."
    )
    return "\n".join(lines + [""] + notes)


# --- published figures ---------------------------------------------------------------------------------

Metric = Literal["ttft", "tbt", "e2e"]


class Figure(Base):
    """One latency a public source printed, and exactly what ran: model, device spec, tp, batch, lengths.

    metric: "ttft" (prefill of the whole batch), "tbt" (one decode step at `batch`, mean context prompt +
    output / 2, as in `estimate_rows`) or "e2e" (a static batch end to end: ttft + (output - 1) tbt).
    `hardware` and `model` are what the source ran: a precision variant where it ran one (FP8: one byte per
    weight and KV element, FP8 peak TFLOPS in `bf16_tflops`), under the catalog device's name so its factors
    apply. `fit` names the factor set this figure was fitted into ("" = only compared). `comparable` is False
    where the figure includes what the estimator does not model (queueing behind other requests, prefills
    interleaved with decode steps); such figures are tabulated, never fitted or pinned.
    """

    label: str
    source: str
    model: ModelSpec
    hardware: HardwareSpec
    tp: int
    batch: int
    prompt_tokens: int
    output_tokens: int
    metric: Metric
    measured_ms: float
    fit: str = ""
    comparable: bool = True
    note: str = ""


def _predict(figures: Sequence[Figure], factors: Callable[[Figure], KindFactors]) -> np.ndarray:
    """Estimated ms of each figure, under the factors `factors(figure)` gives (no capacity check)."""
    out = []
    for figure in figures:
        shape = _shape(figure.model)
        f = factors(figure)
        tp, batch, prompt = (np.array([float(v)]) for v in (figure.tp, figure.batch, figure.prompt_tokens))
        context = prompt + figure.output_tokens / 2
        ttft = float(prefill_ms(shape, figure.hardware, f, tp, batch, prompt)[0])
        tbt = float(decode_ms(shape, figure.hardware, f, tp, batch, context)[0])
        out.append({"ttft": ttft, "tbt": tbt, "e2e": ttft + (figure.output_tokens - 1) * tbt}[figure.metric])
    return np.array(out)


def estimate_figures(figures: Sequence[Figure], efficiency: Efficiency | None = None) -> np.ndarray:
    """The estimator's p50 for each figure, in ms, with `efficiency` (default `Efficiency()`)."""
    eff = efficiency or Efficiency()
    return _predict(figures, lambda figure: eff.factors(figure.hardware))


class FigureFit(Base):
    """One factor set fitted to figures: the factors, the error per figure and overall (fractions)."""

    factors: KindFactors
    labels: list[str]
    ratios: list[float]  # estimated / measured, per figure
    rms: float
    max: float
    cost: float
    unconstrained: list[str] = []


def fit_figures(
    figures: Sequence[Figure], start: KindFactors, parameters: Sequence[str] = PARAMETERS
) -> FigureFit:
    """One factor set for all `figures` (least squares of log(estimated / measured), as `fit`).

    `start` gives the parameters not fitted and the first starting point; `parameters` (names from
    FITTABLE) are fitted within their bounds, with the same rule as `fit` for the per-call and per-layer
    prefill costs. Raises InputError for no figures, a figure the estimator cannot model or a
    non-comparable figure.
    """
    names = _check_parameters(parameters)
    if not figures:
        raise InputError("no figures to fit", field="figures")
    for figure in figures:
        if not figure.comparable:
            raise InputError(f"{figure.label}: not comparable, it cannot be fitted", field="figures")
        try:
            _shape(figure.model)
        except ValueError as error:
            raise InputError(f"{figure.label}: {error}", field="figures") from error
    first = _start(start, names)
    measured = np.log(np.array([figure.measured_ms for figure in figures]))

    def factors(x: np.ndarray) -> KindFactors:
        return msgspec.structs.replace(first, **{n: float(v) for n, v in zip(names, x, strict=True)})

    def residuals(x: np.ndarray) -> np.ndarray:
        f = factors(x)
        return np.log(_predict(figures, lambda _: f)) - measured

    x, cost, unconstrained = _solve(residuals, first, names)
    ratios = np.exp(residuals(x))
    errors = np.abs(ratios - 1)
    return FigureFit(
        factors=factors(x),
        labels=[figure.label for figure in figures],
        ratios=[float(r) for r in ratios],
        rms=float(np.sqrt(np.mean(errors**2))),
        max=float(errors.max()),
        cost=cost,
        unconstrained=unconstrained,
    )


def _llama2_70b() -> ModelSpec:
    """Llama-2-70B: the Llama-3.1-70B shapes with a 32,000-token vocabulary. 68.977 B parameters, derived
    from its config.json (80 layers x 855.6 M + 2 x 32000 x 8192 untied embeddings), not in CATALOG."""
    return msgspec.structs.replace(CATALOG["llama-3.1-70b"], name="llama-2-70b", params_b=68.977)


def _fp8(model: ModelSpec) -> ModelSpec:
    """The model with FP8 weights and KV cache (one byte per element)."""
    return msgspec.structs.replace(model, name=f"{model.name}-fp8", bytes_per_element=1)


_NIM_SOURCE = "docs.nvidia.com/nim/benchmarking/llm/1.0.0/performance, NIM 1.8.0"
# docs/public-figures.md sections 1 (Neuron CSVs) and 3 (LLM-Inference-Bench, TensorRT-LLM, NIM):
# (source, fit group, rows of (label, model, hardware, tp, batch, prompt, output, metric, measured ms)), the
# model and hardware by the short names of `_what_ran`
_PUBLIC_SOURCES: tuple[tuple[str, str, tuple[tuple[Any, ...], ...]], ...] = (
    (
        # inf2.48xlarge TP24 = 12 chips. The Llama-3-70B rows were inputs of the roofline-v1 inferentia
        # fit (docs/profiles.md); the Llama-2-70B row was not.
        "aws-neuron-sdk@81ce03ae about-neuron/benchmarks/inf2/latency_data_decoder.csv (Neuron 2.18)",
        "",
        (
            ("inf2 Llama-3-70B TTFT 128", "l70", "inf2", 12, 1, 128, 128, "ttft", 77.81),
            ("inf2 Llama-3-70B TPOT 128/128", "l70", "inf2", 12, 1, 128, 128, "tbt", 32.2),
            ("inf2 Llama-3-70B TTFT 2048", "l70", "inf2", 12, 1, 2048, 2048, "ttft", 745.49),
            ("inf2 Llama-3-70B TPOT 2048/2048", "l70", "inf2", 12, 1, 2048, 2048, "tbt", 34.67),
            ("inf2 Llama-2-70B TTFT 1024", "l2_70", "inf2", 12, 1, 1024, 1024, "ttft", 277.02),
            ("inf2 Llama-2-70B TPOT 1024/1024", "l2_70", "inf2", 12, 1, 1024, 1024, "tbt", 33.73),
        ),
    ),
    (
        # trn1.32xlarge TP32 = 16 chips.
        "aws-neuron-sdk@81ce03ae about-neuron/benchmarks/trn1/latency_data_decoder.csv",
        "trainium",
        (
            ("trn1 Llama-2-70B TTFT 2048", "l2_70", "trn1", 16, 1, 2048, 1024, "ttft", 232.48),
            ("trn1 Llama-2-70B TPOT 2048/1024", "l2_70", "trn1", 16, 1, 2048, 1024, "tbt", 26.04),
            ("trn1 Llama-3-8B TTFT 128", "l8", "trn1", 16, 1, 128, 3968, "ttft", 14.75),
            ("trn1 Llama-3-8B TPOT 128/3968", "l8", "trn1", 16, 1, 128, 3968, "tbt", 5.86),
        ),
    ),
    (
        # First-token latency: one output token. A100 FP16, H100 FP8.
        "NVIDIA/TensorRT-LLM@138f96d4 docs/source/performance.md, low latency (v0.5)",
        "",
        (
            ("A100 TRT-LLM Llama-2-7B TTFT 128", "l2_7", "a100", 1, 1, 128, 1, "ttft", 16),
            ("A100 TRT-LLM Llama-2-7B TTFT 2048", "l2_7", "a100", 1, 1, 2048, 1, "ttft", 133),
            ("A100x4 TRT-LLM Llama-2-70B TTFT 128", "l2_70", "a100", 4, 1, 128, 1, "ttft", 47),
            ("A100x4 TRT-LLM Llama-2-70B TTFT 2048", "l2_70", "a100", 4, 1, 2048, 1, "ttft", 377),
            ("H100 FP8 TRT-LLM Llama-2-7B TTFT 128", "l2_7_fp8", "h100_fp8", 1, 1, 128, 1, "ttft", 7),
            ("H100 FP8 TRT-LLM Llama-2-7B TTFT 2048", "l2_7_fp8", "h100_fp8", 1, 1, 2048, 1, "ttft", 36),
            ("H100x4 FP8 TRT-LLM Llama-2-70B TTFT 128", "l2_70_fp8", "h100_fp8", 4, 1, 128, 1, "ttft", 26),
            ("H100x4 FP8 TRT-LLM Llama-2-70B TTFT 2048", "l2_70_fp8", "h100_fp8", 4, 1, 2048, 1, "ttft", 109),
        ),
    ),
    (
        # TTFT of a batch of 16 prompts of 1024 tokens (ISL = OSL).
        "argonne-lcf/LLM-Inference-Bench@4211f5d4 Plots/Fig_22/all_results_TTFT_ITL.csv",
        "",
        (
            ("A100 vLLM Llama-3-8B TTFT bs16 1024", "l8", "a100", 1, 16, 1024, 1024, "ttft", 1042),
            ("H100 vLLM Llama-3-8B TTFT bs16 1024", "l8", "h100", 1, 16, 1024, 1024, "ttft", 426),
            ("H100 TRT-LLM Mistral-7B TTFT bs16 1024", "mistral", "h100", 1, 16, 1024, 1024, "ttft", 402),
        ),
    ),
    (
        # Static batches end to end (ISL = OSL); the TensorRT-LLM engines are built FP16.
        "argonne-lcf/LLM-Inference-Bench@4211f5d4 Plots/All_results.csv",
        "",
        (
            ("A100 vLLM Llama-3-8B e2e 128/128", "l8", "a100", 1, 1, 128, 128, "e2e", 1826),
            ("A100 vLLM Llama-3-8B e2e 1024/1024", "l8", "a100", 1, 1, 1024, 1024, "e2e", 14940),
            ("A100 vLLM Llama-3-8B e2e bs64 1024/1024", "l8", "a100", 1, 64, 1024, 1024, "e2e", 36160),
            ("A100x4 TRT-LLM Llama-3-70B e2e 128/128", "l70", "a100", 4, 1, 128, 128, "e2e", 4300),
            ("H100 TRT-LLM Llama-3-8B e2e 128/128", "l8", "h100", 1, 1, 128, 128, "e2e", 897),
            ("H100 TRT-LLM Llama-3-8B e2e bs64 1024/1024", "l8", "h100", 1, 64, 1024, 1024, "e2e", 17480),
            ("H100x4 TRT-LLM Llama-3-70B e2e 128/128", "l70", "h100", 4, 1, 128, 128, "e2e", 2310),
        ),
    ),
    (
        # 2 x H100-80G, FP8, TP2, concurrency 1 (one request at a time).
        _NIM_SOURCE,
        "",
        (
            (
                "H100x2 FP8 NIM Llama-3.3-70B TTFT 5000",
                "l70_fp8",
                "h100_fp8",
                2,
                1,
                5000,
                500,
                "ttft",
                406.77,
            ),
            (
                "H100x2 FP8 NIM Llama-3.3-70B ITL 5000/500",
                "l70_fp8",
                "h100_fp8",
                2,
                1,
                5000,
                500,
                "tbt",
                18.58,
            ),
            ("H100x2 FP8 NIM Llama-3.3-70B TTFT 500", "l70_fp8", "h100_fp8", 2, 1, 500, 2000, "ttft", 47.77),
            (
                "H100x2 FP8 NIM Llama-3.3-70B ITL 500/2000",
                "l70_fp8",
                "h100_fp8",
                2,
                1,
                500,
                2000,
                "tbt",
                18.91,
            ),
        ),
    ),
)
# NIM at concurrency > 1: read as a batch of that many, but not a static batch (see Figure.comparable).
# (concurrency, TTFT ms, ITL ms), each with 5,000 prompt and 500 output tokens
_NIM_CONCURRENT: tuple[tuple[int, float, float], ...] = (
    (5, 546.7, 21.83),
    (25, 688.69, 38.75),
    (50, 834.51, 59.73),
    (100, 7996.25, 92.91),
)


def _what_ran() -> tuple[dict[str, ModelSpec], dict[str, HardwareSpec]]:
    """The models and the device specs the cited sources ran, by the short names `_PUBLIC_SOURCES` uses."""
    l70, l2_70, l2_7 = CATALOG["llama-3.1-70b"], _llama2_70b(), CATALOG["llama-2-7b"]
    models = {
        "l70": l70,
        "l2_70": l2_70,
        "l8": CATALOG["llama-3.1-8b"],
        "l2_7": l2_7,
        "mistral": CATALOG["mistral-7b"],
        "l2_7_fp8": _fp8(l2_7),
        "l2_70_fp8": _fp8(l2_70),
        "l70_fp8": _fp8(l70),
    }
    hardware = {name: HARDWARE[name] for name in ("a100", "h100", "inf2", "trn1")}
    h100 = hardware["h100"]
    # FP8 dense = 2 x BF16 dense on Hopper tensor cores (989 -> 1,979 TFLOPS): an assumption, not in
    # public-figures.md. The name stays "h100" so the H100's factors apply.
    hardware["h100_fp8"] = msgspec.structs.replace(h100, bf16_tflops=2 * h100.bf16_tflops)
    return models, hardware


def _public_figures() -> tuple[Figure, ...]:
    """docs/public-figures.md sections 1 (Neuron CSVs) and 3 (LLM-Inference-Bench, TensorRT-LLM, NIM)."""
    models, hardware = _what_ran()
    figures = []
    for source, group, rows in _PUBLIC_SOURCES:
        for label, model, hw_name, tp, batch, prompt, output, metric, ms in rows:
            hw = hardware[hw_name]
            fit = group or (hw.name if hw.name in ("a100", "h100") else "")
            figures.append(
                Figure(
                    label=label,
                    source=source,
                    model=models[model],
                    hardware=hw,
                    tp=tp,
                    batch=batch,
                    prompt_tokens=prompt,
                    output_tokens=output,
                    metric=metric,
                    measured_ms=float(ms),
                    fit=fit,
                )
            )
    figures += _nim_concurrent_figures(models["l70_fp8"], hardware["h100_fp8"])
    return tuple(figures)


def _nim_concurrent_figures(model: ModelSpec, hardware: HardwareSpec) -> list[Figure]:
    """The NIM figures at concurrency > 1 (`_NIM_CONCURRENT`): tabulated, not comparable."""
    figures = []
    for concurrency, ttft, itl in _NIM_CONCURRENT:
        for metric, ms in (("ttft", ttft), ("tbt", itl)):
            what = "TTFT" if metric == "ttft" else "ITL"
            figures.append(
                Figure(
                    label=f"H100x2 FP8 NIM Llama-3.3-70B {what} 5000/500 c={concurrency}",
                    source=_NIM_SOURCE,
                    model=model,
                    hardware=hardware,
                    tp=2,
                    batch=concurrency,
                    prompt_tokens=5000,
                    output_tokens=500,
                    metric=metric,
                    measured_ms=ms,
                    comparable=False,
                    note="concurrency > 1: queueing and prefills interleaved with the decode steps",
                )
            )
    return figures


PUBLIC_FIGURES: tuple[Figure, ...] = _public_figures()
