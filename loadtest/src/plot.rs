//! SVG plots (plotters, SVG backend only: no system fonts needed).

use std::path::Path;

use anyhow::anyhow;
use plotters::prelude::*;

use crate::stats::Event;

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("plot: {e}")
}

/// Quantile -> x position: the "nines" scale of HDR latency plots (50% = 0.3, 99% = 2, ...).
fn nines(q: f64) -> f64 {
    -(1.0 - q.min(0.999_99)).log10() + if q >= 1.0 { 0.3 } else { 0.0 }
}

/// Latency by percentile, one line per series (points are (quantile, ms)).
pub fn latency_cdf(path: &Path, title: &str, series: &[Series]) -> anyhow::Result<()> {
    let max_y = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(1.0f64, f64::max)
        * 1.5;
    let min_y = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .filter(|v| *v > 0.0)
        .fold(f64::INFINITY, f64::min)
        .min(max_y / 10.0)
        .max(0.01)
        / 1.5;
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0f64..5.4, (min_y..max_y).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency (ms, log)")
        .x_labels(7)
        .x_label_formatter(&|x| {
            let p = 100.0 * (1.0 - 10f64.powf(-x));
            if *x > 5.05 {
                "max".into()
            } else {
                let decimals = (x.round() as usize).saturating_sub(2);
                format!("{p:.decimals$}%")
            }
        })
        .y_label_formatter(&|y| {
            format!("{y:.3}")
                .trim_end_matches('0')
                .trim_end_matches('.')
                .to_string()
        })
        .draw()
        .map_err(err)?;
    for (i, s) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .map(|(q, v)| (nines(*q), v.max(min_y)))
            .collect();
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)))
            .map_err(err)?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Lines over time (x in seconds) with fault events drawn as vertical lines.
pub fn timeline(
    path: &Path,
    title: &str,
    y_desc: &str,
    series: &[Series],
    events: &[Event],
    log_y: bool,
) -> anyhow::Result<()> {
    let max_x = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(1.0f64, f64::max);
    let max_y = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(1.0f64, f64::max)
        * 1.15;
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70);
    // Fault events, drawn first so the data lines sit on top.
    let interesting: Vec<&Event> = events
        .iter()
        .filter(|e| !e.what.starts_with("snapshot") || events.len() < 40)
        .collect();
    macro_rules! draw_body {
        ($chart:expr, $lo:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc("time (s)")
                .y_desc(y_desc)
                .draw()
                .map_err(err)?;
            let mut labelled = 0usize;
            for e in &interesting {
                let color = if e.what.starts_with("snapshot") {
                    RGBColor(180, 180, 180)
                } else {
                    RGBColor(200, 0, 0)
                };
                chart
                    .draw_series(std::iter::once(PathElement::new(
                        vec![(e.t_s, $lo), (e.t_s, max_y)],
                        color.stroke_width(1),
                    )))
                    .map_err(err)?;
                if !e.what.starts_with("snapshot") {
                    // Stagger the labels so events close in time stay readable.
                    let k = (labelled % 6) as f64;
                    labelled += 1;
                    let y = if $lo > 0.0 {
                        max_y / 1.15 / 1.6f64.powf(k)
                    } else {
                        max_y * (0.96 - 0.06 * k)
                    };
                    chart
                        .draw_series(std::iter::once(Text::new(
                            format!(" {}", e.what),
                            (e.t_s, y),
                            ("sans-serif", 11).into_font().color(&color),
                        )))
                        .map_err(err)?;
                }
            }
            for (i, s) in series.iter().enumerate() {
                let c = COLORS[i % COLORS.len()];
                let pts: Vec<(f64, f64)> = s.points.iter().map(|(x, y)| (*x, y.max($lo))).collect();
                chart
                    .draw_series(LineSeries::new(pts, c.stroke_width(2)))
                    .map_err(err)?
                    .label(s.label.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                    });
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(err)?;
        }};
    }
    if log_y {
        let lo = 0.1;
        let chart = builder
            .build_cartesian_2d(0.0f64..max_x, (lo..max_y.max(1.0)).log_scale())
            .map_err(err)?;
        draw_body!(chart, lo);
    } else {
        let chart = builder
            .build_cartesian_2d(0.0f64..max_x, 0.0f64..max_y)
            .map_err(err)?;
        draw_body!(chart, 0.0);
    }
    root.present().map_err(err)?;
    Ok(())
}

/// p99 against offered rate for ramps, with horizontal bound lines.
pub fn ramp(path: &Path, title: &str, series: &[Series], bounds: &[f64]) -> anyhow::Result<()> {
    let max_x = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(1.0f64, f64::max)
        * 1.1;
    let max_y = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .chain(bounds.iter().cloned())
        .fold(1.0f64, f64::max)
        * 1.5;
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0f64..max_x, (0.1f64..max_y).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("offered acquisitions/s")
        .y_desc("p99 of lock ops (ms, log)")
        .draw()
        .map_err(err)?;
    for b in bounds {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(0.0, *b), (max_x, *b)],
                RGBColor(200, 0, 0).stroke_width(1),
            )))
            .map_err(err)?;
    }
    for (i, s) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> = s.points.iter().map(|(x, y)| (*x, y.max(0.1))).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
            .map_err(err)?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, c.filled())))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}
