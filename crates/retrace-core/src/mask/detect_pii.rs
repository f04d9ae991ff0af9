//! Personal-data detectors: email addresses (anchored at `@`), payment cards (Luhn) and IBANs
//! (mod 97), both anchored at the start of a digit run (the engine's prefilter finds both).
use std::ops::Range;

use super::detect_keys::at_boundary;

fn local_part(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'%' | b'+' | b'-')
}

fn domain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-')
}

/// The email address around the `@` at `at`: a local part of up to 64 bytes, then a domain of
/// at least two labels whose last is 2 or more letters.
pub(crate) fn email_at(text: &[u8], at: usize) -> Option<Range<usize>> {
    let left = text[..at].iter().rev().take(65).take_while(|b| local_part(**b)).count();
    let mut start = at - left;
    while start < at && text[start] == b'.' {
        start += 1;
    }
    if start == at || left > 64 || text[at - 1] == b'.' {
        return None;
    }
    let right = text[at + 1..].iter().take(256).take_while(|b| domain(**b)).count();
    let mut end = at + 1 + right;
    while end > at + 1 && matches!(text[end - 1], b'.' | b'-') {
        end -= 1;
    }
    let host = &text[at + 1..end];
    let tld = host.rsplit(|b| *b == b'.').next()?;
    let labels_ok = host.split(|b| *b == b'.').all(|label| !label.is_empty());
    if !labels_ok || tld.len() < 2 || tld.len() == host.len() || !tld.iter().all(u8::is_ascii_alphabetic) {
        return None;
    }
    Some(start..end)
}

/// A card number starting at the digit run at `at`: 13–19 digits, the first 2–6, optionally
/// grouped by single spaces or dashes (one kind per number), Luhn-valid, standing alone (not
/// glued to letters, digits or a longer grouped number).
pub(crate) fn card_at(text: &[u8], at: usize) -> Option<Range<usize>> {
    if !(b'2'..=b'6').contains(&text[at]) || !at_boundary(text, at) {
        return None;
    }
    // Inside a longer run of groups, or the fraction of a decimal number (`0.5155050114850065`).
    if at >= 2 && matches!(text[at - 1], b' ' | b'-' | b'.') && text[at - 2].is_ascii_digit() {
        return None;
    }
    let mut digits = [0u8; 19];
    let (mut count, mut i, mut sep) = (0, at, None);
    loop {
        while i < text.len() && text[i].is_ascii_digit() {
            if count == 19 {
                return None;
            }
            digits[count] = text[i] - b'0';
            count += 1;
            i += 1;
        }
        let next = text.get(i).copied();
        let grouped = matches!(next, Some(b' ' | b'-'))
            && text.get(i + 1).is_some_and(u8::is_ascii_digit)
            && sep.is_none_or(|s| Some(s) == next);
        if !grouped {
            break;
        }
        sep = next;
        i += 1;
    }
    // The whole part of a decimal number (`4111111111111111.25`) is no card either.
    let decimal = text.get(i) == Some(&b'.') && text.get(i + 1).is_some_and(u8::is_ascii_digit);
    if count < 13 || decimal || text.get(i).is_some_and(u8::is_ascii_alphabetic) || !luhn(&digits[..count]) {
        return None;
    }
    Some(at..i)
}

#[allow(clippy::manual_is_multiple_of)] // `is_multiple_of` needs Rust 1.87; the workspace supports 1.85.
fn luhn(digits: &[u8]) -> bool {
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, d)| {
            let d = u32::from(*d);
            if i % 2 == 1 {
                if d * 2 > 9 {
                    d * 2 - 9
                } else {
                    d * 2
                }
            } else {
                d
            }
        })
        .sum();
    sum % 10 == 0
}

/// An IBAN whose check digits are the digit run at `at`: two capital letters before it, then
/// 15–34 capitals and digits in all, written solid or in groups of four separated by single
/// spaces, and the mod-97 check passes.
pub(crate) fn iban_at(text: &[u8], at: usize) -> Option<Range<usize>> {
    if at < 2 || !text[at - 2].is_ascii_uppercase() || !text[at - 1].is_ascii_uppercase() {
        return None;
    }
    let start = at - 2;
    if !at_boundary(text, start) || !text.get(at + 1).is_some_and(u8::is_ascii_digit) {
        return None;
    }
    let upper_or_digit = |b: u8| b.is_ascii_uppercase() || b.is_ascii_digit();
    let mut chars = [0u8; 34];
    let (mut count, mut i) = (0, start);
    while i < text.len() {
        let b = text[i];
        if upper_or_digit(b) {
            if count == 34 {
                return None;
            }
            chars[count] = b;
            count += 1;
            i += 1;
        } else if b == b' ' && count % 4 == 0 && text.get(i + 1).is_some_and(|b| upper_or_digit(*b)) {
            i += 1;
        } else {
            break;
        }
    }
    if count < 15 || text.get(i).is_some_and(u8::is_ascii_alphanumeric) || !mod97(&chars[..count]) {
        return None;
    }
    Some(start..i)
}

/// ISO 13616: move the first four characters to the end, letters become 10–35, the number
/// mod 97 must be 1.
fn mod97(iban: &[u8]) -> bool {
    let rearranged = iban[4..].iter().chain(&iban[..4]);
    let mut rest = 0u32;
    for b in rearranged {
        rest = if b.is_ascii_digit() {
            (rest * 10 + u32::from(b - b'0')) % 97
        } else {
            (rest * 100 + u32::from(b - b'A' + 10)) % 97
        };
    }
    rest == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn email(text: &str) -> Option<&str> {
        let at = text.find('@')?;
        email_at(text.as_bytes(), at).map(|r| &text[r])
    }

    fn first_run(text: &str, f: fn(&[u8], usize) -> Option<Range<usize>>) -> Option<&str> {
        let bytes = text.as_bytes();
        (0..bytes.len())
            .filter(|at| bytes[*at].is_ascii_digit() && (*at == 0 || !bytes[at - 1].is_ascii_digit()))
            .find_map(|at| f(bytes, at).map(|r| &text[r]))
    }

    #[test]
    fn emails() {
        assert_eq!(email("mail ada.lovelace+x@example.co.uk."), Some("ada.lovelace+x@example.co.uk"));
        assert_eq!(email("<bob@corp-mail.io>"), Some("bob@corp-mail.io"));
        assert_eq!(email("@property decorator"), None);
        assert_eq!(email("user@localhost"), None);
        assert_eq!(email("x@1.2"), None);
        assert_eq!(email("a@b..com"), None);
    }

    #[test]
    fn cards_need_luhn() {
        assert_eq!(first_run("card 4111 1111 1111 1111.", card_at), Some("4111 1111 1111 1111"));
        assert_eq!(first_run("4111-1111-1111-1111", card_at), Some("4111-1111-1111-1111"));
        assert_eq!(first_run("amex 378282246310005", card_at), Some("378282246310005"));
        assert_eq!(first_run("card 4111 1111 1111 1112", card_at), None, "Luhn fails");
        assert_eq!(first_run("4111-1111 1111-1111", card_at), None, "mixed separators");
        assert_eq!(first_run("ts 1700000000000", card_at), None, "starts with 1");
        assert_eq!(first_run("id4111111111111111", card_at), None, "glued to a word");
        assert_eq!(first_run("41111111111111111111111", card_at), None, "too long");
        // Decimal numbers (QA15 S4: a float's fraction passed Luhn and was shown as a card).
        assert_eq!(first_run("nonce 0.5155050114850065", card_at), None, "a fraction");
        assert_eq!(first_run("x 4111111111111111.25", card_at), None, "a whole part");
    }

    #[test]
    fn ibans_need_mod97() {
        assert_eq!(
            first_run("IBAN DE89 3704 0044 0532 0130 00, thanks", iban_at),
            Some("DE89 3704 0044 0532 0130 00")
        );
        assert_eq!(first_run("GB82WEST12345698765432", iban_at), Some("GB82WEST12345698765432"));
        assert_eq!(first_run("GB82WEST12345698765433", iban_at), None, "mod 97 fails");
        assert_eq!(first_run("DE88 3704 0044 0532 0130 00", iban_at), None, "check digits wrong");
        assert_eq!(first_run("XDE89370400440532013000", iban_at), None, "glued to a word");
    }
}
