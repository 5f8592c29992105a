"""Pictures of a simulation: latency distributions against the SLO lines. matplotlib is imported lazily
(through the one helper the what-if plots use too) so the service and the CLI start without it."""

from pathlib import Path

import numpy as np

from fleetplan.models.errors import InputError
from fleetplan.models.simulation import SimulationReport
from fleetplan.whatif.plots import pyplot


def plot_latency_distributions(report: SimulationReport, path: Path) -> Path:
    """Empirical CDFs of TTFT and TBT per class, each with its SLO as a dashed line in the class's colour.

    Needs a report made with simulate(keep_samples=True). A curve that crosses its SLO line below the SLO
    percentile is a class missing its SLO.
    """
    plt = pyplot()
    classes = [c for c in report.classes if c.ttft_ms_samples]
    if not classes:
        raise InputError("no completed requests to plot (or the report has no samples)", field="plot")
    figure, axes = plt.subplots(1, 2, figsize=(13, 5), constrained_layout=True)
    colours = plt.get_cmap("tab10")
    for index, c in enumerate(classes):
        colour = colours(index % 10)
        for axis, samples, slo in (
            (axes[0], c.ttft_ms_samples, c.slo_ttft_ms),
            (axes[1], c.tbt_ms_samples, c.slo_tbt_ms),
        ):
            values = np.sort(np.asarray(samples, dtype=float))
            axis.step(
                values, np.arange(1, len(values) + 1) / len(values), where="post", color=colour, label=c.name
            )
            axis.axvline(slo, color=colour, linestyle="--", linewidth=0.8)
    for axis, title in ((axes[0], "TTFT"), (axes[1], "TBT (mean gap per request)")):
        axis.set_xscale("log")
        axis.set_xlabel(f"{title}, ms (dashed: the class's SLO)")
        axis.set_ylabel("fraction of requests")
        axis.grid(True, which="both", alpha=0.3)
    axes[1].legend(loc="lower right", fontsize="small")
    figure.suptitle(
        f"simulated {report.duration_s:g} s, seed {report.seed}: attainment {report.attainment:.1%}, "
        f"goodput {report.goodput_rps:.2f} of {report.predicted_goodput_rps:.2f} RPS planned"
    )
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
