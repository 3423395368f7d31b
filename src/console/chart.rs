//! Charts drawn as SVG on the server: numbers in, markup out (every label escaped).

use std::fmt::Write as _;

/// One stacked series of a bar chart.
pub struct Series {
    pub name: &'static str,
    /// A CSS class giving its colour.
    pub class: &'static str,
    /// One value per day (positive).
    pub values: Vec<i64>,
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 220.0;
const LEFT: f64 = 64.0;
const BOTTOM: f64 = 28.0;
const TOP: f64 = 16.0;

/// The step of an axis of `ticks` steps that reaches `max`: the smallest of 1, 2 and 5 times a
/// power of ten that does (1 for nothing to show).
pub fn axis_step(max: i64, ticks: i64) -> i64 {
    let needed = (max.max(1) + ticks - 1) / ticks;
    let mut magnitude: i64 = 1;
    while magnitude.saturating_mul(10) <= needed {
        magnitude *= 10;
    }
    [1, 2, 5, 10]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|step| *step >= needed)
        .unwrap_or(needed)
}

/// Stacked bars (`series`), one column per entry of `columns` (named so in tooltips, with
/// `axis[i]` under it when not empty), and a marker on each column that has `credits`.
/// `label` writes an amount for the axis and the tooltips.
pub fn stacked_bars(
    title: &str,
    columns: &[String],
    axis: &[String],
    series: &[Series],
    credits: &[i64],
    label: impl Fn(i64) -> String,
) -> String {
    let days = columns;
    let totals: Vec<i64> = (0..days.len())
        .map(|d| series.iter().map(|s| s.values.get(d).copied().unwrap_or(0)).sum())
        .collect();
    // The axis runs to four even steps of a round size, so each gridline's label is its value.
    let step = axis_step(totals.iter().copied().max().unwrap_or(0), 4);
    let max = step * 4;
    let plot_h = HEIGHT - BOTTOM - TOP;
    let slot = (WIDTH - LEFT) / days.len().max(1) as f64;
    let bar = (slot * 0.7).max(1.0);
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" preserveAspectRatio="xMidYMid meet"><title>{}</title>"#,
        escape(title)
    );
    for i in 0..=4 {
        let value = step * i;
        let y = TOP + plot_h - plot_h * i as f64 / 4.0;
        let _ = write!(
            svg,
            r#"<line class="grid" x1="{LEFT}" x2="{WIDTH}" y1="{y:.1}" y2="{y:.1}"/><text class="axis" x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 6.0,
            y + 4.0,
            escape(&label(value))
        );
    }
    for (d, day) in days.iter().enumerate() {
        let x = LEFT + slot * d as f64 + (slot - bar) / 2.0;
        let mut base = TOP + plot_h;
        for s in series {
            let value = s.values.get(d).copied().unwrap_or(0);
            if value <= 0 {
                continue;
            }
            let h = plot_h * value as f64 / max as f64;
            base -= h;
            let _ = write!(
                svg,
                r#"<rect class="{}" x="{x:.1}" y="{base:.1}" width="{bar:.1}" height="{h:.1}"><title>{} {}: {}</title></rect>"#,
                s.class,
                escape(day),
                escape(s.name),
                escape(&label(value))
            );
        }
        if let Some(&credit) = credits.get(d).filter(|c| **c > 0) {
            let cx = x + bar / 2.0;
            let _ = write!(
                svg,
                r#"<circle class="credit" cx="{cx:.1}" cy="{:.1}" r="4"><title>{} credits: {}</title></circle>"#,
                TOP + plot_h - 6.0,
                escape(day),
                escape(&label(credit))
            );
        }
        if let Some(text) = axis.get(d).filter(|t| !t.is_empty()) {
            let _ = write!(
                svg,
                r#"<text class="axis" x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                x + bar / 2.0,
                HEIGHT - 8.0,
                escape(text)
            );
        }
    }
    svg.push_str("</svg>");
    svg
}

/// One run of a rate chart: its label, pass rate and mean score (both 0..1).
pub type RatePoint = (String, f64, Option<f64>);

/// Two lines on a 0..1 scale over the same points (pass rate and mean score), one point per run.
pub fn rate_lines(points: &[RatePoint], title: &str) -> String {
    let plot_h = HEIGHT - BOTTOM - TOP;
    let n = points.len().max(2) - 1;
    let step = (WIDTH - LEFT - 12.0) / n as f64;
    let at = |i: usize, v: f64| (LEFT + step * i as f64, TOP + plot_h - plot_h * v.clamp(0.0, 1.0));
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" preserveAspectRatio="xMidYMid meet"><title>{}</title>"#,
        escape(title)
    );
    for i in 0..=4 {
        let y = TOP + plot_h - plot_h * i as f64 / 4.0;
        let _ = write!(
            svg,
            r#"<line class="grid" x1="{LEFT}" x2="{WIDTH}" y1="{y:.1}" y2="{y:.1}"/><text class="axis" x="{:.1}" y="{:.1}" text-anchor="end">{}%</text>"#,
            LEFT - 6.0,
            y + 4.0,
            i * 25
        );
    }
    let line = |values: Vec<(usize, f64)>, class: &str, name: &str, svg: &mut String| {
        if values.is_empty() {
            return;
        }
        let path: Vec<String> = values
            .iter()
            .map(|(i, v)| {
                let (x, y) = at(*i, *v);
                format!("{x:.1},{y:.1}")
            })
            .collect();
        let _ = write!(svg, r#"<polyline class="{class}" points="{}"/>"#, path.join(" "));
        for (i, v) in values {
            let (x, y) = at(i, v);
            let _ = write!(
                svg,
                r#"<circle class="{class}" cx="{x:.1}" cy="{y:.1}" r="3.5"><title>{} {}: {:.1}%</title></circle>"#,
                escape(&points[i].0),
                name,
                v * 100.0
            );
        }
    };
    line(
        points.iter().enumerate().map(|(i, p)| (i, p.1)).collect(),
        "pass",
        "pass rate",
        &mut svg,
    );
    line(
        points
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.2.map(|m| (i, m)))
            .collect(),
        "score",
        "mean score",
        &mut svg,
    );
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_labels_are_the_values_of_their_gridlines() {
        assert_eq!(axis_step(7, 4), 2);
        assert_eq!(axis_step(0, 4), 1);
        assert_eq!(axis_step(4, 4), 1);
        assert_eq!(axis_step(41, 4), 20);
        assert_eq!(axis_step(1_750_000, 4), 500_000);
        let series = [Series {
            name: "jobs",
            class: "a",
            values: vec![7],
        }];
        let svg = stacked_bars("t", &["d".into()], &[], &series, &[], |v| v.to_string());
        let labels: Vec<&str> = svg
            .split("text-anchor=\"end\">")
            .skip(1)
            .map(|rest| rest.split('<').next().unwrap())
            .collect();
        assert_eq!(labels, ["0", "2", "4", "6", "8"], "{svg}");
        // The bar of 7 stands at 7/8 of the plot, where the labels say 7 is.
        let plot = HEIGHT - BOTTOM - TOP;
        assert!(
            svg.contains(&format!("height=\"{:.1}\"", plot * 7.0 / 8.0)),
            "{svg}"
        );
    }

    #[test]
    fn labels_are_escaped_and_bars_stack() {
        let days = vec!["2026-11-01".to_owned(), "<script>".to_owned()];
        let series = [
            Series {
                name: "a",
                class: "a",
                values: vec![1, 2],
            },
            Series {
                name: "b",
                class: "b",
                values: vec![3, 0],
            },
        ];
        let svg = stacked_bars("t<", &days, &days, &series, &[0, 5], |v| format!("{v}<"));
        assert!(svg.contains("<title>t&lt;</title>"));
        assert!(!svg.contains("<script>"));
        assert!(svg.contains("&lt;script&gt;"));
        assert_eq!(svg.matches("<rect").count(), 3);
        assert_eq!(svg.matches("<circle").count(), 1);
        let lines = rate_lines(&[("<b>".into(), 0.5, Some(0.9)), ("x".into(), 1.0, None)], "t&");
        assert!(lines.contains("&lt;b&gt;") && lines.contains("t&amp;"));
        assert_eq!(lines.matches("<polyline").count(), 2);
    }
}
