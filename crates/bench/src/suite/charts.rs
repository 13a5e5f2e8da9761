//! SVG charts of a report (plotters' SVG backend: text is written as SVG
//! `<text>`, so no font files are needed on the machine):
//!
//! - `create.svg`: creates/s against directory size per peer (flat with
//!   htree inserts);
//! - `fsync.svg`: write+fsync (solid) and +fdatasync (dashed)
//!   time against file size per peer;
//! - `scaling.svg`: throughput against threads, one panel per thread-curve
//!   workload (lseek and the open/read/close storm first);
//! - `mount.svg`: every single-figure workload as bars of the speed ratio
//!   to the kernel's ext4 (the line at 1×), one bar per peer.
//!
//! Axes with values that span orders of magnitude (the library against a
//! FUSE server) are logarithmic.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;

use super::report::{Report, Row};

fn color(peer: &str) -> RGBColor {
    match peer {
        "lib" => RGBColor(31, 119, 180),
        "lib:i_mutex" => RGBColor(140, 190, 230),
        "lib:shared-fd-table" => RGBColor(148, 103, 189),
        "ext4kit-mount" => RGBColor(214, 39, 40),
        "fuse2fs" => RGBColor(44, 160, 44),
        "kernel-ext4" => RGBColor(30, 30, 30),
        "kernel-ext2" => RGBColor(255, 127, 14),
        _ => RGBColor(127, 127, 127),
    }
}

fn e<T: std::fmt::Display>(what: &str) -> impl Fn(T) -> String + '_ {
    move |err| format!("chart {what}: {err}")
}

/// Peers of `rows`, in first-seen order.
fn peers(rows: &[&Row]) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for r in rows {
        if !v.contains(&r.peer) {
            v.push(r.peer.clone());
        }
    }
    v
}

/// Positive range with a margin, for a log axis.
fn log_range(vals: impl Iterator<Item = f64>) -> Option<std::ops::Range<f64>> {
    let (lo, hi) = vals
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::INFINITY, 0f64), |(a, b), v| (a.min(v), b.max(v)));
    (lo.is_finite() && hi > 0.0).then(|| lo / 1.5..hi * 1.5)
}

/// Curves of `metric` rows (x, median) per peer, on `area`.
fn curves(
    area: &DrawingArea<SVGBackend, Shift>,
    title: &str,
    series: &[(&str, Vec<&Row>, bool)],
    x_desc: &str,
    y_desc: &str,
    int_x: bool,
) -> Result<(), String> {
    let all: Vec<&Row> = series.iter().flat_map(|s| s.1.iter().copied()).collect();
    let xs = || all.iter().filter_map(|r| r.x);
    let (Some(yr), Some(xr)) = (log_range(all.iter().map(|r| r.median())), log_range(xs())) else {
        return Ok(());
    };
    let mut b = ChartBuilder::on(area);
    b.caption(title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64);
    let mut c = b
        .build_cartesian_2d(xr.log_scale(), yr.log_scale())
        .map_err(e("axes"))?;
    // Thread counts are integers: label only the ticks that are.
    let fmt_x = |x: &f64| {
        if !int_x {
            crate::suite::report::fmt_val(*x)
        } else if (x - x.round()).abs() < 1e-6 {
            format!("{x:.0}")
        } else {
            String::new()
        }
    };
    c.configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&fmt_x)
        .y_label_formatter(&|y| crate::suite::report::fmt_val(*y))
        .draw()
        .map_err(e("mesh"))?;
    series_into(&mut c, series)?;
    legend(&mut c)
}

fn series_into<'a, 'b: 'a, X, Y>(
    c: &mut ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, Y>>,
    series: &[(&str, Vec<&Row>, bool)],
) -> Result<(), String>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    for (label, rows, dashed) in series {
        for p in peers(rows) {
            let mut pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.peer == p)
                .filter_map(|r| Some((r.x?, r.median())))
                .filter(|(_, y)| y.is_finite() && *y > 0.0)
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let col = color(&p);
            let style = ShapeStyle::from(&col).stroke_width(2);
            let name = if label.is_empty() {
                p.clone()
            } else {
                format!("{p} {label}")
            };
            if *dashed {
                c.draw_series(DashedLineSeries::new(pts.clone(), 6, 4, style))
                    .map_err(e("series"))?
                    .label(name)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], col.stroke_width(1)));
            } else {
                c.draw_series(LineSeries::new(pts.clone(), style))
                    .map_err(e("series"))?
                    .label(name)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], col.stroke_width(2)));
            }
            c.draw_series(pts.iter().map(|&(x, y)| Circle::new((x, y), 3, col.filled())))
                .map_err(e("points"))?;
        }
    }
    Ok(())
}

fn legend<'a, 'b: 'a, X, Y>(c: &mut ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, Y>>) -> Result<(), String>
where
    X: Ranged,
    Y: Ranged,
{
    c.configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font(("sans-serif", 11))
        .draw()
        .map_err(e("legend"))
}

fn rows_of<'a>(r: &'a Report, workload: &str, metric_starts: &str) -> Vec<&'a Row> {
    r.rows
        .iter()
        .filter(|x| x.workload == workload && x.metric.starts_with(metric_starts) && x.x.is_some())
        .collect()
}

/// Draw every chart the report has data for into `out`; the files written.
pub fn draw(r: &Report, out: &Path) -> Result<Vec<PathBuf>, String> {
    let mut written = Vec::new();

    let create = rows_of(r, "create", super::work::CREATE_METRIC);
    if !create.is_empty() {
        let p = out.join("create.svg");
        let root = SVGBackend::new(&p, (900, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(e("fill"))?;
        curves(
            &root,
            "htree inserts: creates in one directory",
            &[("", create, false)],
            "files in the directory",
            "files/s (log)",
            false,
        )?;
        root.present().map_err(e("write"))?;
        written.push(p.clone());
    }

    let fsync = rows_of(r, "fsync", "2 KiB write + fsync");
    let fdsync = rows_of(r, "fsync", "2 KiB write + fdatasync");
    if !fsync.is_empty() {
        let p = out.join("fsync.svg");
        let root = SVGBackend::new(&p, (900, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(e("fill"))?;
        curves(
            &root,
            "O(dirty) fsync: 2 KiB write + fsync (solid) / fdatasync (dashed) against file size",
            &[("fsync", fsync, false), ("fdatasync", fdsync, true)],
            "file size, cached 2 KiB blocks",
            "µs per write + sync (log)",
            false,
        )?;
        root.present().map_err(e("write"))?;
        written.push(p.clone());
    }

    let panels: Vec<(&str, &str, Vec<&Row>)> = [
        ("lseek", "lock-free lseek: seeks/s (M)", "seeks/s"),
        ("storm", "open/read/close storm (k ops/s)", "open/read/close"),
        ("dpath", "d_path under renames (k calls/s)", "d_path"),
        ("pcreate", "parallel creates, own directories (files/s)", "creates/s"),
        ("fsmall", "fsync-heavy small files (files/s)", "files/s"),
    ]
    .into_iter()
    .map(|(w, t, m)| (w, t, rows_of(r, w, m)))
    .filter(|p| !p.2.is_empty())
    .collect();
    if !panels.is_empty() {
        let p = out.join("scaling.svg");
        let rows_n = panels.len().div_ceil(2);
        let root = SVGBackend::new(&p, (1200, 420 * rows_n as u32)).into_drawing_area();
        root.fill(&WHITE).map_err(e("fill"))?;
        let areas = root.split_evenly((rows_n, 2));
        for ((_, title, rows), area) in panels.into_iter().zip(areas.iter()) {
            curves(
                area,
                title,
                &[("", rows, false)],
                "threads (log)",
                "total throughput (log)",
                true,
            )?;
        }
        root.present().map_err(e("write"))?;
        written.push(p.clone());
    }

    // Bars: every single figure (no x) with a ratio to the kernel.
    let bars: Vec<(&Row, f64)> = r
        .rows
        .iter()
        .filter(|x| x.x.is_none() || (x.workload == "create" && !x.metric.starts_with("creates/s")))
        .filter(|x| x.peer != super::PeerId::Kernel.name())
        .filter_map(|x| Some((x, r.ratio_to_kernel(x)?)))
        .filter(|(_, v)| *v > 0.0)
        .collect();
    if !bars.is_empty() {
        let p = out.join("mount.svg");
        draw_bars(r, &bars, &p)?;
        written.push(p.clone());
    }
    Ok(written)
}

fn draw_bars(_r: &Report, bars: &[(&Row, f64)], p: &Path) -> Result<(), String> {
    // Categories: (workload, metric) in first-seen order.
    let mut cats: Vec<(String, String)> = Vec::new();
    for (row, _) in bars {
        let k = (row.workload.to_string(), row.metric.clone());
        if !cats.contains(&k) {
            cats.push(k);
        }
    }
    let rows: Vec<&Row> = bars.iter().map(|b| b.0).collect();
    let ps = peers(&rows);
    let np = ps.len().max(1) as f64;
    let h = 120 + 26 * cats.len() as u32 * ps.len().max(1) as u32 / 2 + 20 * cats.len() as u32;
    let root = SVGBackend::new(p, (1000, h.max(300))).into_drawing_area();
    root.fill(&WHITE).map_err(e("fill"))?;
    let Some(xr) = log_range(bars.iter().map(|b| b.1).chain([1.0])) else {
        return Ok(());
    };
    let n = cats.len() as f64;
    let labels: Vec<String> = cats.iter().map(|(w, m)| format!("{w}: {m}")).collect();
    let mut c = ChartBuilder::on(&root)
        .caption(
            "speed relative to the kernel's ext4 (1× = the kernel; log scale)",
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(300)
        .build_cartesian_2d(xr.log_scale(), 0f64..n)
        .map_err(e("axes"))?;
    c.configure_mesh()
        .disable_y_mesh()
        .y_labels(cats.len() * 2 + 1)
        .y_label_formatter(&|y| {
            let i = y.floor() as usize;
            if (y - y.floor() - 0.5).abs() < 0.01 && i < labels.len() {
                labels[labels.len() - 1 - i].clone()
            } else {
                String::new()
            }
        })
        .x_label_formatter(&|x| format!("{}×", crate::suite::report::fmt_val(*x)))
        .x_desc("speed ratio (above 1: faster than the kernel)")
        .draw()
        .map_err(e("mesh"))?;
    let x0 = xr_start(&bars.iter().map(|b| b.1).collect::<Vec<_>>());
    for (pi, peer) in ps.iter().enumerate() {
        let col = color(peer);
        let rects: Vec<Rectangle<(f64, f64)>> = bars
            .iter()
            .filter(|(row, _)| &row.peer == peer)
            .filter_map(|(row, v)| {
                let ci = cats.iter().position(|(w, m)| w == row.workload && *m == row.metric)?;
                let base = (cats.len() - 1 - ci) as f64 + 0.1;
                // The first peer (the library) on top of its group.
                let slot = np - 1.0 - pi as f64;
                let y0 = base + 0.8 * slot / np;
                let y1 = base + 0.8 * (slot + 1.0) / np;
                Some(Rectangle::new([(x0, y0), (*v, y1)], col.filled()))
            })
            .collect();
        c.draw_series(rects)
            .map_err(e("bars"))?
            .label(peer.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], col.filled()));
    }
    c.draw_series(std::iter::once(PathElement::new(
        vec![(1.0, 0.0), (1.0, n)],
        BLACK.stroke_width(2),
    )))
    .map_err(e("kernel line"))?;
    legend(&mut c)?;
    root.present().map_err(e("write"))?;
    Ok(())
}

/// Where bars start on the log axis: just inside its left edge.
fn xr_start(vals: &[f64]) -> f64 {
    let lo = vals.iter().copied().filter(|v| *v > 0.0).fold(1.0f64, f64::min);
    lo / 1.5 * 1.01
}
