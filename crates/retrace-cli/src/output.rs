//! Shared output helpers: JSON printing and progress on a terminal.
use std::io::{IsTerminal, Write};

/// Set once a command printed its JSON document: an error it returns afterwards is then said
/// on standard error only ([`crate::exit::finish`]), so standard output holds one document.
static JSON_PRINTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Notes that the command printed its JSON document (for one written without these helpers).
pub fn json_printed() {
    JSON_PRINTED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether the command printed its JSON document.
pub fn was_json_printed() -> bool {
    JSON_PRINTED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Prints `value` as pretty JSON on standard output.
pub fn print_json(value: &serde_json::Value) -> anyhow::Result<()> {
    json_printed();
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}

/// Writes `value` as one compact line of JSON: what `record`, `replay` and `fork` print last,
/// after the program's own standard output, so a script reads the last line.
pub fn print_json_line(value: &serde_json::Value) -> anyhow::Result<()> {
    json_printed();
    let mut out = std::io::stdout().lock();
    // On a line of its own, even after a program whose output ended mid-line.
    crate::launcher::line_end::start_line(&mut out)?;
    serde_json::to_writer(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}

pub use retrace_core::terminal::count;

/// Whether an output path is `-`: standard output, as `import -` reads standard input.
pub fn is_stdout(path: &std::path::Path) -> bool {
    path.as_os_str() == "-"
}

/// Makes the folder `path` goes in when it is missing (`-o tests/traces/x.jsonl`, `--junit
/// target/gate.xml` in a fresh clone): every file a command writes gets its folder.
pub fn make_folder_of(path: &std::path::Path) -> std::io::Result<()> {
    match path.parent().filter(|p| !p.as_os_str().is_empty() && !p.exists()) {
        Some(folder) => std::fs::create_dir_all(folder),
        None => Ok(()),
    }
}

/// Writes `text` to standard error, as `eprint!` would, but a closed standard error (`retrace
/// gate ... 2>&1 | head -1`) drops it instead of panicking (a panic exits 101); the exit code
/// is still the command's ([`crate::exit::finish`]).
pub fn to_stderr(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes()).and_then(|()| err.flush());
}

/// Progress on standard error, shown only when it is a terminal: `label: done/total (p%)`, or
/// for bytes `label: 7.6/85.8 MiB (9%), 41.2 MiB/s`.
#[derive(Debug)]
pub struct Progress {
    label: &'static str,
    total: u64,
    done: u64,
    bytes: bool,
    shown: bool,
    began: std::time::Instant,
    last: std::time::Instant,
}

impl Progress {
    /// Progress of `total` items labelled `label`.
    pub fn new(label: &'static str, total: u64) -> Progress {
        let now = std::time::Instant::now();
        Progress {
            label,
            total,
            done: 0,
            bytes: false,
            shown: std::io::stderr().is_terminal(),
            began: now,
            last: now,
        }
    }

    /// Progress of `total` bytes (0: not known, as when reading standard input).
    pub fn bytes(label: &'static str, total: u64) -> Progress {
        Progress { bytes: true, ..Progress::new(label, total) }
    }

    /// Counts `n` more items done.
    pub fn add(&mut self, n: u64) {
        self.done += n;
        if self.shown && self.last.elapsed().as_millis() >= 100 {
            self.last = std::time::Instant::now();
            eprint!("\r\x1b[2K{}", self.line());
        }
    }

    /// What the progress line says now.
    fn line(&self) -> String {
        let percent = match self.total {
            0 => String::new(),
            total => format!(" ({}%)", (self.done.min(total) * 100 / total)),
        };
        if !self.bytes {
            return format!("{}: {}/{}{percent}", self.label, self.done, self.total);
        }
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let seconds = self.began.elapsed().as_secs_f64().max(1e-3);
        let rate = format!(", {:.1} MiB/s", mib(self.done) / seconds);
        match self.total {
            0 => format!("{}: {:.1} MiB{rate}", self.label, mib(self.done)),
            total => format!("{}: {:.1}/{:.1} MiB{percent}{rate}", self.label, mib(self.done), mib(total)),
        }
    }

    /// Clears the progress line.
    pub fn finish(&mut self) {
        if self.shown {
            eprint!("\r\x1b[2K");
        }
    }
}

/// A [`crate::exit::Failure`] with exit `code` whose message is `err` and its causes, joined by
/// `: `, and the code of its kind: a conflicting import is `conflict`, a file or stored run
/// that fails its checks `corrupt`, else the store's error kind (QA37 D2: both were `failed`).
pub fn failure(code: u8, err: &(dyn std::error::Error + 'static)) -> anyhow::Error {
    use retrace_store::export::ExportError;
    use retrace_store::import::{ImportError, ImportErrorKind};
    let chain = std::iter::successors(Some(err), |e| e.source()).map(ToString::to_string);
    let message = unquoted_causes(chain).join(": ");
    let kind = match (err.downcast_ref::<ImportError>(), err.downcast_ref::<ExportError>()) {
        (Some(e), _) if e.kind() == ImportErrorKind::Conflict => Some("conflict"),
        (Some(e), _) if e.kind() == ImportErrorKind::Verification => Some("corrupt"),
        (_, Some(ExportError::Inconsistent { .. } | ExportError::Canon { .. })) => Some("corrupt"),
        _ => None,
    };
    let kind = kind.or_else(|| {
        let store = std::iter::successors(Some(err), |e| e.source())
            .find_map(|e| e.downcast_ref::<retrace_store::StoreError>())?;
        Some(match store.kind {
            retrace_store::StoreErrorKind::NotFound => "not_found",
            retrace_store::StoreErrorKind::Conflict => "conflict",
            retrace_store::StoreErrorKind::Corrupt => "corrupt",
            _ => return None,
        })
    });
    crate::exit::Failure { code, message, hint: None, kind }.into()
}

/// An error chain's messages, without a cause the message before it ends with already: an
/// error that quotes its source (`reading blob …: No such file or directory (os error 2)`)
/// would otherwise say it twice.
pub fn unquoted_causes(chain: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut said: Vec<String> = Vec::new();
    for text in chain {
        if !said.last().is_some_and(|last| last.ends_with(&text)) {
            said.push(text);
        }
    }
    said
}

/// A fork's edits for a terminal, `, `-joined, each blob digest cut to its first 12 hex digits
/// (`message:7=@sha256:cd36775da062`): the JSON keeps them whole.
pub fn edits_line(edits: &[String]) -> String {
    let short = |edit: &String| match edit.split_once("=@sha256:") {
        Some((target, hex)) if hex.len() > 12 => format!("{target}=@sha256:{}", &hex[..12]),
        _ => edit.clone(),
    };
    edits.iter().map(short).collect::<Vec<_>>().join(", ")
}

pub use retrace_core::terminal::utc_time;

pub use retrace_core::terminal::one_line;

/// The columns `text` takes in a terminal (a CJK character two, a combining mark none).
pub fn width(text: &str) -> usize {
    unicode_width::UnicodeWidthStr::width(text)
}

/// `text` on one line ([`one_line`]), cut to `columns` terminal columns, ending in `…` when cut.
pub fn fit(text: &str, columns: usize) -> String {
    let text = one_line(text);
    if width(&text) <= columns {
        return text.into_owned();
    }
    let mut cut = String::new();
    let mut used = 0;
    for c in text.chars() {
        let w = unicode_width::UnicodeWidthChar::width(c).unwrap_or(0);
        if used + w > columns.saturating_sub(1) {
            break;
        }
        cut.push(c);
        used += w;
    }
    cut.push('…');
    cut
}

/// `text` padded with spaces to `columns` terminal columns.
pub fn pad(text: &str, columns: usize) -> String {
    let mut padded = text.to_owned();
    padded.extend(std::iter::repeat_n(' ', columns.saturating_sub(width(text))));
    padded
}

/// Rows as left-aligned columns two spaces apart, each cell on one line ([`one_line`]) and
/// measured in terminal columns; the last column is not padded.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<std::borrow::Cow<'_, str>>> =
        rows.iter().map(|row| row.iter().map(|cell| one_line(cell)).collect()).collect();
    let mut widths: Vec<usize> = header.iter().map(|h| width(h)).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(width(cell));
        }
    }
    let mut out = String::new();
    let header: Vec<std::borrow::Cow<'_, str>> = header.iter().map(|h| one_line(h)).collect();
    for row in std::iter::once(&header).chain(&rows) {
        let last = row.len().saturating_sub(1);
        for (i, cell) in row.iter().enumerate() {
            out.push_str(cell);
            if i < last {
                out.extend(std::iter::repeat_n(' ', widths[i] - width(cell) + 2));
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers() {
        assert_eq!(utc_time(0), "1970-01-01 00:00:00");
        assert_eq!(utc_time(1_709_210_096_000), "2024-02-29 12:34:56");
        assert_eq!(fit("planner", 4), "pla…");
        assert_eq!(table(&["a", "bb"], &[vec!["xyz".into(), "1".into()]]), "a    bb\nxyz  1\n");
        // A newline stays in its cell; a wide character takes two columns.
        let rows = [vec!["two\nlines".into(), "1".into()], vec!["名前".into(), "2".into()]];
        assert_eq!(table(&["NAME", "N"], &rows), "NAME        N\ntwo\\nlines  1\n名前        2\n");
        assert_eq!(fit("名前の長い", 5), "名前…");
        assert_eq!(pad("名", 4), "名  ");
    }

    #[test]
    fn progress_says_items_with_a_percentage_and_bytes_in_mib_with_a_rate() {
        let mut items = Progress::new("verifying events", 200);
        items.done = 50;
        assert_eq!(items.line(), "verifying events: 50/200 (25%)");
        let mut bytes = Progress::bytes("importing", 90 << 20);
        bytes.done = 9 << 20;
        let line = bytes.line();
        assert!(line.starts_with("importing: 9.0/90.0 MiB (10%), "), "{line}");
        assert!(line.ends_with(" MiB/s"), "{line}");
        let mut unknown = Progress::bytes("importing", 0);
        unknown.done = 3 << 19;
        assert!(unknown.line().starts_with("importing: 1.5 MiB, "), "{}", unknown.line());
    }

    #[test]
    fn a_cause_its_error_quotes_is_said_once() {
        let chain = ["reading blob x: No such file (os error 2)", "No such file (os error 2)", "deeper"];
        let said = unquoted_causes(chain.map(str::to_owned));
        assert_eq!(said, ["reading blob x: No such file (os error 2)", "deeper"]);
    }
}
