//! Inline SVG charts for the HTML report: line charts (convergence, IOPS by block size) and
//! grouped bar charts (latency, throughput).
//!
//! Owns: geometry, axes, ticks, legends and escaping. The output is a standalone `<svg>` element
//! with no scripts, fonts or links, so a report opens offline and stays byte-for-byte
//! reproducible from its data.
//!
//! Invariants: every element opened is closed or self-closed, and all text passes through
//! [`xml_escape`], so the markup is well-formed whatever the target names are. Non-finite values,
//! and non-positive ones on a log axis, are skipped rather than drawn at the edge.
//!
//! Limits: at most [`PALETTE`]'s length of distinguishable series colours; more series reuse
//! colours (the legend still names each one).

use std::fmt::Write as _;

/// Series colours: targets keep their colour across every chart of a report.
pub(crate) const PALETTE: [&str; 8] =
    ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 340.0;
const LEFT: f64 = 72.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 58.0;
const BOTTOM: f64 = 48.0;

pub(crate) fn colour(index: usize) -> &'static str {
    PALETTE[index % PALETTE.len()]
}

/// A named series of (x, y) points, drawn in `colour(colour_index)`.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    pub name: String,
    pub colour_index: usize,
    pub points: Vec<(f64, f64)>,
}

/// A straight reference segment (window average, 110 %/90 % band, fit line) in a series' colour.
#[derive(Debug, Clone)]
pub(crate) struct Guide {
    /// Legend name of the kind of guide, e.g. "window average".
    pub kind: &'static str,
    pub colour_index: usize,
    pub from: (f64, f64),
    pub to: (f64, f64),
    /// SVG `stroke-dasharray`, or `None` for a solid line.
    pub dash: Option<&'static str>,
}

#[derive(Debug, Clone)]
pub(crate) struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Tick positions and labels on the x axis; also fix the x range.
    pub x_ticks: Vec<(f64, String)>,
    pub log_y: bool,
    pub series: Vec<Series>,
    pub guides: Vec<Guide>,
}

#[derive(Debug, Clone)]
pub(crate) struct BarChart {
    pub title: String,
    pub y_label: String,
    pub categories: Vec<String>,
    /// One entry per series: (name, colour index, value per category).
    pub series: Vec<(String, usize, Vec<Option<f64>>)>,
}

/// Escape text for XML content and attribute values.
pub(crate) fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// Compact tick label: 11726 -> "11.7k", 0.25 -> "0.25".
pub(crate) fn short_number(value: f64) -> String {
    let magnitude = value.abs();
    let (scaled, suffix) = if magnitude >= 1e9 {
        (value / 1e9, "G")
    } else if magnitude >= 1e6 {
        (value / 1e6, "M")
    } else if magnitude >= 1e4 {
        (value / 1e3, "k")
    } else {
        (value, "")
    };
    format!("{}{suffix}", crate::steady::trim_decimal(scaled, 2))
}

/// A y axis: maps values to pixels and lists its ticks.
struct Axis {
    low: f64,
    high: f64,
    log: bool,
    ticks: Vec<f64>,
}

impl Axis {
    fn linear(low: f64, high: f64) -> Axis {
        let (low, high) = if high > low { (low, high) } else { (low - 1.0, high + 1.0) };
        let step = nice_step((high - low) / 5.0);
        let low = (low / step).floor() * step;
        let high = (high / step).ceil() * step;
        let count = ((high - low) / step).round() as usize;
        let ticks = (0..=count).map(|i| low + step * i as f64).collect();
        Axis { low, high, log: false, ticks }
    }

    fn logarithmic(low: f64, high: f64) -> Axis {
        let low_decade = low.log10().floor() as i32;
        let high_decade = (high.log10().ceil() as i32).max(low_decade + 1);
        let ticks = (low_decade..=high_decade).map(|d| 10f64.powi(d)).collect();
        Axis { low: 10f64.powi(low_decade), high: 10f64.powi(high_decade), log: true, ticks }
    }

    fn fraction(&self, value: f64) -> f64 {
        if self.log {
            (value.log10() - self.low.log10()) / (self.high.log10() - self.low.log10())
        } else {
            (value - self.low) / (self.high - self.low)
        }
    }

    fn pixel(&self, value: f64) -> f64 {
        TOP + (1.0 - self.fraction(value)) * (HEIGHT - TOP - BOTTOM)
    }
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
pub(crate) fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let power = 10f64.powf(raw.log10().floor());
    let mantissa = raw / power;
    let nice = if mantissa <= 1.0 {
        1.0
    } else if mantissa <= 2.0 {
        2.0
    } else if mantissa <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * power
}

fn open_svg(out: &mut String, title: &str) {
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" font-family=\"sans-serif\" font-size=\"11\">\
         <title>{t}</title>\
         <text x=\"{x}\" y=\"16\" text-anchor=\"middle\" font-size=\"13\" \
         font-weight=\"bold\">{t}</text>",
        t = xml_escape(title),
        x = WIDTH / 2.0,
    );
}

/// Plot frame, horizontal grid and y tick labels, and the axis titles.
fn draw_frame(out: &mut String, axis: &Axis, x_label: &str, y_label: &str) {
    let (right, bottom) = (WIDTH - RIGHT, HEIGHT - BOTTOM);
    let _ = write!(
        out,
        "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{w}\" height=\"{h}\" fill=\"none\" \
         stroke=\"#333\"/>",
        w = right - LEFT,
        h = bottom - TOP
    );
    for &tick in &axis.ticks {
        let y = axis.pixel(tick);
        let _ = write!(
            out,
            "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{right}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{lx}\" y=\"{ty:.1}\" text-anchor=\"end\">{label}</text>",
            lx = LEFT - 6.0,
            ty = y + 4.0,
            label = xml_escape(&short_number(tick))
        );
    }
    let _ = write!(
        out,
        "<text x=\"{cx}\" y=\"{xy}\" text-anchor=\"middle\">{xl}</text>\
         <text x=\"14\" y=\"{cy}\" text-anchor=\"middle\" \
         transform=\"rotate(-90 14 {cy})\">{yl}</text>",
        cx = (LEFT + right) / 2.0,
        xy = HEIGHT - 8.0,
        xl = xml_escape(x_label),
        cy = (TOP + bottom) / 2.0,
        yl = xml_escape(y_label),
    );
}

/// Legend row under the title: a swatch and name per series, then one entry per guide kind.
fn draw_legend(out: &mut String, series: &[(String, usize)], guide_kinds: &[(&str, Option<&str>)]) {
    let mut x = LEFT;
    let mut y = 34.0;
    // Entries flow left to right and wrap before the right edge.
    let advance = |x: &mut f64, y: &mut f64, width: f64| {
        *x += width;
        if *x > WIDTH - 160.0 {
            *x = LEFT;
            *y += 14.0;
        }
    };
    for (name, colour_index) in series {
        let _ = write!(
            out,
            "<rect x=\"{x}\" y=\"{ry}\" width=\"12\" height=\"8\" fill=\"{c}\"/>\
             <text x=\"{tx}\" y=\"{y}\">{n}</text>",
            ry = y - 8.0,
            c = colour(*colour_index),
            tx = x + 16.0,
            n = xml_escape(name),
        );
        advance(&mut x, &mut y, 28.0 + 6.5 * name.chars().count() as f64);
    }
    for (kind, dash) in guide_kinds {
        let dash_attr = dash.map(|d| format!(" stroke-dasharray=\"{d}\"")).unwrap_or_default();
        let _ = write!(
            out,
            "<line x1=\"{x}\" y1=\"{ly}\" x2=\"{x2}\" y2=\"{ly}\" stroke=\"#555\"{dash_attr}/>\
             <text x=\"{tx}\" y=\"{y}\">{k}</text>",
            ly = y - 4.0,
            x2 = x + 18.0,
            tx = x + 22.0,
            k = xml_escape(kind),
        );
        advance(&mut x, &mut y, 34.0 + 6.5 * kind.chars().count() as f64);
    }
}

fn no_data(out: &mut String) {
    let _ = write!(
        out,
        "<text x=\"{x}\" y=\"{y}\" text-anchor=\"middle\">no data</text></svg>",
        x = WIDTH / 2.0,
        y = HEIGHT / 2.0
    );
}

/// Render a line chart as one `<svg>` element.
pub(crate) fn line_chart_svg(chart: &LineChart) -> String {
    let mut out = String::new();
    open_svg(&mut out, &chart.title);
    let usable = |y: f64| y.is_finite() && (!chart.log_y || y > 0.0);
    let ys: Vec<f64> = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .chain(chart.guides.iter().flat_map(|g| [g.from.1, g.to.1]))
        .filter(|&y| usable(y))
        .collect();
    if ys.is_empty() || chart.x_ticks.is_empty() {
        no_data(&mut out);
        return out;
    }
    let low = ys.iter().copied().fold(f64::INFINITY, f64::min);
    let high = ys.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let axis = if chart.log_y { Axis::logarithmic(low, high) } else { Axis::linear(low, high) };
    draw_frame(&mut out, &axis, &chart.x_label, &chart.y_label);
    let tick_low = chart.x_ticks.iter().map(|t| t.0).fold(f64::INFINITY, f64::min);
    let tick_high = chart.x_ticks.iter().map(|t| t.0).fold(f64::NEG_INFINITY, f64::max);
    // Half a tick step of margin each side (half a round for round-numbered axes).
    let pad = if chart.x_ticks.len() > 1 && tick_high > tick_low {
        0.5 * (tick_high - tick_low) / (chart.x_ticks.len() - 1) as f64
    } else {
        0.5
    };
    let (x_low, x_high) = (tick_low - pad, tick_high + pad);
    let x_pixel = |x: f64| LEFT + (x - x_low) / (x_high - x_low) * (WIDTH - LEFT - RIGHT);
    for (x, label) in &chart.x_ticks {
        let _ = write!(
            out,
            "<text x=\"{px:.1}\" y=\"{y}\" text-anchor=\"middle\">{l}</text>",
            px = x_pixel(*x),
            y = HEIGHT - BOTTOM + 14.0,
            l = xml_escape(label)
        );
    }
    for guide in &chart.guides {
        if !(usable(guide.from.1) && usable(guide.to.1)) {
            continue;
        }
        let dash = guide.dash.map(|d| format!(" stroke-dasharray=\"{d}\"")).unwrap_or_default();
        let _ = write!(
            out,
            "<line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"{}\" \
             stroke-width=\"1.2\" opacity=\"0.8\"{dash}/>",
            x_pixel(guide.from.0),
            axis.pixel(guide.from.1),
            x_pixel(guide.to.0),
            axis.pixel(guide.to.1),
            colour(guide.colour_index),
        );
    }
    for series in &chart.series {
        draw_series(&mut out, series, &|p: (f64, f64)| (x_pixel(p.0), axis.pixel(p.1)), &usable);
    }
    let legend: Vec<(String, usize)> =
        chart.series.iter().map(|s| (s.name.clone(), s.colour_index)).collect();
    let mut kinds: Vec<(&str, Option<&str>)> = Vec::new();
    for guide in &chart.guides {
        if !kinds.iter().any(|k| k.0 == guide.kind) {
            kinds.push((guide.kind, guide.dash));
        }
    }
    draw_legend(&mut out, &legend, &kinds);
    out.push_str("</svg>");
    out
}

fn draw_series(
    out: &mut String,
    series: &Series,
    to_pixel: &dyn Fn((f64, f64)) -> (f64, f64),
    usable: &dyn Fn(f64) -> bool,
) {
    let points: Vec<(f64, f64)> = series
        .points
        .iter()
        .filter(|p| p.0.is_finite() && usable(p.1))
        .map(|&p| to_pixel(p))
        .collect();
    let c = colour(series.colour_index);
    if points.len() > 1 {
        let path: Vec<String> = points.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let _ = write!(
            out,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"2\"/>",
            path.join(" ")
        );
    }
    for (x, y) in points {
        let _ = write!(out, "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"3\" fill=\"{c}\"/>");
    }
}

/// Render a grouped bar chart (categories on x, one bar per series) as one `<svg>` element.
pub(crate) fn bar_chart_svg(chart: &BarChart) -> String {
    let mut out = String::new();
    open_svg(&mut out, &chart.title);
    let high = chart
        .series
        .iter()
        .flat_map(|s| s.2.iter().flatten().copied())
        .filter(|v| v.is_finite())
        .fold(f64::NEG_INFINITY, f64::max);
    if !high.is_finite() || chart.categories.is_empty() {
        no_data(&mut out);
        return out;
    }
    // Bars start at zero so their heights compare honestly.
    let axis = Axis::linear(0.0, high.max(0.0));
    draw_frame(&mut out, &axis, "", &chart.y_label);
    let category_width = (WIDTH - LEFT - RIGHT) / chart.categories.len() as f64;
    let bar_width = category_width * 0.8 / chart.series.len().max(1) as f64;
    for (i, category) in chart.categories.iter().enumerate() {
        let x0 = LEFT + category_width * i as f64;
        let _ = write!(
            out,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            x0 + category_width / 2.0,
            HEIGHT - BOTTOM + 14.0,
            xml_escape(category)
        );
        for (s, (_, colour_index, values)) in chart.series.iter().enumerate() {
            let Some(value) = values.get(i).copied().flatten().filter(|v| v.is_finite()) else {
                continue;
            };
            let top = axis.pixel(value.max(0.0));
            let _ = write!(
                out,
                "<rect x=\"{:.1}\" y=\"{top:.1}\" width=\"{bar_width:.1}\" \
                 height=\"{:.1}\" fill=\"{}\"/>",
                x0 + category_width * 0.1 + bar_width * s as f64,
                axis.pixel(0.0) - top,
                colour(*colour_index)
            );
        }
    }
    let legend: Vec<(String, usize)> = chart.series.iter().map(|s| (s.0.clone(), s.1)).collect();
    draw_legend(&mut out, &legend, &[]);
    out.push_str("</svg>");
    out
}

/// Values per time bin, one line per (name, colour index, bin width in seconds, values): a
/// point at the middle of every bin, the x axis in seconds from the start.
pub fn binned_timeline_chart(
    title: String,
    y_label: &str,
    lines: Vec<(String, usize, f64, &[f64])>,
) -> LineChart {
    let series: Vec<Series> = lines
        .into_iter()
        .map(|(name, colour_index, bin_s, values)| Series {
            name,
            colour_index,
            points: values
                .iter()
                .enumerate()
                .map(|(i, v)| ((i as f64 + 0.5) * bin_s, *v))
                .collect(),
        })
        .collect();
    let end_s =
        series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).fold(0.0f64, f64::max).max(0.1);
    let step = nice_step(end_s / 6.0);
    let x_ticks = (0..=((end_s / step).ceil() as usize))
        .map(|i| (i as f64 * step, short_number(i as f64 * step)))
        .collect();
    LineChart {
        title,
        x_label: "seconds".into(),
        y_label: y_label.into(),
        x_ticks,
        log_y: false,
        series,
        guides: vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_nice() {
        assert_eq!(nice_step(0.0), 1.0);
        assert_eq!(nice_step(230.0), 500.0);
        assert_eq!(nice_step(100.0), 100.0);
        let axis = Axis::linear(11594.0, 11894.0);
        assert_eq!(axis.ticks.first(), Some(&11500.0));
        assert_eq!(axis.ticks.last(), Some(&11900.0));
        let log = Axis::logarithmic(812.0, 76888.0);
        assert_eq!(log.ticks, vec![100.0, 1000.0, 10000.0, 100000.0]);
        assert_eq!(short_number(11726.8), "11.73k");
        assert_eq!(short_number(2500.0), "2500");
    }

    #[test]
    fn charts_escape_text_and_skip_bad_values() {
        let chart = LineChart {
            title: "a <b> & \"c\"".to_string(),
            x_label: "Round".to_string(),
            y_label: "IOPS".to_string(),
            x_ticks: vec![(1.0, "1".to_string()), (2.0, "2".to_string())],
            log_y: true,
            series: vec![Series {
                name: "t<1>".to_string(),
                colour_index: 0,
                points: vec![(1.0, 10.0), (2.0, f64::NAN), (2.0, -1.0), (2.0, 100.0)],
            }],
            guides: Vec::new(),
        };
        let svg = line_chart_svg(&chart);
        assert!(svg.contains("a &lt;b&gt; &amp; &quot;c&quot;") && svg.contains("t&lt;1&gt;"));
        assert_eq!(svg.matches("<circle").count(), 2);
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
        let empty =
            BarChart { title: "x".into(), y_label: "y".into(), categories: vec![], series: vec![] };
        assert!(bar_chart_svg(&empty).contains("no data"));
    }
}
