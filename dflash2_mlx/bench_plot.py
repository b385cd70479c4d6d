"""The `dflash2 bench` PNG: speedup and τ per category (matplotlib, imported only here)."""

from __future__ import annotations

from pathlib import Path


def write_plot(report: dict, path: str | Path) -> Path:
    """PNG: speedup and τ per category, one bar per block size (matplotlib, Agg backend).
    Raises ImportError when matplotlib is not installed."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    results = report["results"]
    cats = list(results[0]["per_category"]) + ["all"]
    fig, axes = plt.subplots(1, 2, figsize=(max(8.0, 1.3 * len(cats) + 4), 4.2), dpi=110)
    width = 0.8 / max(len(results), 1)
    for j, res in enumerate(results):
        per = dict(res["per_category"], all=res["summary"])
        xs = [i + (j - (len(results) - 1) / 2) * width for i in range(len(cats))]
        for ax, key in zip(axes, ("speedup", "tau")):
            vals = [per[c].get(key) or 0.0 for c in cats]
            ax.bar(xs, vals, width, label=f"block {res['block']}")
    title = Path(str(report.get("pair", {}).get("name", ""))).name
    chip = report.get("environment", {}).get("chip")
    title += f" · {chip}" if chip else ""
    for ax, label in zip(axes, ("speedup vs plain mlx-lm (x)", "τ (tokens per round)")):
        ax.set_xticks(range(len(cats)))
        ax.set_xticklabels(cats, rotation=30, ha="right")
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0].axhline(1.0, color="black", linewidth=0.8)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"dflash2 bench: {title}")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path
