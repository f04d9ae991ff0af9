//! Text from a recording shown in a terminal: a name, an agent id or a label comes from the
//! recorded program (or from any client of the proxy), so it is kept on one line and can't move
//! the cursor or forge lines.

use std::borrow::Cow;

/// `2024-05-01 12:30:05` in UTC, from Unix milliseconds.
pub fn utc_time(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}", rem / 3600, rem / 60 % 60, rem % 60)
}

/// `noun` with its indefinite article: `a tool_call`, `an intent`.
pub fn a(noun: &str) -> String {
    match noun.chars().next() {
        Some('a' | 'e' | 'i' | 'o' | 'u') => format!("an {noun}"),
        _ => format!("a {noun}"),
    }
}

/// `n` and its noun, plural unless `n` is 1: `count(1, "step")` is `1 step`, `count(3, "step")`
/// is `3 steps`. Every noun Retrace counts in its messages takes an `s`.
pub fn count(n: impl TryInto<u64>, noun: &str) -> String {
    match n.try_into().unwrap_or(u64::MAX) {
        1 => format!("1 {noun}"),
        n => format!("{n} {noun}s"),
    }
}

/// `text` as one line of a terminal: control characters (a newline in a run's name, an escape
/// sequence in an agent id) escaped as Rust writes them (`\n`, `\u{1b}`), so a cell never breaks
/// its row.
pub fn one_line(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return text.into();
    }
    text.chars()
        .map(|c| if c.is_control() { c.escape_debug().to_string() } else { c.to_string() })
        .collect::<String>()
        .into()
}

/// `argv` as a POSIX shell would take it back: each word bare when it holds only characters no
/// shell treats specially, else in single quotes (`'it'\''s'`), or, holding a control
/// character, in `$'...'` quotes with the character escaped (`$'a\nb'`, bash, zsh and ksh read
/// it), so the line can be pasted and stays one line.
pub fn shell_words(argv: &[String]) -> String {
    argv.iter().map(|word| shell_word(word)).collect::<Vec<_>>().join(" ")
}

fn shell_word(word: &str) -> Cow<'_, str> {
    let bare = |c: char| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c);
    if !word.is_empty() && word.chars().all(bare) {
        return word.into();
    }
    if !word.chars().any(char::is_control) {
        return format!("'{}'", word.replace('\'', r"'\''")).into();
    }
    let mut quoted = String::from("$'");
    for c in word.chars() {
        match c {
            '\\' => quoted.push_str(r"\\"),
            '\'' => quoted.push_str(r"\'"),
            '\n' => quoted.push_str(r"\n"),
            '\t' => quoted.push_str(r"\t"),
            '\r' => quoted.push_str(r"\r"),
            c if c.is_control() && (c as u32) < 0x80 => quoted.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() => quoted.push_str(&format!("\\u{:04x}", c as u32)),
            c => quoted.push(c),
        }
    }
    quoted.push('\'');
    quoted.into()
}

#[cfg(test)]
mod tests {
    use super::{one_line, shell_words};

    fn words(argv: &[&str]) -> String {
        shell_words(&argv.iter().map(|w| w.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn shell_words_quote_only_what_a_shell_would_read_otherwise() {
        assert_eq!(
            words(&["python", "app.py", "--model=gpt-4o", "a/b.c"]),
            "python app.py --model=gpt-4o a/b.c"
        );
        assert_eq!(
            words(&["echo", "two words", "", "it's", "$HOME", "*"]),
            r"echo 'two words' '' 'it'\''s' '$HOME' '*'"
        );
        assert_eq!(words(&["printf", "a\nb\u{1b}[0m", "it's\\"]), r"printf $'a\nb\x1b[0m' 'it'\''s\'");
        assert_eq!(words(&["x", "q'\t\\"]), r"x $'q\'\t\\'");
        assert_eq!(words(&["plänner"]), "'plänner'");
    }

    /// bash reads every quoted line back to the argv it came from.
    #[test]
    fn bash_reads_shell_words_back_word_for_word() {
        let argv: Vec<String> = [
            "a b",
            "",
            "it's",
            "$(echo pwned)",
            "`x`",
            "\\",
            "tab\there",
            "nl\nx\u{1b}[31m",
            "é'\"\\",
            "!x",
            "~",
            "#c",
        ]
        .map(String::from)
        .to_vec();
        let line = format!("printf '%s\\0' {}", shell_words(&argv));
        let out = std::process::Command::new("bash").args(["-c", &line]).output().unwrap();
        assert!(out.status.success(), "{line}: {}", String::from_utf8_lossy(&out.stderr));
        // Each word ends in a NUL: the piece after the last one is empty.
        let mut back: Vec<String> =
            out.stdout.split(|b| *b == 0).map(|w| String::from_utf8(w.to_vec()).unwrap()).collect();
        assert_eq!(back.pop().as_deref(), Some(""));
        assert_eq!(back, argv, "{line}");
    }

    #[test]
    fn control_characters_are_escaped_and_the_rest_is_kept() {
        assert_eq!(one_line("plänneré 計画"), "plänneré 計画");
        assert_eq!(one_line("evil\n\u{1b}[31mred"), "evil\\n\\u{1b}[31mred");
    }
}
