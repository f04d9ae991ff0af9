//! Where two JSON values first differ, as a JSON path such as `$.messages[3].content`.
//!
//! Equality is canonical equality (see [`crate::canonical`]): numbers compare by
//! their canonical text, so `1.0` equals `1`, and objects compare by key whatever
//! the member order. The walk visits object members in canonical key order and
//! array items by index, and reports the first place where the two differ.

use std::cmp::Ordering;

use crate::canonical::{key_order, write_number};
use crate::json::{parse, path_push_index, path_push_key, Json, Number};

/// The path of the first difference between `a` and `b`, or `None` when they are
/// canonically equal.
///
/// A key present on one side only is reported at that key; when one array is a
/// prefix of the other, the first extra index is reported; when the two sides
/// have different types, the node itself is reported.
pub fn first_difference(a: &Json, b: &Json) -> Option<String> {
    let mut path = String::from("$");
    differ(a, b, &mut path).then_some(path)
}

/// Like [`first_difference`] on two JSON texts; if either does not parse, `"$"`.
pub fn first_difference_bytes(a: &[u8], b: &[u8]) -> Option<String> {
    match (parse(a), parse(b)) {
        (Ok(a), Ok(b)) => first_difference(&a, &b),
        _ => Some("$".to_owned()),
    }
}

/// Whether `a` and `b` differ; if so `path` is extended to the first difference.
fn differ(a: &Json, b: &Json, path: &mut String) -> bool {
    match (a, b) {
        (Json::Null, Json::Null) => false,
        (Json::Bool(x), Json::Bool(y)) => x != y,
        (Json::Number(x), Json::Number(y)) => !numbers_equal(x, y),
        (Json::String(x), Json::String(y)) => x != y,
        (Json::Array(xs), Json::Array(ys)) => {
            for (i, (x, y)) in xs.iter().zip(ys).enumerate() {
                let len = path.len();
                path_push_index(path, i);
                if differ(x, y, path) {
                    return true;
                }
                path.truncate(len);
            }
            if xs.len() == ys.len() {
                return false;
            }
            path_push_index(path, xs.len().min(ys.len()));
            true
        }
        (Json::Object(xs), Json::Object(ys)) => {
            let (xs, ys) = (sorted(xs), sorted(ys));
            let (mut i, mut j) = (0, 0);
            loop {
                let (key, both) = match (xs.get(i), ys.get(j)) {
                    (None, None) => return false,
                    (Some((key, _)), None) | (None, Some((key, _))) => (key, None),
                    (Some((kx, x)), Some((ky, y))) => match key_order(kx, ky) {
                        Ordering::Less => (kx, None),
                        Ordering::Greater => (ky, None),
                        Ordering::Equal => (kx, Some((x, y))),
                    },
                };
                let len = path.len();
                path_push_key(path, key);
                let Some((x, y)) = both else { return true };
                if differ(x, y, path) {
                    return true;
                }
                path.truncate(len);
                (i, j) = (i + 1, j + 1);
            }
        }
        _ => true,
    }
}

fn sorted(members: &[(String, Json)]) -> Vec<&(String, Json)> {
    let mut sorted: Vec<_> = members.iter().collect();
    sorted.sort_unstable_by(|a, b| key_order(&a.0, &b.0));
    sorted
}

/// Numbers are equal when their canonical texts are; numbers beyond the double
/// range have none and are equal only when written alike.
fn numbers_equal(x: &Number, y: &Number) -> bool {
    if x.as_str() == y.as_str() {
        return true;
    }
    let (mut cx, mut cy) = (Vec::new(), Vec::new());
    write_number(x, &mut cx).is_ok() && write_number(y, &mut cy).is_ok() && cx == cy
}
