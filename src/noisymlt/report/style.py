"""How the report's figures look: the names readers see, sizes and fonts for a two-column paper, colours,
and the one way every figure is written (PNG and PDF, the same data giving the same bytes).

Figures are drawn at their printed size, one column of a two-column paper (COLUMN_WIDTH inches wide), so a
font size in points is the size a reader sees. Nothing here imports matplotlib at module level: the workflow
imports DATASET_TITLES while it parses its rules.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

DATASET_TITLES = {"voc": "VOC-MLT-Noise", "coco": "COCO-MLT-Noise", "toy": "Toy-MLT-Noise"}

COLUMN_WIDTH = 3.4  # inches: one column of IEEE's two-column layout (3.5 in) less a margin
FONT_PT = 7.0  # the smallest text of a printed figure; titles a point larger
PNG_DPI = 300  # print resolution: the PNG is what Snakemake's report shows

# Okabe & Ito's colour-blind-safe palette (the lines of a few kinds; many methods need tab10 plus markers)
BLACK, ORANGE, SKY_BLUE, GREEN, BLUE, VERMILLION, PURPLE = (
    "#000000", "#E69F00", "#56B4E9", "#009E73", "#0072B2", "#D55E00", "#CC79A7")


def dataset_title(name: str) -> str:
    return DATASET_TITLES.get(name, name)


@contextlib.contextmanager
def paper_style():
    """Fonts of at least FONT_PT, thin axes, no top/right spines: matplotlib's defaults are for screens."""
    import matplotlib

    matplotlib.use("Agg")
    with matplotlib.rc_context({
        "font.size": FONT_PT, "axes.titlesize": FONT_PT + 1, "axes.labelsize": FONT_PT,
        "xtick.labelsize": FONT_PT, "ytick.labelsize": FONT_PT, "legend.fontsize": FONT_PT,
        "figure.titlesize": FONT_PT + 1, "axes.linewidth": 0.6, "xtick.major.width": 0.6,
        "ytick.major.width": 0.6, "xtick.major.size": 2.5, "ytick.major.size": 2.5, "lines.markersize": 3.5,
        "axes.spines.top": False, "axes.spines.right": False, "grid.linewidth": 0.4, "grid.alpha": 0.5,
        "legend.handlelength": 2.2, "pdf.fonttype": 42,  # TrueType in the PDF: text stays text
    }):
        yield


def save_figure(fig, out: Path) -> list[Path]:
    """OUT (PNG) and OUT with .pdf, with no dates or version stamps inside (figures are tracked outputs:
    the same data give the same bytes); returns both paths."""
    import matplotlib.pyplot as plt

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pdf = out.with_suffix(".pdf")
    fig.savefig(out, dpi=PNG_DPI, metadata={"Software": None})
    fig.savefig(pdf, metadata={"CreationDate": None, "Producer": None, "Creator": None})
    plt.close(fig)
    return [out, pdf]
