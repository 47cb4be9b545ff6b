//! A self-contained HTML/SVG report of one or more simulated runs.
//!
//! For each run: the cell role timeline (like the paper's Figures 2 and 4: rollout, training,
//! switching per cell over time), step durations, and mean staleness per step against the
//! Theorem A.1 line. No scripts, no external assets: one file a person can open anywhere.

use std::fmt::Write;

use crate::RunReport;

const WIDTH: f64 = 960.0;
const LEFT: f64 = 90.0;
const ROW: f64 = 18.0;

/// Text for an HTML element or a quoted attribute value (a run's name comes from its config).
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

fn color(role: &str) -> &'static str {
    match role {
        "rollout" => "#4e79a7",
        "training" => "#e15759",
        _ => "#f2cf5b",
    }
}

fn timeline(out: &mut String, report: &RunReport) {
    let total = report.total_hours.max(1e-9);
    let plot = WIDTH - LEFT - 20.0;
    let rows = report.cells.len() + usize::from(report.standalone_nodes > 0);
    let height = rows as f64 * ROW + 40.0;
    let _ = writeln!(out, "<svg width=\"{WIDTH}\" height=\"{height}\" role=\"img\" aria-label=\"cell role timeline\">");
    let mut y = 10.0;
    if report.standalone_nodes > 0 {
        let _ = writeln!(
            out,
            "<text x=\"4\" y=\"{:.1}\" font-size=\"11\">standalone ({}n)</text><rect x=\"{LEFT}\" y=\"{y:.1}\" width=\"{plot:.1}\" height=\"{:.1}\" fill=\"{}\" opacity=\"0.6\"/>",
            y + 12.0,
            report.standalone_nodes,
            ROW - 4.0,
            color("rollout")
        );
        y += ROW;
    }
    for cell in &report.cells {
        let label = if cell.cell == 0 { "core" } else { "cell" };
        let _ = writeln!(
            out,
            "<text x=\"4\" y=\"{:.1}\" font-size=\"11\">{label} {} ({}n)</text>",
            y + 12.0,
            cell.cell,
            cell.nodes
        );
        for interval in &cell.intervals {
            let x = LEFT + interval.start_h / total * plot;
            let w = ((interval.end_h - interval.start_h) / total * plot).max(0.5);
            let _ = writeln!(
                out,
                "<rect x=\"{x:.2}\" y=\"{y:.1}\" width=\"{w:.2}\" height=\"{:.1}\" fill=\"{}\"><title>{} {:.2}–{:.2} h</title></rect>",
                ROW - 4.0,
                color(interval.role),
                interval.role,
                interval.start_h,
                interval.end_h
            );
        }
        y += ROW;
    }
    for end in &report.step_end_hours {
        let x = LEFT + end / total * plot;
        let _ = writeln!(out, "<line x1=\"{x:.2}\" x2=\"{x:.2}\" y1=\"6\" y2=\"{y:.1}\" stroke=\"#333\" stroke-dasharray=\"2,3\" stroke-width=\"0.7\"/>");
    }
    let ticks = (total.ceil() as usize).clamp(1, 24);
    for tick in 0..=ticks {
        let hours = total * tick as f64 / ticks as f64;
        let x = LEFT + hours / total * plot;
        let _ = writeln!(out, "<text x=\"{x:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"middle\">{hours:.1}h</text>", y + 14.0);
    }
    let _ = writeln!(out, "</svg>");
}

fn bars(out: &mut String, title: &str, values: &[f64], reference: Option<f64>, unit: &str) {
    let height = 150.0;
    let plot = WIDTH - LEFT - 20.0;
    let max = values
        .iter()
        .copied()
        .chain(reference)
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let _ = writeln!(
        out,
        "<h3>{}</h3><svg width=\"{WIDTH}\" height=\"{:.0}\" role=\"img\" aria-label=\"{}\">",
        escape(title),
        height + 30.0,
        escape(title)
    );
    let width = plot / values.len().max(1) as f64;
    for (index, value) in values.iter().enumerate() {
        let h = value / max * height;
        let x = LEFT + index as f64 * width;
        let _ = writeln!(
            out,
            "<rect x=\"{:.2}\" y=\"{:.2}\" width=\"{:.2}\" height=\"{h:.2}\" fill=\"#76b7b2\"><title>step {}: {value:.3} {unit}</title></rect>",
            x + 1.0,
            height - h + 5.0,
            (width - 2.0).max(0.5),
            index + 1
        );
    }
    if let Some(reference) = reference {
        let y = height - reference / max * height + 5.0;
        let _ = writeln!(out, "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{y:.2}\" y2=\"{y:.2}\" stroke=\"#e15759\" stroke-width=\"1.5\"/><text x=\"4\" y=\"{:.2}\" font-size=\"10\" fill=\"#e15759\">A.1: {reference:.2}</text>", LEFT + plot, y + 3.0);
    }
    let _ = writeln!(out, "<text x=\"4\" y=\"14\" font-size=\"10\">max {max:.2} {unit}</text><text x=\"{LEFT}\" y=\"{:.0}\" font-size=\"10\">step 1 … {}</text></svg>", height + 22.0, values.len());
}

/// Render runs (with an optional comparison table) as one HTML page.
pub fn render_html(title: &str, reports: &[RunReport], table: Option<&str>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{}</title><style>body{{font-family:sans-serif;margin:24px;color:#222}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}pre{{background:#f6f6f6;padding:8px}}.legend span{{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px}}</style></head><body><h1>{}</h1>",
        escape(title),
        escape(title)
    );
    let _ = writeln!(out, "<p class=\"legend\">Roles:<span style=\"background:{}\"></span>rollout<span style=\"background:{}\"></span>training<span style=\"background:{}\"></span>switching; dashed lines: optimizer steps.</p>", color("rollout"), color("training"), color("switching"));
    if let Some(table) = table {
        let _ = writeln!(out, "<h2>Summary</h2><pre>{}</pre>", escape(table));
    }
    for report in reports {
        let _ = writeln!(
            out,
            "<h2>{}</h2><p>mode {} ({}), streaming {}, φ={} μ={} N={} B={}; total {:.2} h; mean staleness {:.3} (steady state {:.3}, Theorem A.1 {:.3}); utilisation rollout {:.1}% training {:.1}%</p>",
            escape(&report.name),
            report.mode,
            report.granularity,
            report.streaming,
            report.phi,
            report.mu,
            report.n,
            report.b,
            report.total_hours,
            report.mean_staleness,
            report.steady_state_mean_staleness,
            report.expected_staleness,
            report.utilization.rollout * 100.0,
            report.utilization.training * 100.0
        );
        timeline(&mut out, report);
        bars(
            &mut out,
            &format!("{}: step durations (h)", report.name),
            &report.step_duration_hours,
            None,
            "h",
        );
        bars(
            &mut out,
            &format!("{}: mean staleness per step", report.name),
            &report.staleness_by_step,
            Some(report.expected_staleness),
            "",
        );
    }
    let _ = writeln!(out, "</body></html>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_cannot_end_an_attribute() {
        let name = "x\" onload=\"alert(1)' x='";
        let escaped = escape(name);
        assert!(
            !escaped.contains('"') && !escaped.contains('\''),
            "{escaped}"
        );
        assert_eq!(escaped, "x&quot; onload=&quot;alert(1)&#39; x=&#39;");
    }
}
