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

/// An IBAN whose check digits are the digit run at `at`: two letters before it, then 15–34
/// letters and digits in all, written solid or in groups of four separated by single spaces,
/// and the mod-97 check passes. Written in capitals, any country code is taken; with a
/// lowercase letter anywhere (`de89 3704 ...`), only a country of the IBAN registry and at
/// exactly its length ([`registered_length`]), since lowercase words followed by digits are
/// common and one in 97 passes the check by chance.
pub(crate) fn iban_at(text: &[u8], at: usize) -> Option<Range<usize>> {
    if at < 2 || !text[at - 2].is_ascii_alphabetic() || !text[at - 1].is_ascii_alphabetic() {
        return None;
    }
    let start = at - 2;
    if !at_boundary(text, start) || !text.get(at + 1).is_some_and(u8::is_ascii_digit) {
        return None;
    }
    let mut chars = [0u8; 34];
    let (mut count, mut i, mut lowercase) = (0, start, false);
    while i < text.len() {
        let b = text[i];
        if b.is_ascii_alphanumeric() {
            if count == 34 {
                return None;
            }
            lowercase |= b.is_ascii_lowercase();
            chars[count] = b.to_ascii_uppercase();
            count += 1;
            i += 1;
        } else if b == b' ' && count % 4 == 0 && text.get(i + 1).is_some_and(u8::is_ascii_alphanumeric) {
            i += 1;
        } else {
            break;
        }
    }
    let iban = &chars[..count];
    if count < 15 || (lowercase && registered_length(&chars[..2]) != Some(count)) || !mod97(iban) {
        return None;
    }
    Some(start..i)
}

/// The length of an IBAN of `country` (two capitals), for the countries of the ISO 13616
/// registry (SWIFT's IBAN registry).
fn registered_length(country: &[u8]) -> Option<usize> {
    const LENGTHS: &[(&[u8; 2], u8)] = &[
        (b"AD", 24),
        (b"AE", 23),
        (b"AL", 28),
        (b"AT", 20),
        (b"AZ", 28),
        (b"BA", 20),
        (b"BE", 16),
        (b"BG", 22),
        (b"BH", 22),
        (b"BR", 29),
        (b"BY", 28),
        (b"CH", 21),
        (b"CR", 22),
        (b"CY", 28),
        (b"CZ", 24),
        (b"DE", 22),
        (b"DK", 18),
        (b"DO", 28),
        (b"EE", 20),
        (b"EG", 29),
        (b"ES", 24),
        (b"FI", 18),
        (b"FO", 18),
        (b"FR", 27),
        (b"GB", 22),
        (b"GE", 22),
        (b"GI", 23),
        (b"GL", 18),
        (b"GR", 27),
        (b"GT", 28),
        (b"HR", 21),
        (b"HU", 28),
        (b"IE", 22),
        (b"IL", 23),
        (b"IQ", 23),
        (b"IS", 26),
        (b"IT", 27),
        (b"JO", 30),
        (b"KW", 30),
        (b"KZ", 20),
        (b"LB", 28),
        (b"LC", 32),
        (b"LI", 21),
        (b"LT", 20),
        (b"LU", 20),
        (b"LV", 21),
        (b"LY", 25),
        (b"MC", 27),
        (b"MD", 24),
        (b"ME", 22),
        (b"MK", 19),
        (b"MR", 27),
        (b"MT", 31),
        (b"MU", 30),
        (b"NL", 18),
        (b"NO", 15),
        (b"PK", 24),
        (b"PL", 28),
        (b"PS", 29),
        (b"PT", 25),
        (b"QA", 29),
        (b"RO", 24),
        (b"RS", 22),
        (b"SA", 24),
        (b"SC", 31),
        (b"SE", 24),
        (b"SI", 19),
        (b"SK", 24),
        (b"SM", 27),
        (b"ST", 25),
        (b"SV", 28),
        (b"TL", 23),
        (b"TN", 24),
        (b"TR", 26),
        (b"UA", 29),
        (b"VA", 22),
        (b"VG", 24),
        (b"XK", 20),
    ];
    LENGTHS.iter().find(|(c, _)| c[..] == *country).map(|(_, n)| usize::from(*n))
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
        // Lowercase: a registered country at its exact length only.
        assert_eq!(
            first_run("iban de89 3704 0044 0532 0130 00.", iban_at),
            Some("de89 3704 0044 0532 0130 00")
        );
        assert_eq!(first_run("gb82west12345698765432", iban_at), Some("gb82west12345698765432"));
        assert_eq!(first_run("Gb82West12345698765432", iban_at), Some("Gb82West12345698765432"));
        assert_eq!(first_run("de89 3704 0044 0532 0130 001", iban_at), None, "one digit too many for DE");
        assert_eq!(first_run("gb82west12345698765433", iban_at), None, "mod 97 fails");
        // A lowercase id that passes mod 97 by chance but is no country's IBAN.
        let chance = (0..100)
            .map(|check| format!("zz{check:02}12345678901234"))
            .find(|id| mod97(id.to_ascii_uppercase().as_bytes()))
            .unwrap();
        assert_eq!(first_run(&chance, iban_at), None, "{chance}");
        assert_eq!(first_run(&chance.to_ascii_uppercase(), iban_at), Some(&*chance.to_ascii_uppercase()));
    }
}
