"""Grouped horizontal bar charts as SVG text, for the pages scripts/render_*.py write.

The same document conventions as the `sieve` command's charts (tools/bench/svg_writer.h): a white
background, sans-serif text drawn by the viewer, matplotlib's tab10 colours. Output depends only on
the input, so a page's charts can be checked in CI like its text."""

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def escape(text):
    return (str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def text(x, y, content, size=11, anchor="start", extra=""):
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-family="sans-serif" font-size="{size}" '
            f'text-anchor="{anchor}"{extra}>{escape(content)}</text>\n')


def bar_chart(title, unit, groups, series, values, number=lambda v: f"{v:,.0f}"):
    """groups: row labels; series: bar names (one colour each, a legend); values[g][s]: a number
    or None (no bar). Bars run from 0 to the largest value; each is labelled with number(value)."""
    bar_h, gap, left, right, top = 18, 14, 150, 90, 52
    legend_h = 20
    group_h = bar_h * len(series) + gap
    width = 760
    height = top + legend_h + group_h * len(groups) + 36
    plot_w = width - left - right
    largest = max([v for row in values for v in row if v is not None] + [1e-9])
    out = [f'<?xml version="1.0" encoding="UTF-8"?>\n<svg xmlns="http://www.w3.org/2000/svg" '
           f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">\n'
           f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>\n',
           text(width / 2, 26, title, 15, "middle", ' font-weight="bold"')]
    x = left
    for index, name in enumerate(series):
        color = PALETTE[index % len(PALETTE)]
        out.append(f'<rect x="{x}" y="{top - 8}" width="12" height="12" fill="{color}"/>\n')
        out.append(text(x + 16, top + 2, name))
        x += 24 + 7 * len(name)
    y = top + legend_h
    for group, row in zip(groups, values):
        out.append(text(left - 8, y + group_h / 2 - gap / 2 + 4, group, 12, "end"))
        for index, value in enumerate(row):
            if value is None:
                continue
            length = plot_w * value / largest
            color = PALETTE[index % len(PALETTE)]
            out.append(f'<rect class="bar" x="{left}" y="{y + index * bar_h:.1f}" '
                       f'width="{length:.1f}" height="{bar_h - 3}" fill="{color}"/>\n')
            out.append(text(left + length + 4, y + index * bar_h + bar_h - 7, number(value), 11))
        y += group_h
    out.append(f'<line x1="{left}" y1="{top + legend_h - 4}" x2="{left}" y2="{y - gap + 4}" '
               f'stroke="#444"/>\n')
    out.append(text(left + plot_w / 2, height - 10, unit, 12, "middle"))
    out.append("</svg>\n")
    return "".join(out)
