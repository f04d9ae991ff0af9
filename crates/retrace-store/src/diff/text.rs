//! A short, unified-style line diff of two blobs: JSON pretty-printed, text as is, binary as a
//! one-line summary. Lines are matched by a longest common subsequence after trimming the
//! common head and tail; past [`MAX_CELLS`] the middle is shown as replaced whole.
use retrace_core::Digest;

use crate::Store;

/// Lines of context around each change.
const CONTEXT: usize = 3;

/// The largest middle (lines of A × lines of B) aligned line by line.
const MAX_CELLS: usize = 1 << 20;

/// Blobs larger than this are not diffed, only named.
const MAX_BLOB: usize = 4 << 20;

/// One side of a diff: a title (`A seq 41 output`), the blob, if the step has one, and why
/// the step failed, if it did.
pub(super) struct Side<'a> {
    pub(super) title: &'a str,
    pub(super) blob: Option<Digest>,
    pub(super) error: Option<&'a str>,
}

/// The longest line a diff prints whole: a line of a 2 MB output printed 2 MB (QA25 D4).
const MAX_LINE_CHARS: usize = 400;

/// The diff of two blobs in unified style, at most `max_lines` lines after the two headers
/// (a last line says how many more there were).
pub(super) fn diff_blobs(store: &dyn Store, a: Side<'_>, b: Side<'_>, max_lines: usize) -> String {
    let (old, new) = (lines_of(store, a.blob, a.error), lines_of(store, b.blob, b.error));
    unified(&old, &new, a.title, b.title, max_lines)
}

/// The blob's lines as the reader should see them (a failed step's: its error), each cut
/// after [`MAX_LINE_CHARS`].
fn lines_of(store: &dyn Store, blob: Option<Digest>, error: Option<&str>) -> Vec<String> {
    let mut lines = whole_lines_of(store, blob, error);
    for line in &mut lines {
        if let Some((cut, _)) = line.char_indices().nth(MAX_LINE_CHARS) {
            let more = line[cut..].chars().count();
            line.truncate(cut);
            line.push_str(&format!("… ({more} more characters)"));
        }
    }
    lines
}

fn whole_lines_of(store: &dyn Store, blob: Option<Digest>, error: Option<&str>) -> Vec<String> {
    let Some(digest) = blob else {
        return match error {
            Some(error) => error.lines().map(|l| format!("(failed) {l}")).collect(),
            None => vec!["(no output)".to_owned()],
        };
    };
    let bytes = match store.get_blob(&digest) {
        Ok(bytes) => bytes,
        Err(e) => return vec![format!("({digest} can't be read: {e})")],
    };
    if bytes.len() > MAX_BLOB {
        return vec![format!("({} bytes, {digest}: too large to diff)", bytes.len())];
    }
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(&bytes) {
        if let Ok(pretty) = serde_json::to_string_pretty(&value) {
            return pretty.lines().map(str::to_owned).collect();
        }
    }
    match String::from_utf8(bytes) {
        Ok(text) => text.lines().map(str::to_owned).collect(),
        Err(e) => vec![format!("(binary, {} bytes, {digest})", e.as_bytes().len())],
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Keep,
    Delete,
    Insert,
}

/// `old` against `new` as unified hunks under `--- old_title` / `+++ new_title`.
pub(super) fn unified(
    old: &[String],
    new: &[String],
    old_title: &str,
    new_title: &str,
    max_lines: usize,
) -> String {
    let script = edit_script(old, new);
    let mut out = format!("--- {old_title}\n+++ {new_title}\n");
    let (mut shown, mut hidden) = (0usize, 0usize);
    let mut emit = |line: String, out: &mut String| {
        if shown < max_lines {
            out.push_str(&line);
            out.push('\n');
            shown += 1;
        } else {
            hidden += 1;
        }
    };
    let changed: Vec<usize> = (0..script.len()).filter(|i| script[*i].0 != Op::Keep).collect();
    let mut next = 0;
    while next < changed.len() {
        // A hunk: changes no more than 2 × CONTEXT kept lines apart, with CONTEXT around them.
        let start = changed[next].saturating_sub(CONTEXT);
        let mut last = changed[next];
        while next + 1 < changed.len() && changed[next + 1] - last <= 2 * CONTEXT + 1 {
            next += 1;
            last = changed[next];
        }
        next += 1;
        let end = (last + CONTEXT + 1).min(script.len());
        let (old_at, new_at) = positions(&script[..start]);
        let (old_len, new_len) = positions(&script[start..end]);
        emit(format!("@@ -{} +{} @@", range(old_at, old_len), range(new_at, new_len)), &mut out);
        for (op, line) in &script[start..end] {
            let mark = match op {
                Op::Keep => ' ',
                Op::Delete => '-',
                Op::Insert => '+',
            };
            emit(format!("{mark}{line}"), &mut out);
        }
    }
    if hidden > 0 {
        out.push_str(&format!("… {hidden} more diff lines\n"));
    }
    out
}

/// How many old and new lines a stretch of the script covers.
fn positions(script: &[(Op, &str)]) -> (usize, usize) {
    let old = script.iter().filter(|(op, _)| *op != Op::Insert).count();
    let new = script.iter().filter(|(op, _)| *op != Op::Delete).count();
    (old, new)
}

/// `start,len` as unified diffs write it (1-based; an empty range names the line before).
fn range(before: usize, len: usize) -> String {
    match len {
        0 => format!("{before},0"),
        1 => format!("{}", before + 1),
        _ => format!("{},{len}", before + 1),
    }
}

/// Every line of both sides, kept, deleted or inserted.
fn edit_script<'a>(old: &'a [String], new: &'a [String]) -> Vec<(Op, &'a str)> {
    let head = old.iter().zip(new).take_while(|(a, b)| a == b).count();
    let tail = old[head..].iter().rev().zip(new[head..].iter().rev()).take_while(|(a, b)| a == b).count();
    let (a, b) = (&old[head..old.len() - tail], &new[head..new.len() - tail]);
    let mut script: Vec<(Op, &str)> = old[..head].iter().map(|l| (Op::Keep, l.as_str())).collect();
    if a.len().saturating_mul(b.len()) <= MAX_CELLS {
        lcs_script(a, b, &mut script);
    } else {
        script.extend(a.iter().map(|l| (Op::Delete, l.as_str())));
        script.extend(b.iter().map(|l| (Op::Insert, l.as_str())));
    }
    script.extend(old[old.len() - tail..].iter().map(|l| (Op::Keep, l.as_str())));
    script
}

/// Appends the edit script of `a` → `b` by longest common subsequence (deletions first).
fn lcs_script<'a>(a: &'a [String], b: &'a [String], script: &mut Vec<(Op, &'a str)>) {
    let width = b.len() + 1;
    let mut table = vec![0u32; (a.len() + 1) * width];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            table[i * width + j] = if a[i] == b[j] {
                table[(i + 1) * width + j + 1] + 1
            } else {
                table[(i + 1) * width + j].max(table[i * width + j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            script.push((Op::Keep, &a[i]));
            (i, j) = (i + 1, j + 1);
        } else if j == b.len() || (i < a.len() && table[(i + 1) * width + j] >= table[i * width + j + 1]) {
            script.push((Op::Delete, &a[i]));
            i += 1;
        } else {
            script.push((Op::Insert, &b[j]));
            j += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_owned).collect()
    }

    fn check(old: &str, new: &str, max_lines: usize, expected: &str) {
        assert_eq!(unified(&lines(old), &lines(new), "A", "B", max_lines), expected);
    }

    #[test]
    fn hunks_with_context_and_a_cap() {
        check("a\nb\nc\n", "a\nb\nc\n", 10, "--- A\n+++ B\n");
        check("a\nb\nc\n", "a\nx\nc\n", 10, "--- A\n+++ B\n@@ -1,3 +1,3 @@\n a\n-b\n+x\n c\n");
        check("", "new\n", 10, "--- A\n+++ B\n@@ -0,0 +1 @@\n+new\n");
        let old: String = (1..=20).map(|i| format!("{i}\n")).collect();
        let new: String = (1..=20)
            .map(|i| match i {
                2 => "two\n".to_owned(),
                18 => "eighteen\n".to_owned(),
                _ => format!("{i}\n"),
            })
            .collect();
        check(
            &old,
            &new,
            100,
            "--- A\n+++ B\n@@ -1,5 +1,5 @@\n 1\n-2\n+two\n 3\n 4\n 5\n\
             @@ -15,6 +15,6 @@\n 15\n 16\n 17\n-18\n+eighteen\n 19\n 20\n",
        );
        check(&old, &new, 3, "--- A\n+++ B\n@@ -1,5 +1,5 @@\n 1\n-2\n… 12 more diff lines\n");
    }
}
