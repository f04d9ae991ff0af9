//! Canonical JSON, the strict parser and first-difference paths: examples and properties.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use expect_test::{expect, Expect};
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use retrace_core::canonical::{canonical_value, canonicalize, decodes_to_itself, to_canonical, CanonError};
use retrace_core::json::{parse, path_push_index, path_push_key, Json, Number};
use retrace_core::json_diff::{first_difference, first_difference_bytes};
use serde_json::Value;

/// Canonicalizes each input and prints `input -> output` (or the error) per line.
fn check<'a>(inputs: impl IntoIterator<Item = &'a str>, expect: Expect) {
    let mut actual = String::new();
    for input in inputs {
        let output = match canonicalize(input.as_bytes()) {
            Ok(bytes) => String::from_utf8(bytes).unwrap(),
            Err(e) => format!("error: {e}"),
        };
        writeln!(actual, "{input} -> {output}").unwrap();
    }
    expect.assert_eq(&actual);
}

#[test]
fn rfc8785_sample() {
    let input = r#"{
      "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
      "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
      "literals": [null, true, false]
    }"#;
    let output = canonicalize(input.as_bytes()).unwrap();
    let rfc = r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#;
    assert_eq!(String::from_utf8(output).unwrap(), rfc);
}

#[test]
fn key_order_is_utf16() {
    check(
        [
            r#"{"\u20ac":"Euro","\r":"CR","\ufb33":"Dalet","1":"One","\ud83d\ude00":"Emoji","\u0080":"Control","\u00f6":"o"}"#,
            r#"{"\uFFA5":1,"\ud842\udfb7":2}"#,
            r#"{"b":1,"a":{"d":[],"c":{}},"":0,"aa":2}"#,
        ],
        expect![[r#"
            {"\u20ac":"Euro","\r":"CR","\ufb33":"Dalet","1":"One","\ud83d\ude00":"Emoji","\u0080":"Control","\u00f6":"o"} -> {"\r":"CR","1":"One","":"Control","ö":"o","€":"Euro","😀":"Emoji","דּ":"Dalet"}
            {"\uFFA5":1,"\ud842\udfb7":2} -> {"𠮷":2,"ﾥ":1}
            {"b":1,"a":{"d":[],"c":{}},"":0,"aa":2} -> {"":0,"a":{"c":{},"d":[]},"aa":2,"b":1}
        "#]],
    );
}

#[test]
fn numbers() {
    let inputs = "1.0 1.50 -0 -0.0 0e0 1e21 1e20 1e-6 1e-7 5e-324 1e-400 -1.5E+3 0.1 123456789.123456789
        18446744073709551617 -18446744073709551617 9007199254740993 9007199254740992
        100000000000000000000000 1e23";
    check(
        inputs.split_whitespace(),
        expect![[r#"
            1.0 -> 1
            1.50 -> 1.5
            -0 -> 0
            -0.0 -> 0
            0e0 -> 0
            1e21 -> 1e+21
            1e20 -> 100000000000000000000
            1e-6 -> 0.000001
            1e-7 -> 1e-7
            5e-324 -> 5e-324
            1e-400 -> 0
            -1.5E+3 -> -1500
            0.1 -> 0.1
            123456789.123456789 -> 123456789.12345679
            18446744073709551617 -> 18446744073709551617
            -18446744073709551617 -> -18446744073709551617
            9007199254740993 -> 9007199254740993
            9007199254740992 -> 9007199254740992
            100000000000000000000000 -> 100000000000000000000000
            1e23 -> 1e+23
        "#]],
    );
}

#[test]
fn strings() {
    let input = r#""\u0000\u0008\u0009\u000A\u000C\u000D\u001F\u007F \/ \" \\ é 😀""#;
    check(
        [input, r#""""#],
        expect![[r#"
            "\u0000\u0008\u0009\u000A\u000C\u000D\u001F\u007F \/ \" \\ é 😀" -> "\u0000\b\t\n\f\r\u001f / \" \\ é 😀"
            "" -> ""
        "#]],
    );
}

#[test]
fn errors() {
    let inputs = r#"{"a":[1,1e400]}
{"a":1,"b":{"c":2,"c":3}}
[{"x":[{"k":0,"k":1}]}]
[1,2,]
{"a":1,}
01
1.
[1] x

"\ud800"
"\udc00x"
"\x"
"abc
{1:2}
NaN"#;
    check(
        inputs.lines(),
        expect![[r#"
            {"a":[1,1e400]} -> error: number at $.a[1] is out of the range of a double
            {"a":1,"b":{"c":2,"c":3}} -> error: invalid json at byte 18: duplicate key "c" at $.b.c
            [{"x":[{"k":0,"k":1}]}] -> error: invalid json at byte 14: duplicate key "k" at $[0].x[0].k
            [1,2,] -> error: invalid json at byte 5: expected a value
            {"a":1,} -> error: invalid json at byte 7: expected a string key
            01 -> error: invalid json at byte 0: leading zero in number
            1. -> error: invalid json at byte 2: expected a digit after '.'
            [1] x -> error: invalid json at byte 4: trailing characters
             -> error: invalid json at byte 0: unexpected end of input
            "\ud800" -> error: invalid json at byte 1: lone surrogate in \u escape
            "\udc00x" -> error: invalid json at byte 1: lone surrogate in \u escape
            "\x" -> error: invalid json at byte 1: invalid escape
            "abc -> error: invalid json at byte 4: unexpected end of input
            {1:2} -> error: invalid json at byte 1: expected a string key
            NaN -> error: invalid json at byte 0: expected a value
        "#]],
    );
    let error = |bytes: &[u8]| canonicalize(bytes).unwrap_err().to_string();
    expect!["invalid json at byte 3: invalid utf-8"].assert_eq(&error(b"[\"a\xff\"]"));
    expect!["invalid json at byte 2: control character in string"].assert_eq(&error(b"\"a\tb\""));
}

#[test]
fn limits() {
    let arrays = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let objects = |depth: usize| format!("{}0{}", r#"{"a":"#.repeat(depth), "}".repeat(depth));
    assert!(canonicalize(arrays(512).as_bytes()).is_ok());
    assert!(canonicalize(objects(512).as_bytes()).is_ok());
    let error = |text: String| canonicalize(text.as_bytes()).unwrap_err().to_string();
    expect!["invalid json at byte 512: nesting deeper than 512"].assert_eq(&error(arrays(513)));
    let wide: Vec<String> = (0..40).chain([7]).map(|i| format!(r#""k{i}":{i}"#)).collect();
    let wide = format!(r#"{{"x":[{{{}}}]}}"#, wide.join(","));
    expect![[r#"invalid json at byte 347: duplicate key "k7" at $.x[0].k7"#]].assert_eq(&error(wide));
}

#[test]
fn hand_built_duplicate_key_is_refused() {
    let one = || Json::Number(Number::new("1").unwrap());
    let j =
        Json::Array(vec![Json::Object(vec![("b".into(), one()), ("a".into(), one()), ("b".into(), one())])]);
    expect!["duplicate key at $[0].b"].assert_eq(&to_canonical(&j).unwrap_err().to_string());
}

#[test]
fn json_accessors() {
    let mut j = parse(br#"{"model":"m","n":-7,"big":18446744073709551617,"f":2.5}"#).unwrap();
    assert_eq!(j.get("model").and_then(Json::as_str), Some("m"));
    let value = j.to_value();
    expect![[r#"{"big":1.8446744073709552e+19,"f":2.5,"model":"m","n":-7}"#]].assert_eq(&value.to_string());
    assert_eq!(j.remove_key("model"), Some(Json::String("m".into())));
    assert_eq!(j.get("model"), None);
    let Some(Json::Number(n)) = j.get("n") else { panic!("not a number") };
    assert_eq!((n.as_i64(), n.as_u64(), n.as_f64(), n.is_integer()), (Some(-7), None, -7.0, true));
    let mut path = String::from("$");
    path_push_key(&mut path, "messages");
    path_push_index(&mut path, 3);
    path_push_key(&mut path, "a key");
    path_push_key(&mut path, "$ref");
    assert_eq!(path, r#"$.messages[3]["a key"].$ref"#);
}

#[test]
fn first_differences() {
    let cases = r#"{"a":1,"b":[1,2]} | {"b":[1,2],"a":1.0}
{"messages":[{"content":"hi"},{"content":"yo"}]} | {"messages":[{"content":"hi"},{"content":"no"}]}
{"a":[1,2]} | {"a":[1,2,3]}
{"a":1,"c":1} | {"a":1,"b":1,"c":2}
{"x":{"y":1}} | {"x":[1]}
{"a key":9007199254740993} | {"a key":9007199254740992}
{"a":1} | {"a":1
1 | [1]"#;
    let mut actual = String::new();
    for (a, b) in cases.lines().map(|line| line.split_once(" | ").unwrap()) {
        let path = first_difference_bytes(a.as_bytes(), b.as_bytes());
        writeln!(actual, "{a} | {b} -> {}", path.as_deref().unwrap_or("equal")).unwrap();
    }
    expect![[r#"
        {"a":1,"b":[1,2]} | {"b":[1,2],"a":1.0} -> equal
        {"messages":[{"content":"hi"},{"content":"yo"}]} | {"messages":[{"content":"hi"},{"content":"no"}]} -> $.messages[1].content
        {"a":[1,2]} | {"a":[1,2,3]} -> $.a[2]
        {"a":1,"c":1} | {"a":1,"b":1,"c":2} -> $.b
        {"x":{"y":1}} | {"x":[1]} -> $.x
        {"a key":9007199254740993} | {"a key":9007199254740992} -> $["a key"]
        {"a":1} | {"a":1 -> $
        1 | [1] -> $
    "#]].assert_eq(&actual);
}

#[test]
fn micro_check_typical_request() {
    let request = format!(
        r#"{{"model":"gpt-4o-mini","temperature":0.2,"max_tokens":1024,"stream":false,
        "messages":[{{"role":"system","content":"You are a planner.\nBe brief."}},
        {{"role":"user","content":"{}"}}],
        "tools":[{{"type":"function","function":{{"name":"search","description":"Search the web",
        "parameters":{{"type":"object","properties":{{"query":{{"type":"string"}},"limit":{{"type":"integer","maximum":50}}}},
        "required":["query"]}}}}}}],"seed":18446744073709551615,"metadata":{{"run":"r-1","step":7}}}}"#,
        "Find flights from Lisbon to Tallinn in May; prefer morning departures. ".repeat(9)
    );
    assert!((1000..1400).contains(&request.len()));
    let canonical = canonicalize(request.as_bytes()).unwrap();
    assert_eq!(canonicalize(&canonical).unwrap(), canonical);
    let value: Value = serde_json::from_str(&request).unwrap();
    assert_eq!(canonical_value(&value).unwrap(), canonical);
    assert_eq!(first_difference_bytes(request.as_bytes(), &canonical), None);
    assert!(canonical
        .starts_with(br#"{"max_tokens":1024,"messages":[{"content":"You are a planner.\nBe brief.""#));
}

// ---- properties ----

fn arb_integer() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        "-?(0|[1-9][0-9]{15,40})",
    ]
}

fn arb_number() -> impl Strategy<Value = String> {
    prop_oneof![
        arb_integer(),
        "-?(0|[1-9][0-9]{0,5})(\\.[0-9]{1,6})?([eE][+-]?[0-9]{1,2})?",
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| format!("{f:e}")),
    ]
}

fn arb_string() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{0,3}",
        "[\\x00-\\x7f\\u{e000}-\\u{ffff}\\u{10000}-\\u{10ffff}]{0,3}",
        vec(any::<char>(), 0..6).prop_map(String::from_iter),
    ]
}

fn arb_json() -> impl Strategy<Value = Json> {
    let leaf = prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        arb_number().prop_map(|s| Json::Number(Number::new(&s).unwrap())),
        arb_string().prop_map(Json::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Json::Array),
            btree_map(arb_string(), inner, 0..6).prop_map(|m| Json::Object(m.into_iter().collect())),
        ]
    })
}

fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", serde_json::Number::from_f64).prop_map(Value::Number),
        arb_string().prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 32, 5, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..5).prop_map(Value::Array),
            btree_map(arb_string(), inner, 0..5).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Writes JSON text with random whitespace, shuffled members and random `\u` escapes.
struct Messy(u64);

impl Messy {
    fn next(&mut self) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 as usize
    }

    fn text(seed: u64, j: &Json) -> String {
        let mut out = String::new();
        Messy(seed | 1).write(j, &mut out);
        out
    }

    fn ws(&mut self, out: &mut String) {
        for _ in 0..self.next() % 3 {
            out.push([' ', '\t', '\n', '\r'][self.next() % 4]);
        }
    }

    fn write(&mut self, j: &Json, out: &mut String) {
        self.ws(out);
        match j {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(n) => out.push_str(n.as_str()),
            Json::String(s) => self.string(s, out),
            Json::Array(items) => self.items('[', items.iter().map(|v| (None, v)).collect(), out),
            Json::Object(members) => {
                let mut members: Vec<_> = members.iter().map(|(k, v)| (Some(k), v)).collect();
                for i in (1..members.len()).rev() {
                    members.swap(i, self.next() % (i + 1));
                }
                self.items('{', members, out);
            }
        }
        self.ws(out);
    }

    fn items(&mut self, open: char, items: Vec<(Option<&String>, &Json)>, out: &mut String) {
        out.push(open);
        for (i, (key, value)) in items.into_iter().enumerate() {
            out.push_str(if i > 0 { "," } else { "" });
            if let Some(key) = key {
                self.ws(out);
                self.string(key, out);
                self.ws(out);
                out.push(':');
            }
            self.write(value, out);
        }
        self.ws(out);
        out.push(if open == '[' { ']' } else { '}' });
    }

    fn string(&mut self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            if c < ' ' || c == '"' || c == '\\' || self.next() & 3 == 0 {
                for unit in c.encode_utf16(&mut [0; 2]) {
                    write!(out, "\\u{unit:04X}").unwrap();
                }
            } else {
                out.push(c);
            }
        }
        out.push('"');
    }
}

fn integers<'a>(j: &'a mut Json, out: &mut Vec<&'a mut Number>) {
    match j {
        Json::Number(n) if n.is_integer() => out.push(n),
        Json::Array(items) => items.iter_mut().for_each(|item| integers(item, out)),
        Json::Object(members) => members.iter_mut().for_each(|(_, v)| integers(v, out)),
        _ => {}
    }
}

fn nth_node<'a>(j: &'a mut Json, n: &mut usize) -> Option<&'a mut Json> {
    if *n == 0 {
        return Some(j);
    }
    *n -= 1;
    match j {
        Json::Array(items) => items.iter_mut().find_map(|item| nth_node(item, n)),
        Json::Object(members) => members.iter_mut().find_map(|(_, v)| nth_node(v, n)),
        _ => None,
    }
}

/// The canonical bytes of every node, by path.
fn nodes(j: &Json, path: &mut String, out: &mut BTreeMap<String, Vec<u8>>) {
    out.insert(path.clone(), to_canonical(j).unwrap());
    let len = path.len();
    match j {
        Json::Array(items) => items.iter().enumerate().for_each(|(i, item)| {
            path_push_index(path, i);
            nodes(item, path, out);
            path.truncate(len);
        }),
        Json::Object(members) => members.iter().for_each(|(key, value)| {
            path_push_key(path, key);
            nodes(value, path, out);
            path.truncate(len);
        }),
        _ => {}
    }
}

#[test]
fn a_double_does_not_decode_to_itself_and_an_integer_does() {
    let v = serde_json::json!({"a": [1, {"b": 1.0}], "c": -0.0});
    assert!(!decodes_to_itself(&v));
    let decoded: Value = serde_json::from_slice(&canonical_value(&v).unwrap()).unwrap();
    assert_eq!(decoded, serde_json::json!({"a": [1, {"b": 1}], "c": 0}));
    assert_ne!(decoded, v);
    assert!(decodes_to_itself(&serde_json::json!({"a": [1, -2, "1.0", null, {"b": u64::MAX}]})));
    let fractions = serde_json::json!({"a": [0.25, -1.5, 1e-7, 0.1, 123456.789], "b": 5e-324});
    assert!(decodes_to_itself(&fractions), "a double with a fraction decodes to itself");
    let decoded: Value = serde_json::from_slice(&canonical_value(&fractions).unwrap()).unwrap();
    assert_eq!(decoded, fractions);
}

proptest! {
    #[test]
    fn stable_under_reordering_and_whitespace(j in arb_json(), seed in any::<u64>()) {
        let canonical = to_canonical(&j).unwrap();
        prop_assert_eq!(&canonicalize(Messy::text(seed, &j).as_bytes()).unwrap(), &canonical);
        prop_assert_eq!(&canonicalize(Messy::text(seed ^ 0x9e37, &j).as_bytes()).unwrap(), &canonical);
    }

    #[test]
    fn keys_sort_by_utf16_code_units(a in arb_string(), b in arb_string()) {
        let object = Json::Object(vec![(a.clone(), Json::Null), (b.clone(), Json::Null)]);
        let canonical = to_canonical(&object);
        if a == b {
            let refused = matches!(canonical, Err(CanonError::DuplicateKey { .. }));
            prop_assert!(refused, "duplicate key accepted");
            return Ok(());
        }
        let Json::Object(sorted) = parse(&canonical.unwrap()).unwrap() else { unreachable!() };
        let a_first = a.encode_utf16().le(b.encode_utf16());
        prop_assert_eq!(&sorted[0].0, if a_first { &a } else { &b });
    }

    #[test]
    fn idempotent(j in arb_json()) {
        let once = to_canonical(&j).unwrap();
        prop_assert_eq!(canonicalize(&once).unwrap(), once);
    }

    #[test]
    fn any_integer_digit_matters(j in arb_json(), int in arb_integer(), pick in any::<usize>(), delta in 1..10u8) {
        let mut j = Json::Array(vec![j, Json::Number(Number::new(&int).unwrap())]);
        let before = to_canonical(&j).unwrap();
        let mut ints = Vec::new();
        integers(&mut j, &mut ints);
        let count = ints.len();
        let n = &mut ints[pick % count];
        let mut text = n.as_str().as_bytes().to_vec();
        let digits = text.iter().filter(|b| b.is_ascii_digit()).count();
        let at = text.len() - digits + (pick / count) % digits;
        let old = text[at] - b'0';
        let mut new = (old + delta) % 10;
        if new == 0 && at + 1 < text.len() && !text[..at].iter().any(u8::is_ascii_digit) {
            new = old % 9 + 1; // no leading zero
        }
        text[at] = b'0' + new;
        **n = Number::new(std::str::from_utf8(&text).unwrap()).unwrap();
        prop_assert_ne!(to_canonical(&j).unwrap(), before);
    }

    /// Doubles of every magnitude, most of them with a fraction: each one that claims to decode
    /// to itself does, bit for bit.
    #[test]
    fn a_double_that_decodes_to_itself_does(bits in any::<u64>(), small in -1e6f64..1e6, tiny in -1e-6f64..1e-6) {
        for f in [f64::from_bits(bits), small, tiny] {
            let Some(n) = serde_json::Number::from_f64(f) else { continue };
            let v = Value::Number(n);
            let decoded: Value = serde_json::from_slice(&canonical_value(&v).unwrap()).unwrap();
            if decodes_to_itself(&v) {
                prop_assert_eq!(decoded.as_f64().map(f64::to_bits), Some(f.to_bits()));
                prop_assert_eq!(decoded, v);
            }
        }
    }

    #[test]
    fn value_agrees_with_text(v in arb_value()) {
        let canonical = canonical_value(&v).unwrap();
        prop_assert_eq!(&canonicalize(&serde_json::to_vec(&v).unwrap()).unwrap(), &canonical);
        prop_assert_eq!(&to_canonical(&Json::from_value(&v)).unwrap(), &canonical);
    }

    /// What lets a recording hand the program its own value instead of decoding it again.
    #[test]
    fn a_value_that_decodes_to_itself_does(v in arb_value()) {
        let decoded: Value = serde_json::from_slice(&canonical_value(&v).unwrap()).unwrap();
        if decodes_to_itself(&v) {
            prop_assert_eq!(decoded, v);
        }
    }

    #[test]
    fn first_difference_matches_canonical_bytes(
        a in arb_json(), replacement in arb_json(), pick in any::<usize>(), mode in 0..4u8, seed in any::<u64>(),
    ) {
        let mut b = a.clone();
        let mut n = pick % 64;
        if let Some(node) = nth_node(&mut b, &mut n) {
            match (mode, &*node) {
                (0, _) => {}
                (1, Json::Number(x)) if x.as_i64().is_some_and(|i| i.unsigned_abs() < 1 << 53) => {
                    *node = Json::Number(Number::new(&format!("{}.0e0", x.as_str())).unwrap());
                }
                _ => *node = replacement,
            }
        }
        let b = parse(Messy::text(seed, &b).as_bytes()).unwrap();
        let equal = to_canonical(&a).unwrap() == to_canonical(&b).unwrap();
        let difference = first_difference(&a, &b);
        prop_assert_eq!(difference.is_none(), equal);
        if let Some(path) = difference {
            let (mut in_a, mut in_b) = (BTreeMap::new(), BTreeMap::new());
            nodes(&a, &mut String::from("$"), &mut in_a);
            nodes(&b, &mut String::from("$"), &mut in_b);
            prop_assert!(in_a.contains_key(&path) || in_b.contains_key(&path), "{path} is nowhere");
            prop_assert_ne!(in_a.get(&path), in_b.get(&path), "{} is the same on both sides", path);
        }
    }
}

proptest! {
    /// Strings escape as serde_json (and JSON.stringify) escape them, wherever the characters
    /// that need escaping fall relative to the eight-byte steps of the writer's scan.
    #[test]
    fn strings_escape_like_serde_json(s in "[\\x00-\\x21\"\\\\/a-z\u{7f}\u{e9}\u{2028}\u{1F600}]{0,40}") {
        let ours = canonical_value(&Value::String(s.clone())).unwrap();
        prop_assert_eq!(String::from_utf8(ours).unwrap(), serde_json::to_string(&s).unwrap());
    }
}
