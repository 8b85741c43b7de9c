"""Bench pictures (`infer bench --plot FILE`, `infer bench compare ... --plot FILE`): one figure, with
every run overlaid in its own colour, of whichever panels the runs have data for:

- aggregate tokens/s against concurrency (the `--concurrency` sweep, or a serving run's limits),
- TTFT p50/p90/p99 against concurrency, and ITL p50/p90/p99 against concurrency,
- prefill tokens/s against prompt length (`-p 128,512,2048`, one line per depth).

matplotlib is an optional extra (`pip install 'infer[plot]'`); it is imported only here, and drawn
through its object API (a `Figure` of its own, no pyplot state), so nothing global is left behind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

FORMATS = (".png", ".svg")
MISSING = "infer bench --plot needs matplotlib, which is not installed: pip install 'infer[plot]'"
PERCENTILES = (("p50", "-"), ("p90", "--"), ("p99", ":"))


class PlotError(ValueError):
    """Why a picture cannot be drawn (one line for the CLI)."""


def check_plot_target(path: Path) -> None:
    """Refuse, before anything is measured, a file type we cannot write or a missing matplotlib."""
    if path.suffix.lower() not in FORMATS:
        raise PlotError(f"--plot {path}: the file must end in .png or .svg")
    _matplotlib()


def _matplotlib() -> Any:
    try:
        import matplotlib  # noqa: F401
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError(MISSING) from None
    return Figure


def _sweep(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Concurrency-sweep records (engine `tg<N> c<C>` and serving runs with a limit), by concurrency."""
    rows = [r for r in records if r.get("kind") in ("conc", "serve") and r.get("concurrency")]
    return sorted(rows, key=lambda r: r["concurrency"])


def _prefill(records: Sequence[Mapping[str, Any]]) -> dict[int, list[Mapping[str, Any]]]:
    """Prefill records by depth, each list by prompt length."""
    out: dict[int, list[Mapping[str, Any]]] = {}
    for r in records:
        if r.get("kind") == "pp":
            out.setdefault(int(r.get("depth", 0)), []).append(r)
    return {d: sorted(rows, key=lambda r: r["n_prompt"]) for d, rows in sorted(out.items())}


def _percentile_panel(key: str) -> Callable[[Any, str, Any, Sequence[Mapping[str, Any]]], bool]:
    def draw(ax: Any, label: str, colour: Any, records: Sequence[Mapping[str, Any]]) -> bool:
        rows = [r for r in _sweep(records) if isinstance(r.get(key), Mapping)]
        drawn = False
        for stat, style in PERCENTILES:
            points = [(r["concurrency"], r[key][stat]) for r in rows if stat in r[key]]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, style, marker="o", color=colour, label=f"{label} {stat}")
                drawn = True
        return drawn

    return draw


def _tps_panel(ax: Any, label: str, colour: Any, records: Sequence[Mapping[str, Any]]) -> bool:
    rows = _sweep(records)
    if not rows:
        return False
    ax.plot(
        [r["concurrency"] for r in rows], [r["tps_mean"] for r in rows], marker="o", color=colour, label=label
    )
    return True


def _prefill_panel(ax: Any, label: str, colour: Any, records: Sequence[Mapping[str, Any]]) -> bool:
    by_depth = _prefill(records)
    for index, (depth, rows) in enumerate(by_depth.items()):
        style = ("-", "--", ":", "-.")[index % 4]
        name = f"{label} @ d{depth}" if depth else label
        ax.plot(
            [r["n_prompt"] for r in rows],
            [r["tps_mean"] for r in rows],
            style,
            marker="o",
            color=colour,
            label=name,
        )
    return bool(by_depth)


PANELS: tuple[tuple[str, str, str, Callable[..., bool]], ...] = (
    ("aggregate tokens/s against concurrency", "concurrent requests", "tokens/s", _tps_panel),
    ("TTFT against concurrency", "concurrent requests", "TTFT (ms)", _percentile_panel("ttft_ms")),
    (
        "inter-token latency against concurrency",
        "concurrent requests",
        "ITL (ms)",
        _percentile_panel("itl_ms"),
    ),
    ("prefill tokens/s against prompt length", "prompt tokens", "tokens/s", _prefill_panel),
)
"""(title, x label, y label, draw(ax, run label, colour, records) -> whether it drew anything)."""


def panels_with_data(runs: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """The titles of the panels some run has data for, in drawing order."""
    Figure = _matplotlib()
    probe = Figure().add_subplot()
    return [
        title
        for title, _, _, draw in PANELS
        if any(draw(probe, "", "k", d.get("results", [])) for _, d in runs)
    ]


def plot_runs(runs: Sequence[tuple[str, Mapping[str, Any]]], path: Path) -> list[str]:
    """Draw `runs` ((label, `infer bench --json` output) each) overlaid into `path` (.png or .svg).
    Returns the titles of the panels drawn; PlotError when no run has anything to plot."""
    check_plot_target(path)
    import matplotlib
    from matplotlib.ticker import ScalarFormatter

    Figure = _matplotlib()
    titles = panels_with_data(runs)
    if not titles:
        raise PlotError(
            "nothing to plot: the runs have no concurrency sweep (--concurrency) and no prefill tests (-p)"
        )
    chosen = [panel for panel in PANELS if panel[0] in titles]
    columns = 2 if len(chosen) > 1 else 1
    rows = (len(chosen) + columns - 1) // columns
    # svg.fonttype none: text stays text in an SVG (searchable, and the tests read the labels)
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "infer"}):
        figure = Figure(figsize=(6.4 * columns, 4.2 * rows), layout="constrained")
        colours = [f"C{i % 10}" for i in range(len(runs))]
        for index, (title, xlabel, ylabel, draw) in enumerate(chosen):
            ax = figure.add_subplot(rows, columns, index + 1)
            for (label, data), colour in zip(runs, colours, strict=True):
                draw(ax, label, colour, data.get("results", []))
            ax.set_title(title)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
            if "prompt" in xlabel or "concurrent" in xlabel:
                ax.set_xscale("log", base=2)
                ax.xaxis.set_major_formatter(ScalarFormatter())  # 4, not 2^2
            ax.legend(fontsize="small")
        metadata = {"Date": None} if path.suffix.lower() == ".svg" else {}
        try:
            figure.savefig(path, metadata=metadata)
        except OSError as exc:
            raise PlotError(f"--plot {path}: cannot write it ({exc.strerror or exc})") from None
    return titles


__all__ = ["FORMATS", "MISSING", "PlotError", "check_plot_target", "panels_with_data", "plot_runs"]
