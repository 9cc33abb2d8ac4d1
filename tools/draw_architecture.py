"""Draw the GNO's architecture figure of the method page (docs/assets/gno_architecture.svg).

    python tools/draw_architecture.py [--out docs/assets/gno_architecture.svg]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "docs" / "assets" / "gno_architecture.svg"
COLOURS = {"data": "#e8eef7", "layer": "#fdf1dc", "gate": "#e3f2e1", "boundary": "#f6e1e6", "block": "#fafafa"}


def _box(ax, x, y, w, h, text, kind, size=9):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08", fc=COLOURS[kind],
                                ec="#555555", lw=1.0))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, wrap=True)


def _arrow(ax, start, end, text=None, rad=0.0):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=11, lw=1.0, color="#333333",
                                 connectionstyle=f"arc3,rad={rad}"))
    if text:
        ax.text((start[0] + end[0]) / 2 + 0.05, (start[1] + end[1]) / 2 + 0.08, text, fontsize=7.5, color="#333333")


def draw(out: Path = OUT) -> Path:
    fig, ax = plt.subplots(figsize=(10.5, 5.6))
    ax.set_xlim(0, 10.5)
    ax.set_ylim(0, 5.6)
    ax.axis("off")
    # inputs
    _box(ax, 0.1, 4.3, 1.7, 0.8, "field $u(t)$\n(B, C, H, W)", "data")
    _box(ax, 0.1, 2.6, 1.7, 0.8, "parameters $\\theta$\n(B, P)", "data")
    _box(ax, 0.1, 0.9, 1.7, 0.8, "boundary $\\mathcal{B}$\ntypes, data, faces", "data")
    # encoding
    _box(ax, 2.3, 4.3, 1.6, 0.8, "patch embedding\n+ position", "layer")
    _box(ax, 2.3, 2.6, 1.6, 0.8, "normalise,\nembed: $\\theta$-token", "layer")
    _box(ax, 2.3, 0.9, 1.6, 0.8, "boundary patches\n(per face)", "layer")
    _arrow(ax, (1.8, 4.7), (2.3, 4.7))
    _arrow(ax, (1.8, 3.0), (2.3, 3.0))
    _arrow(ax, (1.8, 1.3), (2.3, 1.3))
    # one block (repeated L times)
    ax.add_patch(FancyBboxPatch((4.4, 0.35), 4.3, 4.95, boxstyle="round,pad=0.02,rounding_size=0.1", fc=COLOURS["block"],
                                ec="#888888", lw=1.0, ls="--"))
    ax.text(6.55, 5.12, "block $\\ell$ (repeated $L$ times)", ha="center", fontsize=9, style="italic")
    _box(ax, 4.6, 2.6, 1.5, 0.8, "gate $s_\\ell(\\theta)$\n$k^* = \\arg\\max$", "gate")
    _box(ax, 4.6, 0.9, 1.5, 0.8, "boundary transfer\n$\\mathcal{T}(\\mathcal{B}, v_\\ell) \\to h_\\ell$", "boundary", 8.5)
    _box(ax, 6.5, 3.55, 2.0, 1.25, "kernel $\\kappa_{k^*}$ only\n(attention over tokens;\ncontext: $\\theta$-token, $h_\\ell$)",
         "layer", 8.5)
    _box(ax, 7.0, 1.9, 1.5, 0.9, "+ local term, MLP\n$v_{\\ell+1}$", "layer")
    _box(ax, 4.6, 3.85, 1.5, 0.7, "$K$ kernels\n(bank)", "gate", 8)
    _arrow(ax, (3.9, 4.85), (6.5, 4.65), "tokens $v_\\ell$")
    _arrow(ax, (3.9, 3.0), (4.6, 3.0))
    _arrow(ax, (3.9, 1.3), (4.6, 1.3))
    _arrow(ax, (6.1, 3.0), (6.9, 3.55), "$k^*$")
    _arrow(ax, (6.1, 1.3), (6.75, 3.55), "$h_\\ell$", rad=0.2)
    _arrow(ax, (6.1, 4.2), (6.5, 4.2))
    _arrow(ax, (7.75, 3.55), (7.75, 2.8))
    _arrow(ax, (7.0, 2.1), (5.6, 1.7), "edge tokens", rad=-0.15)
    # decoding and objective
    _box(ax, 9.0, 2.6, 1.4, 0.8, "decoder\n$u(t + \\Delta t)$", "data")
    _arrow(ax, (8.5, 2.35), (9.0, 3.0))
    _box(ax, 9.0, 0.9, 1.4, 1.1, "group DRO over\n(boundary type,\n$\\theta$-bin) groups\nafter MSE warm-up",
         "gate", 7.5)
    _arrow(ax, (9.7, 2.6), (9.7, 2.0))
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="svg", metadata={"Date": None})
    plt.close(fig)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    print(draw(parser.parse_args().out))
