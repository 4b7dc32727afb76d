"""PNG plots of a bench run: first-audio CDFs, and latency against the number of callers.

Needs matplotlib (``pip install -e '.[bench]'``); the gateway itself never imports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["GROUPS", "write_plots"]

#: Targets drawn together: each with the peer it is compared with.
GROUPS: list[tuple[str, tuple[str, ...]]] = [
    ("echo engine vs the floors", ("floor", "floor-picows", "gateway-echo")),
    ("vllm-omni engine vs vLLM-Omni's server (fake stage)", ("omni-server", "gateway-vllm-omni")),
    ("embedded engine (speech, server VAD)", ("gateway-embedded",)),
]


def _groups(data: dict[str, Any]) -> list[tuple[str, tuple[str, ...]]]:
    present = {r["target"] for r in data["results"]}
    return [(title, names) for title, names in GROUPS if present & set(names)]


def write_plots(data: dict[str, Any], folder: Path) -> list[Path]:
    """Write the plots of ``data`` into ``folder``; the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    groups = _groups(data)
    if not groups:
        return []
    written = []

    fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 4.2), squeeze=False)
    for ax, (title, names) in zip(axes[0], groups, strict=True):
        for r in data["results"]:
            if r["target"] not in names:
                continue
            values = sorted(r["samples"]["first_audio_ms"])
            if not values:
                continue
            ys = [(i + 1) / len(values) for i in range(len(values))]
            style = "-" if r["target"].startswith("gateway") else "--"
            ax.step(values, ys, style, where="post", label=f"{r['target']} ×{r['callers']}")
        ax.set_xscale("log")
        ax.set_xlabel("first audio after the turn (ms, log)")
        ax.set_ylabel("share of turns")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = folder / "bench-first-audio-cdf.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 4.2), squeeze=False)
    for ax, (title, names) in zip(axes[0], groups, strict=True):
        for name in names:
            rows = sorted((r for r in data["results"] if r["target"] == name), key=lambda r: r["callers"])
            rows = [r for r in rows if r["first_audio_ms"]["p50"] is not None]
            if not rows:
                continue
            xs = [r["callers"] for r in rows]
            line = ax.plot(xs, [r["first_audio_ms"]["p50"] for r in rows], "o-", label=f"{name} p50")[0]
            ax.plot(
                xs,
                [r["first_audio_ms"]["p99"] for r in rows],
                "s:",
                color=line.get_color(),
                label=f"{name} p99",
            )
        ax.set_yscale("log")
        ax.set_xlabel("concurrent callers")
        ax.set_ylabel("first audio (ms, log)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = folder / "bench-latency-vs-callers.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written
