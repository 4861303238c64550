"""svgplot: well-formed SVG, elements where the page's readers (and tests) look for them, no escapes."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from vllm_fleet.core import svgplot
from vllm_fleet.core.svgplot import Point

NS = {"s": "http://www.w3.org/2000/svg"}
T0 = 1_700_000_000  # 22:13:20 UTC


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return root


def box(root: ET.Element) -> tuple[float, float]:
    x0, y0, w, h = (float(v) for v in root.attrib["viewBox"].split())
    assert (x0, y0) == (0, 0)
    return w, h


def coords(el: ET.Element) -> list[tuple[float, float]]:
    return [(float(a), float(b)) for a, b in (p.split(",") for p in el.attrib["points"].split())]


def inside(root: ET.Element, xy: tuple[float, float]) -> bool:
    w, h = box(root)
    return 0 <= xy[0] <= w and 0 <= xy[1] <= h


def by_class(root: ET.Element, tag: str, cls: str) -> list[ET.Element]:
    return [e for e in root.iter(f"{{{NS['s']}}}{tag}") if e.attrib.get("class") == cls]


def texts(root: ET.Element, cls: str) -> list[str]:
    return ["".join(e.itertext()) for e in by_class(root, "text", cls)]


# --- line_chart -------------------------------------------------------------------------------------------
def test_line_chart_draws_each_series_in_its_own_colour_inside_the_box():
    series = [("h1/a", [(T0, 1.0), (T0 + 30, 4.0), (T0 + 60, 2.0)]), ("h2/b", [(T0, 3.0), (T0 + 60, 3.5)])]
    root = parse(svgplot.line_chart("Requests running", series, unit="req"))
    assert box(root) == (460, 220)
    lines = by_class(root, "polyline", "series")
    assert [e.attrib["data-label"] for e in lines] == ["h1/a", "h2/b"]
    assert len({e.attrib["stroke"] for e in lines}) == 2
    assert len(coords(lines[0])) == 3
    assert all(inside(root, xy) for e in lines for xy in coords(e))
    # time runs left to right, larger values higher up (smaller y)
    (x0, y0), (x1, y1), (x2, _) = coords(lines[0])
    assert x0 < x1 < x2 and y1 < y0
    assert texts(root, "unit") == ["req"]
    assert not by_class(root, "text", "nodata")


def test_line_chart_legend_names_each_series_with_its_colour():
    root = parse(svgplot.line_chart("t", [("one", [(T0, 1)]), ("two", [(T0, 2)])]))
    legend = [e for e in root.iter(f"{{{NS['s']}}}g") if e.attrib.get("class") == "legend"]
    colours = {e.attrib["data-label"]: e.attrib["stroke"] for e in by_class(root, "polyline", "series")}
    assert {g.attrib["data-label"]: g.find("s:rect", NS).attrib["fill"] for g in legend} == colours
    assert ["".join(g.itertext()) for g in legend] == ["one", "two"]


def test_line_chart_time_ticks_are_utc_clock_times_within_the_data():
    root = parse(svgplot.line_chart("t", [("a", [(T0, 1.0), (T0 + 120, 2.0)])]))
    ticks = texts(root, "xtick")
    assert 2 <= len(ticks) <= 5
    assert all(len(t) == 8 and t.count(":") == 2 for t in ticks)
    assert "22:14:00" in ticks and all("22:13:20" <= t <= "22:15:20" for t in ticks)


def test_line_chart_y_ticks_are_round_and_cover_the_values():
    root = parse(svgplot.line_chart("t", [("a", [(T0, 3.0), (T0 + 10, 97.0)])]))
    ticks = [float(t) for t in texts(root, "ytick")]
    assert 4 <= len(ticks) <= 6
    assert ticks[0] <= 3 and ticks[-1] >= 97
    steps = {round(b - a, 9) for a, b in zip(ticks, ticks[1:], strict=False)}
    assert len(steps) == 1 and steps.pop() in (10, 20, 25, 50)


def test_empty_line_chart_says_no_data():
    root = parse(svgplot.line_chart("KV cache", []))
    assert texts(root, "nodata") == ["no data"]
    assert not by_class(root, "polyline", "series")
    assert by_class(root, "rect", "frame")


@pytest.mark.parametrize("series", [
    [("flat", [(T0, 5.0), (T0 + 10, 5.0)])],  # all values equal
    [("one", [(T0, 0.0)])],  # one point, at zero
    [("same time", [(T0, 1.0), (T0, 2.0)])],  # zero-width time range
])
def test_degenerate_ranges_still_draw_inside_the_box(series):
    root = parse(svgplot.line_chart("t", series))
    (line,) = by_class(root, "polyline", "series")
    assert all(inside(root, xy) for xy in coords(line))
    assert texts(root, "ytick")


def test_text_is_escaped():
    svg = svgplot.line_chart('<b>&"x"', [('a<"&>', [(T0, 1.0)])], unit="<u>")
    root = parse(svg)
    assert "<b>" not in svg
    assert by_class(root, "polyline", "series")[0].attrib["data-label"] == 'a<"&>'
    assert texts(root, "title") == ['<b>&"x"']


# --- scatter ----------------------------------------------------------------------------------------------
POINTS = [
    Point(100, 50, "base", "baseline"),
    Point(150, 80, "a=1"),
    Point(120, 90, "a=2 b=3", "recommended"),
    Point(300, 95, "a=4"),
    Point(0, 0, "a=5", "failed"),
]


def circle_xy(e: ET.Element) -> tuple[float, float]:
    return float(e.attrib["cx"]), float(e.attrib["cy"])


def test_scatter_marks_each_kind_and_lists_failed_points_instead_of_placing_them():
    root = parse(svgplot.scatter("trade-off", POINTS, [(100, 50), (120, 90), (300, 95)], "p99 ttft (ms)",
                                 "tok/s", target_x=200))
    assert box(root) == (560, 360)
    labels = {k: [e.attrib["data-label"] for e in by_class(root, "circle", k)]
              for k in ("point", "baseline", "recommended", "failed")}
    assert labels == {"point": ["a=1", "a=4"], "baseline": ["base"], "recommended": ["a=2 b=3"], "failed": []}
    assert texts(root, "failed") == ["failed: a=5"]
    rec, base = by_class(root, "circle", "recommended")[0], by_class(root, "circle", "baseline")[0]
    other = by_class(root, "circle", "point")[0]
    assert float(rec.attrib["r"]) > float(other.attrib["r"])
    assert rec.attrib["fill"] not in (other.attrib["fill"], base.attrib["fill"])
    (label,) = by_class(root, "text", "recommended-label")
    assert " ".join(s.text or "" for s in label) == "a=2 b=3"
    assert abs(float(label[0].attrib["y"]) - circle_xy(rec)[1]) < 20  # beside the point
    for e in root.iter(f"{{{NS['s']}}}circle"):
        assert inside(root, circle_xy(e))


def test_scatter_places_points_by_value_and_the_target_line_between():
    root = parse(svgplot.scatter("t", POINTS, [], "x", "y", target_x=200))
    xy = {e.attrib["data-label"]: circle_xy(e) for e in root.iter(f"{{{NS['s']}}}circle")
          if "data-label" in e.attrib}
    assert xy["base"][0] < xy["a=2 b=3"][0] < xy["a=1"][0] < xy["a=4"][0]  # latency left to right
    assert xy["a=4"][1] < xy["a=2 b=3"][1] < xy["a=1"][1] < xy["base"][1]  # throughput upwards
    (target,) = by_class(root, "line", "target")
    tx = float(target.attrib["x1"])
    assert target.attrib["x2"] == target.attrib["x1"] and "stroke-dasharray" in target.attrib
    assert xy["a=1"][0] < tx < xy["a=4"][0]
    assert not by_class(root, "polyline", "frontier")


def test_a_target_far_right_of_every_point_is_named_not_drawn():
    """A lax target (every point under it) must not squeeze the points against the y axis."""
    def xs(root: ET.Element) -> list[float]:
        return sorted(circle_xy(e)[0] for e in root.iter(f"{{{NS['s']}}}circle") if "data-label" in e.attrib)

    root = parse(svgplot.scatter("t", POINTS, [], "x", "y", target_x=1_000_000))
    assert not by_class(root, "line", "target")
    assert texts(root, "target-label") == ["target 1e+06 (right of every point)"]
    assert xs(root) == xs(parse(svgplot.scatter("t", POINTS, [], "x", "y")))  # placed as without a target


def test_scatter_frontier_follows_the_given_points():
    front = [(100, 50), (120, 90), (300, 95)]
    root = parse(svgplot.scatter("t", POINTS, front, "x", "y"))
    (line,) = by_class(root, "polyline", "frontier")
    xy = {e.attrib["data-label"]: circle_xy(e) for e in root.iter(f"{{{NS['s']}}}circle")
          if "data-label" in e.attrib}
    assert coords(line) == [xy["base"], xy["a=2 b=3"], xy["a=4"]]
    assert not by_class(root, "line", "target")


def test_long_recommended_label_is_wrapped_inside_the_box():
    label = " ".join(f"knob_number_{i}=123456" for i in range(4))
    pts = [Point(10, 10, label, "recommended"), Point(20, 20, "x")]
    root = parse(svgplot.scatter("t", pts, [], "x", "y"))
    (text,) = by_class(root, "text", "recommended-label")
    spans = list(text)
    assert len(spans) > 1 and " ".join(s.text or "" for s in spans) == label
    # at ~6.6 px a character, each line fits between the anchor and the frame edge
    w, _ = box(root)
    for s in spans:
        x = float(s.attrib["x"])
        width = 6.6 * len(s.text or "")
        assert (x - width >= 0) if text.attrib["text-anchor"] == "end" else (x + width <= w)


@pytest.mark.parametrize("points", [
    [Point(5, 5, "only", "recommended")],
    [Point(5, 5, "a"), Point(5, 5, "b", "baseline")],
    [Point(0, 0, "zero")],
])
def test_scatter_degenerate_ranges(points):
    root = parse(svgplot.scatter("t", points, [(p.x, p.y) for p in points], "x", "y"))
    for e in root.iter(f"{{{NS['s']}}}circle"):
        assert inside(root, circle_xy(e))


def test_scatter_with_only_failed_points_says_no_data():
    root = parse(svgplot.scatter("t", [Point(0, 0, "x", "failed")], [], "x", "y"))
    assert texts(root, "nodata") == ["no data"]
    assert texts(root, "failed") == ["failed: x"]


def test_many_failed_points_are_summarised():
    pts = [Point(0, 0, f"p{i}", "failed") for i in range(6)]
    root = parse(svgplot.scatter("t", pts, [], "x", "y"))
    assert texts(root, "failed")[-1] == "... and 3 more failed"
    for e in by_class(root, "text", "failed"):
        assert inside(root, (float(e.attrib["x"]), float(e.attrib["y"])))


def test_scatter_escapes_labels():
    svg = svgplot.scatter("<t>", [Point(1, 2, "<&>", "recommended")], [], "x<", "y&")
    root = parse(svg)
    assert by_class(root, "circle", "recommended")[0].attrib["data-label"] == "<&>"
    assert "".join(by_class(root, "text", "recommended-label")[0].itertext()) == "<&>"


def test_point_kind_is_checked():
    with pytest.raises(ValueError, match="kind"):
        Point(1, 1, "x", "best")


def test_nice_ticks():
    assert svgplot.nice_ticks(0, 97) == [0, 25, 50, 75, 100]
    assert svgplot.nice_ticks(180, 200) == [180, 185, 190, 195, 200]
    assert svgplot.nice_ticks(0, 0) == [0, 0.25, 0.5, 0.75, 1]
    t = svgplot.nice_ticks(7, 7)
    assert t[0] < 7 < t[-1]
