"""What every report figure must satisfy, checked on the matplotlib Figure its drawing function returns:
drawn at one column's width, text of at least 7 pt that stays inside the figure, a legend clear of the data,
and no internal names (method keys, dataset keys) where a reader sees labels."""

from __future__ import annotations

import re

COLUMN_WIDTH_IN = 3.5  # one column of a two-column paper
MIN_FONT_PT = 7.0


def visible_texts(fig) -> list:
    """Every Text artist that draws something: titles, axis titles, tick labels in view, legend, figure texts."""
    from matplotlib.text import Text

    fig.canvas.draw()
    unseen = set()  # labels of ticks outside the view: matplotlib keeps them but does not draw them
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
                if not lo - 1e-9 * (hi - lo) <= tick.get_loc() <= hi + 1e-9 * (hi - lo):
                    unseen |= {id(tick.label1), id(tick.label2)}
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and id(t) not in unseen
            and t.get_window_extent().width > 0]


def strings(fig) -> list[str]:
    return [t.get_text() for t in visible_texts(fig)]


def check_layout(fig, internal_names=()) -> None:
    """Column width, fonts, every text inside the figure, legends clear of every panel, no internal name."""
    width, _ = fig.get_size_inches()
    assert width <= COLUMN_WIDTH_IN, f"figure is {width} in wide: more than one column"
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    for t in visible_texts(fig):
        assert t.get_fontsize() >= MIN_FONT_PT, f"{t.get_text()!r} is {t.get_fontsize()} pt"
        ext = t.get_window_extent(renderer)
        assert (ext.x0 >= box.x0 - 1 and ext.x1 <= box.x1 + 1 and ext.y0 >= box.y0 - 1 and ext.y1 <= box.y1 + 1), \
            f"{t.get_text()!r} runs off the figure: {ext} outside {box}"
    for legend in [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]:
        ext = legend.get_window_extent(renderer)
        assert box.contains(ext.x0, ext.y0) and box.contains(ext.x1, ext.y1), "legend outside the figure"
        for ax in fig.axes:
            assert not ext.overlaps(ax.get_window_extent(renderer)), f"legend covers the panel {ax.get_title()!r}"
    for text in strings(fig):
        assert not re.search(r"[a-z]+_[a-z_]+", text.replace("\\", " ")), f"internal name in {text!r}"
        for name in internal_names:
            assert not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text), f"internal name {name!r} in {text!r}"
