//! The result table: one line per measurement (name, median, floor, ratio, target, verdict).
use std::time::Duration;

/// What a measurement is held to.
#[derive(Clone, Copy, Debug)]
pub enum Target {
    /// `median / floor` at most this.
    RatioAtMost(f64),
    /// `median / floor` at least this.
    RatioAtLeast(f64),
    /// `floor / median` at least this (how many times below a reference cost).
    TimesBelow(f64),
    /// The median itself at least this.
    AtLeast(f64),
    /// The median itself at most this.
    AtMost(f64),
    /// Reported only.
    Info,
}

/// One measured line.
#[derive(Clone, Debug)]
pub struct Line {
    /// What was measured.
    pub name: String,
    /// Median over the repeats.
    pub median: f64,
    /// The unit of `median` and `floor`.
    pub unit: &'static str,
    /// The same-run floor (or a fixed reference), when there is one.
    pub floor: Option<f64>,
    /// What the median is held to.
    pub target: Target,
}

impl Line {
    /// A line measured against `floor`.
    pub fn new(name: &str, median: f64, unit: &'static str, floor: Option<f64>, target: Target) -> Line {
        Line { name: name.to_owned(), median, unit, floor, target }
    }

    /// The ratio the target speaks of (`floor / median` for [`Target::TimesBelow`]).
    pub fn ratio(&self) -> Option<f64> {
        let floor = self.floor.filter(|f| *f > 0.0)?;
        Some(match self.target {
            Target::TimesBelow(_) => floor / self.median,
            _ => self.median / floor,
        })
    }

    /// PASS, MISS or INFO.
    pub fn verdict(&self) -> &'static str {
        let ratio = self.ratio().unwrap_or(f64::NAN);
        let pass = match self.target {
            Target::RatioAtMost(t) => ratio <= t,
            Target::RatioAtLeast(t) | Target::TimesBelow(t) => ratio >= t,
            Target::AtLeast(t) => self.median >= t,
            Target::AtMost(t) => self.median <= t,
            Target::Info => return "INFO",
        };
        if pass {
            "PASS"
        } else {
            "MISS"
        }
    }

    fn target_text(&self) -> String {
        match self.target {
            Target::RatioAtMost(t) => format!("ratio <= {t:.2}x"),
            Target::RatioAtLeast(t) => format!("ratio >= {t:.2}x"),
            Target::TimesBelow(t) => format!(">= {t:.0}x below"),
            Target::AtLeast(t) => format!(">= {} {}", number(t), self.unit),
            Target::AtMost(t) => format!("<= {} {}", number(t), self.unit),
            Target::Info => "-".to_owned(),
        }
    }
}

/// Prints the table header.
pub fn header() {
    println!(
        "{:<44} {:>18} {:>18} {:>9}  {:<22} result",
        "measurement", "median", "floor", "ratio", "target"
    );
}

/// Prints one line (as soon as it is measured) and keeps it for the summary.
pub fn print(lines: &mut Vec<Line>, line: Line) {
    let floor = line.floor.map_or_else(|| "-".to_owned(), |f| format!("{} {}", number(f), line.unit));
    let ratio = line.ratio().map_or_else(|| "-".to_owned(), |r| format!("{r:.2}x"));
    println!(
        "{:<44} {:>18} {:>18} {:>9}  {:<22} {}",
        line.name,
        format!("{} {}", number(line.median), line.unit),
        floor,
        ratio,
        line.target_text(),
        line.verdict()
    );
    lines.push(line);
}

/// A number with sensible precision for its size.
pub fn number(x: f64) -> String {
    if x.abs() >= 1000.0 {
        format!("{x:.0}")
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// The median of `xs` (the mean of the middle two for an even count).
pub fn median(xs: &[f64]) -> f64 {
    let mut v: Vec<f64> = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The median of durations, in microseconds.
pub fn median_us(ds: &[Duration]) -> f64 {
    let us: Vec<f64> = ds.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    median(&us)
}
