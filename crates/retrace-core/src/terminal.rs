//! Text from a recording shown in a terminal: a name, an agent id or a label comes from the
//! recorded program (or from any client of the proxy), so it is kept on one line and can't move
//! the cursor or forge lines.

use std::borrow::Cow;

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

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn control_characters_are_escaped_and_the_rest_is_kept() {
        assert_eq!(one_line("plänneré 計画"), "plänneré 計画");
        assert_eq!(one_line("evil\n\u{1b}[31mred"), "evil\\n\\u{1b}[31mred");
    }
}
