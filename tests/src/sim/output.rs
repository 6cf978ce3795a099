//! Sweeps: one parameter over a list of values, the four set-ups at each, written as a
//! CSV and an SVG chart of origin peak over baseline (drawn by hand: one polyline per
//! set-up, each point a `<circle>` carrying its value in `data-x` and `data-y`).

use std::fmt::Write as _;
use std::path::Path;

use super::config::SimConfig;
use super::report::SimReport;
use crate::scenario::Setup;

/// A parameter a sweep varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepParam {
    /// PoPs in the fleet (spread over the regions).
    Pops,
    /// Viral requests per second per region.
    ViralRps,
    /// Concurrent fills the origin serves at base latency.
    OriginCapacity,
}

impl SweepParam {
    /// Parses `pops`, `viral-rps` or `origin-capacity`.
    pub fn parse(name: &str) -> Result<SweepParam, String> {
        match name {
            "pops" => Ok(SweepParam::Pops),
            "viral-rps" => Ok(SweepParam::ViralRps),
            "origin-capacity" => Ok(SweepParam::OriginCapacity),
            other => Err(format!(
                "{other}: expected pops, viral-rps or origin-capacity"
            )),
        }
    }

    /// The name in files and charts.
    pub fn as_str(self) -> &'static str {
        match self {
            SweepParam::Pops => "pops",
            SweepParam::ViralRps => "viral-rps",
            SweepParam::OriginCapacity => "origin-capacity",
        }
    }

    /// `base` with the parameter set to `value`.
    pub fn apply(self, base: &SimConfig, value: f64) -> SimConfig {
        let mut cfg = base.clone();
        match self {
            SweepParam::Pops => {
                cfg.pops_per_region = ((value / cfg.regions as f64).round() as usize).max(1)
            }
            SweepParam::ViralRps => cfg.viral_rps = value,
            SweepParam::OriginCapacity => cfg.origin.capacity = value,
        }
        cfg
    }
}

/// The rows of a sweep as CSV: one line per value and set-up.
pub fn sweep_csv(param: SweepParam, rows: &[(f64, SimReport)]) -> String {
    let mut out = format!(
        "{},setup,origin_baseline_rps,origin_peak_rps,peak_over_baseline,hot_hit_ratio,p50_ms,p99_ms,prewarm_useful,prewarm_wasted,prewarm_origin_bytes\n",
        param.as_str()
    );
    for (value, r) in rows {
        let _ = writeln!(
            out,
            "{value},{:?},{:.1},{:.1},{:.3},{:.5},{:.1},{:.1},{},{},{:.0}",
            r.setup,
            r.origin_baseline_rps,
            r.origin_peak_rps,
            r.peak_over_baseline,
            r.hot_hit_ratio,
            r.p50_ms,
            r.p99_ms,
            r.prewarm_useful,
            r.prewarm_wasted,
            r.prewarm_origin_bytes
        );
    }
    out
}

const W: f64 = 640.0;
const H: f64 = 400.0;
const PAD: f64 = 60.0;
const COLOURS: [&str; 4] = ["#d62728", "#ff7f0e", "#1f77b4", "#2ca02c"];

/// An SVG chart of peak over baseline (log scale) against the parameter.
pub fn sweep_svg(param: SweepParam, rows: &[(f64, SimReport)]) -> String {
    let xs: Vec<f64> = rows.iter().map(|(x, _)| *x).collect();
    let (x0, x1) = (
        xs.iter().copied().fold(f64::MAX, f64::min),
        xs.iter().copied().fold(f64::MIN, f64::max),
    );
    let ys: Vec<f64> = rows
        .iter()
        .map(|(_, r)| r.peak_over_baseline.max(0.1).log10())
        .collect();
    let (y0, y1) = (
        ys.iter().copied().fold(0.0, f64::min),
        ys.iter().copied().fold(1.0, f64::max),
    );
    let px = |x: f64| PAD + (x - x0) / (x1 - x0).max(1e-9) * (W - 2.0 * PAD);
    let py = |y: f64| H - PAD - (y - y0) / (y1 - y0).max(1e-9) * (H - 2.0 * PAD);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <text x=\"{}\" y=\"20\" text-anchor=\"middle\">origin peak over baseline (log) by {}</text>\n\
         <line x1=\"{PAD}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n\
         <line x1=\"{PAD}\" y1=\"{PAD}\" x2=\"{PAD}\" y2=\"{}\" stroke=\"black\"/>\n",
        W / 2.0,
        param.as_str(),
        H - PAD,
        W - PAD,
        H - PAD,
        H - PAD
    );
    for x in &xs {
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{x}</text>",
            px(*x),
            H - PAD + 16.0
        );
    }
    let mut decade = y0.floor();
    while decade <= y1 {
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}x</text>",
            PAD - 6.0,
            py(decade),
            10f64.powf(decade)
        );
        decade += 1.0;
    }
    for (i, setup) in Setup::ALL.iter().enumerate() {
        let points: Vec<(f64, f64)> = rows
            .iter()
            .filter(|(_, r)| r.setup == *setup)
            .map(|(x, r)| (*x, r.peak_over_baseline))
            .collect();
        if points.is_empty() {
            continue;
        }
        let line: Vec<String> = points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(y.max(0.1).log10())))
            .collect();
        let colour = COLOURS[i];
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>",
            line.join(" ")
        );
        for (x, y) in &points {
            let _ = writeln!(
                svg,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{colour}\" data-setup=\"{setup:?}\" data-x=\"{x}\" data-y=\"{y:.3}\"/>",
                px(*x),
                py(y.max(0.1).log10())
            );
        }
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" fill=\"{colour}\">{}</text>",
            W - PAD - 150.0,
            PAD + 16.0 * i as f64,
            setup.as_str()
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// The points of a chart [`sweep_svg`] wrote: (set-up, x, y) from its circles.
pub fn read_svg_points(svg: &str) -> Vec<(String, f64, f64)> {
    let attr = |tag: &str, name: &str| -> Option<String> {
        let start = tag.find(&format!("{name}=\""))? + name.len() + 2;
        let end = tag[start..].find('"')? + start;
        Some(tag[start..end].to_owned())
    };
    svg.lines()
        .filter(|l| l.starts_with("<circle"))
        .filter_map(|l| {
            Some((
                attr(l, "data-setup")?,
                attr(l, "data-x")?.parse().ok()?,
                attr(l, "data-y")?.parse().ok()?,
            ))
        })
        .collect()
}

/// Writes `<dir>/sweep-<param>.csv` and `.svg`.
pub fn write_sweep(
    dir: &Path,
    param: SweepParam,
    rows: &[(f64, SimReport)],
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join(format!("sweep-{}.csv", param.as_str())),
        sweep_csv(param, rows),
    )?;
    std::fs::write(
        dir.join(format!("sweep-{}.svg", param.as_str())),
        sweep_svg(param, rows),
    )
}
