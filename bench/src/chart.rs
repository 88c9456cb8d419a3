//! The PNG chart: for each workload with a limit, one bar per client showing its figure as a fraction of
//! the raw-SDK limit, with the limit drawn as a line at 1.0.
//!
//! plotters is built with `ab_glyph`, which renders text from a font we hand it and never looks for
//! system fonts (so the build needs no fontconfig/freetype). The font file is found at run time; without
//! one the chart is still drawn, only without any text, and a warning says so.

use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow, ensure};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::report::{Report, Row};

const SIZE: (u32, u32) = (1200, 640);
/// Highest ratio drawn to scale.
const CAP: f64 = 2.0;
/// One colour per client: expressfs first.
const COLORS: [RGBColor; 4] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
];
/// Where common distributions keep a sans-serif TrueType font.
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
    "/Library/Fonts/Arial.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

/// Candidate font files, best first: `--chart-font`, $EXPRESSFS_BENCH_FONT, the usual paths, fc-match.
fn font_candidates(explicit: Option<&Path>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = explicit.into_iter().map(Path::to_path_buf).collect();
    out.extend(std::env::var_os("EXPRESSFS_BENCH_FONT").map(PathBuf::from));
    out.extend(FONT_PATHS.iter().map(PathBuf::from));
    let matched = std::process::Command::new("fc-match")
        .args(["-f", "%{file}", "sans-serif"])
        .output();
    if let Ok(o) = matched {
        let file = String::from_utf8_lossy(&o.stdout).trim().to_string();
        if o.status.success() && !file.is_empty() {
            out.push(file.into());
        }
    }
    out
}

/// Registers the first usable font as plotters' "sans-serif". Returns the file used.
fn register_font(explicit: Option<&Path>) -> Option<PathBuf> {
    for path in font_candidates(explicit) {
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        // plotters keeps a &'static reference; one font for the life of the process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
            return Some(path);
        }
    }
    None
}

/// The workload label under group `x` (the mesh asks for labels at the integers).
fn label_at(rows: &[&Row], x: f64) -> String {
    let i = x.round();
    if (x - i).abs() > 0.01 || i < 0.0 {
        return String::new();
    }
    rows.get(i as usize)
        .map_or(String::new(), |r| r.short.to_string())
}

/// Writes the chart to `path`, with text if a font can be found (see `font_candidates`).
pub fn write_png(path: &Path, report: &Report, title: &str, font: Option<&Path>) -> Result<()> {
    let text = register_font(font).is_some();
    if !text {
        eprintln!(
            "warning: no TrueType font found (try --chart-font or EXPRESSFS_BENCH_FONT); \
             the chart has no text"
        );
    }
    draw(path, report, title, text)
}

/// Draws the chart; without `text`, only bars and the limit line (plotters would fail on any text
/// without a registered font).
fn draw(path: &Path, report: &Report, title: &str, text: bool) -> Result<()> {
    let rows: Vec<&Row> = report.rows.iter().filter(|r| r.limit.is_some()).collect();
    // Only clients that produced at least one figure get a bar series.
    let series: Vec<usize> = (0..report.clients.len())
        .filter(|&c| rows.iter().any(|r| r.ratio(c).is_some()))
        .collect();
    ensure!(!rows.is_empty() && !series.is_empty(), "no ratios to chart");
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    // Bars above CAP are cut at the top edge (their label keeps the real value), so that one client
    // serving from a local cache does not flatten every other bar.
    let top = rows
        .iter()
        .flat_map(|r| series.iter().filter_map(|&c| r.ratio(c)))
        .fold(1.2f64, |m, r| m.max(r.min(CAP) * 1.15));
    let shown = |r: f64| r.min(top * 0.94);
    let n = rows.len();

    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(20);
    if text {
        builder
            .caption(title, ("sans-serif", 24))
            .x_label_area_size(45)
            .y_label_area_size(60);
    }
    let mut chart = builder
        .build_cartesian_2d(-0.5f64..n as f64 - 0.5, 0f64..top)
        .map_err(|e| anyhow!("{e}"))?;
    if text {
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n)
            .x_label_formatter(&|x| label_at(&rows, *x))
            .y_desc("fraction of the raw-SDK limit (higher is better)")
            .label_style(("sans-serif", 16))
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
    }
    // Each group is 0.8 wide, split between the series.
    let width = 0.8 / series.len() as f64;
    for (k, &client) in series.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let left = move |i: usize| i as f64 - 0.4 + k as f64 * width;
        let bars: Vec<(usize, f64)> = rows
            .iter()
            .enumerate()
            .filter_map(|(i, r)| Some((i, r.ratio(client)?)))
            .collect();
        let drawn = chart
            .draw_series(bars.iter().map(|&(i, r)| {
                Rectangle::new(
                    [(left(i), 0.0), (left(i) + width * 0.9, shown(r))],
                    color.filled(),
                )
            }))
            .map_err(|e| anyhow!("{e}"))?;
        if !text {
            continue;
        }
        drawn
            .label(report.clients[client])
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
        let style = TextStyle::from(("sans-serif", 13).into_font())
            .pos(Pos::new(HPos::Center, VPos::Bottom));
        chart
            .draw_series(bars.iter().map(|&(i, r)| {
                Text::new(
                    format!("{r:.2}"),
                    (left(i) + width * 0.45, shown(r) + top * 0.005),
                    style.clone(),
                )
            }))
            .map_err(|e| anyhow!("{e}"))?;
    }
    // The limit itself, over the bars.
    let limit = chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(-0.5, 1.0), (n as f64 - 0.5, 1.0)],
            BLACK.stroke_width(2),
        )))
        .map_err(|e| anyhow!("{e}"))?;
    if text {
        limit
            .label("raw-SDK limit")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], BLACK.stroke_width(2)));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .label_font(("sans-serif", 16))
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
    }
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Spec;
    use crate::workloads::{Cell, Results};

    fn report() -> Report {
        let spec = |id, limit| Spec {
            id,
            title: format!("{id}. workload"),
            short: "w",
            unit: "MB/s",
            limit,
        };
        let ours: Results = [(1, Cell::value(50.0, None)), (2, Cell::value(900.0, None))].into();
        let peer: Results = [(1, Cell::missing("timeout")), (2, Cell::value(10.0, None))].into();
        Report::new(
            vec![spec(1, Some(100.0)), spec(2, Some(300.0)), spec(8, None)],
            vec![("expressfs", ours), ("peer", peer)],
            Vec::new(),
        )
    }

    /// What CI gets when no font is installed: a chart all the same, PNG, of the requested size.
    #[test]
    fn draws_without_a_font() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/chart.png");
        draw(&path, &report(), "title", false).unwrap();
        let png = std::fs::read(&path).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        // IHDR: width and height, big-endian, at bytes 16..24.
        assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), SIZE.0);
        assert_eq!(u32::from_be_bytes(png[20..24].try_into().unwrap()), SIZE.1);
    }

    #[test]
    fn labels_only_at_whole_positions() {
        let r = report();
        let rows: Vec<&Row> = r.rows.iter().collect();
        assert_eq!(label_at(&rows, 1.0), "w");
        assert_eq!(label_at(&rows, 0.5), "");
        assert_eq!(label_at(&rows, 7.0), "");
    }
}
