//! The replay hygiene report: when a step's request differs from the recorded one, what kind of
//! input the program probably read without Retrace (issue 8, item 3).
//!
//! Pure heuristics over the two requests (the recorded one and the one the replay asked for),
//! the process environment, the outputs the recording holds and the recorded model snapshot.
//! [`diagnose`] walks both JSON documents to their first differing leaf (or array), trims the
//! common prefix and suffix of two differing strings, widens what is left to whole tokens and
//! asks, in order:
//! 1. **unordered map iteration**: an array, or a string's list of items, holds the same
//!    multiset in another order (a `set` or `dict` iterated in hash order);
//! 2. **an env var**: the replayed token is the value of one of this process's variables (a
//!    decimal such as `0.9` counts when it is the whole value);
//! 3. **a clock read**: both tokens look like times (ISO dates, `hh:mm:ss`, epoch seconds or
//!    milliseconds);
//! 4. **a random id**: both look like ids (UUIDs, ULIDs, runs of hex digits);
//! 5. **a request parameter**: a model call differs outside what the model reads as text (the
//!    conversation, system prompt, tools, model), e.g. `temperature`;
//! 6. **a tool not wrapped**: a model call's prompt differs in data that no recorded step
//!    produced (a file, a database, a service read directly); unless the recorded call's prompt
//!    came from a template (`template()`) whose text has changed since (its file's digest is
//!    not the recorded one): then **a changed prompt template**;
//! 7. **a model called by alias**: a model call whose recorded event has no snapshot, as a
//!    second hint beside another one, or alone when the model named is what differs (the alias
//!    may resolve to another model when re-recorded).
use retrace_core::Digest;
use serde_json::Value;

/// What the heuristics look at.
#[derive(Debug)]
pub struct Evidence<'a> {
    /// The step is a model call (prompt data and model aliases matter only there).
    pub model_call: bool,
    /// The recorded request.
    pub expected: &'a Value,
    /// The request the replay asked for.
    pub got: &'a Value,
    /// For a model call: whether the recorded event names the model's snapshot.
    pub snapshot_pinned: Option<bool>,
    /// This process's environment (the replayed program inherited it).
    pub env: &'a [(String, String)],
    /// The recorded outputs of the run's steps, as text (what wrapped reads produced).
    pub recorded_outputs: &'a [String],
    /// For a model call made from a prompt template: its id, the recorded digest of its text,
    /// and the digest of its file now (None when the file can't be read).
    pub template: Option<(&'a str, Digest, Option<Digest>)>,
}

/// The kind of input that was probably not captured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cause {
    /// A collection iterated in hash order.
    MapOrder,
    /// An environment variable, by name.
    EnvVar(String),
    /// The wall clock.
    Clock,
    /// A random id.
    RandomId,
    /// A read (file, database, service) not wrapped in a tool.
    ToolNotWrapped,
    /// A model named by alias, with no pinned snapshot.
    ModelAlias,
    /// A model request differs in a parameter the model doesn't read as text (`temperature`,
    /// `max_tokens`...), from no source the heuristics recognise.
    Parameter,
    /// The text of the prompt template, by id, changed since the recording (recorded digest,
    /// digest now).
    PromptTemplate(String, Digest, Digest),
}

/// A parameter's value as JSON shows it: a number, `true`, `false` or `null` bare (QA17 S4:
/// `max_tokens was "10"`), anything else quoted.
fn as_value(v: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(v) {
        Ok(serde_json::Value::Number(_) | serde_json::Value::Bool(_) | serde_json::Value::Null) => {
            v.to_owned()
        }
        _ => format!("{v:?}"),
    }
}

/// One hint: the likely cause and where the requests differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hint {
    /// The likely cause.
    pub cause: Cause,
    /// The JSON path where the requests differ.
    pub path: String,
    /// The recorded value there (the differing token, cut to 60 characters).
    pub expected: String,
    /// The replayed value there.
    pub got: String,
}

impl Hint {
    /// The stable name of the cause: `clock`, `random_id`, `env`, `map_order`, `tool`, `model_alias`,
    /// `prompt_template`.
    pub fn kind(&self) -> &'static str {
        match self.cause {
            Cause::MapOrder => "map_order",
            Cause::EnvVar(_) => "env",
            Cause::Clock => "clock",
            Cause::RandomId => "random_id",
            Cause::ToolNotWrapped => "tool",
            Cause::ModelAlias => "model_alias",
            Cause::Parameter => "parameter",
            Cause::PromptTemplate(..) => "prompt_template",
        }
    }

    /// One line for a person: the likely cause, the evidence, and what to do.
    pub fn message(&self) -> String {
        let (e, g, p) = (&self.expected, &self.got, &self.path);
        match &self.cause {
            Cause::MapOrder => format!(
                "probably unordered map iteration: at {p} the same items come in another order ({e} / {g}); \
                 sort them, or iterate a list instead of a set or dict"
            ),
            Cause::EnvVar(name) => format!(
                "probably an env var read without the SDK: at {p} {e:?} became {g:?}, the value of ${name} \
                 here; read it with agent.env({name:?}) so replay hands back the recorded value"
            ),
            Cause::Clock => format!(
                "probably a clock read without the SDK: at {p} {e:?} became {g:?}; read the time with \
                 agent.now() (Rust: now_ms()) so replay hands back the recorded time"
            ),
            Cause::RandomId => format!(
                "probably a random id made without the SDK: at {p} {e:?} became {g:?}; make it with \
                 agent.random_id() so replay hands back the recorded id"
            ),
            Cause::ToolNotWrapped => format!(
                "probably a tool not wrapped: the prompt differs at {p} ({e:?} / {g:?}) in data no recorded \
                 step produced; wrap the read that supplies it in agent.tool(...), or, if the prompt changed \
                 on purpose, re-record with `retrace gate --accept`"
            ),
            Cause::PromptTemplate(id, recorded, now) => format!(
                "the text of prompt template {id} changed since the recording (recorded {}, now {}): the \
                 prompt differs at {p} ({e:?} / {g:?}); if it changed on purpose, re-record with \
                 `retrace gate --accept`, else restore the template's text",
                recorded.short(),
                now.short()
            ),
            Cause::Parameter => format!(
                "a request parameter differs: {p} was {}, now {}; if the program reads it from the \
                 environment or a config file, read that through the SDK (agent.env(...), agent.tool(...)) \
                 so replay hands back the recorded value, or, if it changed on purpose, re-record",
                as_value(e),
                as_value(g)
            ),
            Cause::ModelAlias => format!(
                "the model is called by alias with no pinned snapshot (the recording has none): {e:?}; \
                 pin a dated snapshot so a re-recording asks the same model"
            ),
        }
    }
}

/// The likely causes, most likely first; empty when nothing looks familiar.
pub fn diagnose(evidence: &Evidence<'_>) -> Vec<Hint> {
    let mut hints = Vec::new();
    if let Some(diff) = first_difference(evidence.expected, evidence.got, "$".to_owned()) {
        if let Some(mut cause) = classify(&diff, evidence) {
            if let (Cause::ToolNotWrapped, Some((id, recorded, Some(now)))) = (&cause, evidence.template) {
                if recorded != now {
                    cause = Cause::PromptTemplate(id.to_owned(), recorded, now);
                }
            }
            hints.push(Hint { cause, path: diff.path.clone(), expected: cut(&diff.a), got: cut(&diff.b) });
        }
    }
    // An alias is never the cause of a differing prompt: said beside another hint (a
    // re-recording may also ask another model), or when the model named is what differs.
    let at_model = first_difference(evidence.expected, evidence.got, "$".to_owned())
        .is_some_and(|d| d.path == "$.model");
    if evidence.model_call && evidence.snapshot_pinned == Some(false) && (!hints.is_empty() || at_model) {
        let model = evidence.expected.get("model").and_then(Value::as_str).unwrap_or("(unnamed)");
        hints.push(Hint {
            cause: Cause::ModelAlias,
            path: "$.model".into(),
            expected: model.to_owned(),
            got: evidence.got.get("model").and_then(Value::as_str).unwrap_or("").to_owned(),
        });
    }
    hints
}

/// Where and how two requests first differ.
#[derive(Debug)]
struct Difference {
    path: String,
    /// The differing tokens (strings widened to whole tokens; numbers as written).
    a: String,
    b: String,
    /// The two differ only in order (arrays, or lists inside a string).
    reordered: bool,
}

fn first_difference(a: &Value, b: &Value, path: String) -> Option<Difference> {
    match (a, b) {
        _ if a == b => None,
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                let (va, vb) = (x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null));
                first_difference(va, vb, format!("{path}.{k}"))
            })
        }
        (Value::Array(x), Value::Array(y)) => {
            if x.len() == y.len()
                && same_multiset(x.iter().map(Value::to_string), y.iter().map(Value::to_string))
            {
                return Some(Difference { path, a: a.to_string(), b: b.to_string(), reordered: true });
            }
            let at = x.iter().zip(y).position(|(p, q)| p != q).unwrap_or(x.len().min(y.len()));
            match (x.get(at), y.get(at)) {
                (Some(p), Some(q)) => first_difference(p, q, format!("{path}[{at}]")),
                _ => Some(leaf(format!("{path}[{at}]"), x.get(at), y.get(at))),
            }
        }
        (Value::String(x), Value::String(y)) => Some(strings(path, x, y)),
        _ => Some(leaf(path, Some(a), Some(b))),
    }
}

fn leaf(path: String, a: Option<&Value>, b: Option<&Value>) -> Difference {
    let text = |v: Option<&Value>| match v {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => String::new(),
    };
    Difference { path, a: text(a), b: text(b), reordered: false }
}

/// Two differing strings: the same items in another order, or the differing tokens.
fn strings(path: String, x: &str, y: &str) -> Difference {
    let separator = |c: char| matches!(c, ',' | ';' | '\n' | '|');
    let items = |s: &[char]| -> Vec<String> {
        let s: String = s.iter().collect();
        s.split(separator).map(|t| t.trim().to_owned()).collect()
    };
    // The common head and tail, each cut back to a separator or space so no item is split.
    let (xc, yc): (Vec<char>, Vec<char>) = (x.chars().collect(), y.chars().collect());
    let boundary = |c: &char| separator(*c) || c.is_whitespace() || *c == ':';
    let mut head = xc.iter().zip(&yc).take_while(|(p, q)| p == q).count();
    while head > 0 && !boundary(&xc[head - 1]) {
        head -= 1;
    }
    let max_tail = xc.len().min(yc.len()) - head;
    let mut tail = xc.iter().rev().zip(yc.iter().rev()).take(max_tail).take_while(|(p, q)| p == q).count();
    while tail > 0 && !boundary(&xc[xc.len() - tail]) {
        tail -= 1;
    }
    let (ix, iy) = (items(&xc[head..xc.len() - tail]), items(&yc[head..yc.len() - tail]));
    if ix.len() > 1 && same_multiset(ix.into_iter(), iy.into_iter()) {
        return Difference { path, a: x.to_owned(), b: y.to_owned(), reordered: true };
    }
    let (a, b) = differing_tokens(x, y);
    Difference { path, a, b, reordered: false }
}

fn same_multiset(a: impl Iterator<Item = String>, b: impl Iterator<Item = String>) -> bool {
    let (mut a, mut b): (Vec<String>, Vec<String>) = (a.collect(), b.collect());
    a.sort_unstable();
    b.sort_unstable();
    a == b
}

/// Characters that belong to one token: ids, times, paths, host names.
fn token_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '/' | '+' | '@')
}

/// The tokens around the first place `x` and `y` differ.
fn differing_tokens(x: &str, y: &str) -> (String, String) {
    let (xc, yc): (Vec<char>, Vec<char>) = (x.chars().collect(), y.chars().collect());
    let prefix = xc.iter().zip(&yc).take_while(|(p, q)| p == q).count();
    let max_suffix = xc.len().min(yc.len()) - prefix;
    let suffix = xc.iter().rev().zip(yc.iter().rev()).take(max_suffix).take_while(|(p, q)| p == q).count();
    let widen = |s: &[char], end: usize| -> String {
        let mut start = prefix;
        while start > 0 && token_char(s[start - 1]) {
            start -= 1;
        }
        let mut stop = end;
        while stop < s.len() && token_char(s[stop]) {
            stop += 1;
        }
        let token: String = s[start..stop].iter().collect();
        token.trim_end_matches(['.', ':']).to_owned()
    };
    (widen(&xc, xc.len() - suffix), widen(&yc, yc.len() - suffix))
}

fn classify(d: &Difference, e: &Evidence<'_>) -> Option<Cause> {
    if d.reordered {
        return Some(Cause::MapOrder);
    }
    if let Some(name) = env_var(&d.b, e.env) {
        return Some(Cause::EnvVar(name));
    }
    if looks_like_time(&d.a) && looks_like_time(&d.b) {
        return Some(Cause::Clock);
    }
    if looks_like_id(&d.a) && looks_like_id(&d.b) {
        return Some(Cause::RandomId);
    }
    if e.model_call && !in_prompt(&d.path) {
        return Some(Cause::Parameter);
    }
    let produced = |t: &str| !t.is_empty() && e.recorded_outputs.iter().any(|o| o.contains(t));
    if e.model_call && !d.a.is_empty() && !d.b.is_empty() && !produced(&d.a) && !produced(&d.b) {
        return Some(Cause::ToolNotWrapped);
    }
    None
}

/// Whether `path` of a model request lies in what the model reads (the conversation, the
/// system prompt, the tools it may call), not in a sampling or other request parameter.
fn in_prompt(path: &str) -> bool {
    let top = path.trim_start_matches("$.").split(['.', '[']).next().unwrap_or("");
    matches!(
        top,
        "messages" | "input" | "system" | "prompt" | "instructions" | "tools" | "functions" | "model"
    )
}

/// The variable whose value the replayed token is (or holds, for values of 4+ characters).
fn env_var(token: &str, env: &[(String, String)]) -> Option<String> {
    let trivial = |v: &str| v.len() < 4 || v.chars().all(|c| c.is_ascii_digit());
    // A decimal such as a temperature read from the environment ("0.9") is short, but not so
    // common that any "0.9" would be taken for it: it counts when it is the whole value.
    let decimal = |v: &str| v.contains('.') && v.parse::<f64>().is_ok();
    let same_number = |v: &str| decimal(v) && token.parse::<f64>().ok() == v.parse::<f64>().ok();
    env.iter()
        .find(|(_, v)| {
            (!trivial(v) && (token == v || (v.len() >= 6 && token.contains(v.as_str())))) || same_number(v)
        })
        .map(|(k, _)| k.clone())
}

/// An ISO date, a `hh:mm:ss` time, or a number of epoch seconds (2001–2286) or milliseconds.
fn looks_like_time(t: &str) -> bool {
    let c: Vec<char> = t.chars().collect();
    let digits = |s: &[char]| s.iter().all(char::is_ascii_digit);
    let iso_date = c
        .windows(10)
        .any(|w| digits(&w[0..4]) && w[4] == '-' && digits(&w[5..7]) && w[7] == '-' && digits(&w[8..10]));
    let clock = c
        .windows(8)
        .any(|w| digits(&w[0..2]) && w[2] == ':' && digits(&w[3..5]) && w[5] == ':' && digits(&w[6..8]));
    let whole = t.split('.').next().unwrap_or("");
    let epoch = !whole.is_empty()
        && whole.chars().all(|ch| ch.is_ascii_digit())
        && t.chars().filter(|&ch| ch == '.').count() <= 1
        && t.chars().all(|ch| ch.is_ascii_digit() || ch == '.')
        && matches!(whole.len(), 10 | 13 | 16);
    iso_date || clock || epoch
}

/// A UUID, a ULID, or a run of 8+ hex digits with a letter and a digit (after any prefix such
/// as `req_`).
fn looks_like_id(t: &str) -> bool {
    let hex = |c: char| c.is_ascii_hexdigit();
    let parts: Vec<&str> = t.split('-').collect();
    let uuid = parts.len() == 5
        && parts.iter().map(|p| p.len()).eq([8, 4, 4, 4, 12])
        && parts.iter().all(|p| p.chars().all(hex));
    let ulid = t.len() == 26 && t.chars().all(|c| c.is_ascii_digit() || c.is_ascii_uppercase());
    let longest_hex_run = t
        .split(|c: char| !hex(c))
        .filter(|run| run.len() >= 8)
        .any(|run| run.chars().any(|c| c.is_ascii_digit()) && run.chars().any(|c| c.is_ascii_alphabetic()));
    uuid || ulid || longest_hex_run
}

fn cut(text: &str) -> String {
    match text.chars().count() > 60 {
        true => format!("{}…", text.chars().take(59).collect::<String>()),
        false => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The first hint's kind and path for a model call whose prompt went from `a` to `b`.
    fn check(a: Value, b: Value, env: &[(&str, &str)], outputs: &[&str]) -> Option<(&'static str, String)> {
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let outputs: Vec<String> = outputs.iter().map(|s| s.to_string()).collect();
        let e = Evidence {
            model_call: true,
            expected: &a,
            got: &b,
            snapshot_pinned: Some(true),
            env: &env,
            recorded_outputs: &outputs,
            template: None,
        };
        diagnose(&e).first().map(|h| (h.kind(), h.path.clone()))
    }

    fn prompt(text: &str) -> Value {
        json!({"model": "gpt-4o", "messages": [{"role": "user", "content": text}]})
    }

    const CONTENT: &str = "$.messages[0].content";

    #[test]
    fn a_clock_read() {
        let iso = check(
            prompt("today is 2026-11-30T05:54:07Z, plan"),
            prompt("today is 2026-12-01T09:10:11Z, plan"),
            &[],
            &[],
        );
        assert_eq!(iso, Some(("clock", CONTENT.into())));
        let epoch = check(prompt("at 1732950000.25 go"), prompt("at 1732953611.5 go"), &[], &[]);
        assert_eq!(epoch, Some(("clock", CONTENT.into())));
        let number = check(json!({"ts": 1732950000123u64}), json!({"ts": 1732950999999u64}), &[], &[]);
        assert_eq!(number, Some(("clock", "$.ts".into())));
    }

    #[test]
    fn a_random_id() {
        let uuid = check(
            prompt("request 1b4e28ba-2fa1-11d2-883f-0016d3cca427 ok"),
            prompt("request 6fa459ea-ee8a-3ca4-894e-db77e160355e ok"),
            &[],
            &[],
        );
        assert_eq!(uuid, Some(("random_id", CONTENT.into())));
        let hex = check(json!({"id": "req_9f8e7d6c5b4a"}), json!({"id": "req_0a1b2c3d4e5f"}), &[], &[]);
        assert_eq!(hex, Some(("random_id", "$.id".into())));
    }

    #[test]
    fn an_env_var() {
        let env =
            check(prompt("hello alice, deploy"), prompt("hello runner, deploy"), &[("USER", "runner")], &[]);
        assert_eq!(env, Some(("env", CONTENT.into())));
        let hints = diagnose(&Evidence {
            model_call: false,
            expected: &json!({"home": "/home/alice"}),
            got: &json!({"home": "/home/runner"}),
            snapshot_pinned: None,
            env: &[("HOME".into(), "/home/runner".into())],
            recorded_outputs: &[],
            template: None,
        });
        assert_eq!(hints[0].cause, Cause::EnvVar("HOME".into()));
        assert!(hints[0].message().contains("agent.env(\"HOME\")"), "{}", hints[0].message());
    }

    #[test]
    fn unordered_map_iteration() {
        let array = check(
            json!({"tables": ["users", "orders", "items"]}),
            json!({"tables": ["items", "users", "orders"]}),
            &[],
            &[],
        );
        assert_eq!(array, Some(("map_order", "$.tables".into())));
        let joined =
            check(prompt("tables: users, orders, items"), prompt("tables: orders, items, users"), &[], &[]);
        assert_eq!(joined, Some(("map_order", CONTENT.into())));
    }

    #[test]
    fn a_tool_not_wrapped() {
        let unwrapped = check(
            prompt("the file says: alpha beta"),
            prompt("the file says: gamma beta"),
            &[],
            &["{\"rows\":3}"],
        );
        assert_eq!(unwrapped, Some(("tool", CONTENT.into())));
        // Data a recorded tool produced is not a missing tool: no hint.
        let wrapped =
            check(prompt("rows: 3 left"), prompt("rows: 4 left"), &[], &["{\"rows\": 3}", "rows: 4 left"]);
        assert_eq!(wrapped, None);
        // A changed tool argument is not a model prompt: no tool hint either.
        let tool = diagnose(&Evidence {
            model_call: false,
            expected: &json!({"q": "select 1"}),
            got: &json!({"q": "select 1 -- x"}),
            snapshot_pinned: None,
            env: &[],
            recorded_outputs: &[],
            template: None,
        });
        assert_eq!(tool, vec![]);
    }

    #[test]
    fn a_changed_prompt_template() {
        let (a, b) = (prompt("Write one sentence about tea."), prompt("Write TWO sentences about tea."));
        let (old, new) =
            (Digest::of(b"Write one sentence about {topic}."), Digest::of(b"Write TWO sentences"));
        let with = |now: Option<Digest>| {
            diagnose(&Evidence {
                model_call: true,
                expected: &a,
                got: &b,
                snapshot_pinned: Some(true),
                env: &[],
                recorded_outputs: &[],
                template: Some(("writer@v1", old, now)),
            })
        };
        let changed = with(Some(new));
        assert_eq!(changed[0].kind(), "prompt_template");
        let said = changed[0].message();
        assert!(said.contains("prompt template writer@v1 changed") && said.contains("--accept"), "{said}");
        // The template's text is as recorded (or unreadable): the difference came from elsewhere.
        assert_eq!(with(Some(old))[0].kind(), "tool");
        assert_eq!(with(None)[0].kind(), "tool");
    }

    #[test]
    fn a_model_alias_without_a_snapshot() {
        let (a, b) = (prompt("hi 2026-11-30T05:54:07"), prompt("hi 2026-11-30T06:00:00"));
        let hints = diagnose(&Evidence {
            model_call: true,
            expected: &a,
            got: &b,
            snapshot_pinned: Some(false),
            env: &[],
            recorded_outputs: &[],
            template: None,
        });
        let kinds: Vec<&str> = hints.iter().map(Hint::kind).collect();
        assert_eq!(kinds, ["clock", "model_alias"]);
        assert!(hints[1].message().contains("\"gpt-4o\""), "{}", hints[1].message());
    }

    #[test]
    fn a_parameter_and_a_decimal_from_the_environment() {
        let (a, b) = (json!({"model": "m", "temperature": 0.2}), json!({"model": "m", "temperature": 0.9}));
        assert_eq!(check(a.clone(), b.clone(), &[], &[]), Some(("parameter", "$.temperature".into())));
        assert_eq!(check(a, b, &[("TEMP", "0.9")], &[]), Some(("env", "$.temperature".into())));
        // A short whole number in the environment is too common to be taken for the source.
        let (a, b) = (json!({"model": "m", "n": 1}), json!({"model": "m", "n": 2}));
        assert_eq!(check(a, b, &[("SHLVL", "2")], &[]), Some(("parameter", "$.n".into())));
    }

    #[test]
    fn an_alias_alone_is_no_hint_for_a_changed_prompt() {
        let hints = diagnose(&Evidence {
            model_call: true,
            expected: &prompt("plan"),
            got: &prompt("planx"),
            snapshot_pinned: Some(false),
            env: &[],
            recorded_outputs: &["plan it".to_owned()],
            template: None,
        });
        assert_eq!(hints, vec![], "an unexplained prompt change is not blamed on the alias");
    }

    #[test]
    fn tokens_are_widened_around_the_difference() {
        assert_eq!(
            differing_tokens("at 2026-11-30T05:54:07Z.", "at 2026-11-30T06:10:11Z."),
            ("2026-11-30T05:54:07Z".into(), "2026-11-30T06:10:11Z".into())
        );
        assert_eq!(differing_tokens("user-bob!", "user-bill!"), ("user-bob".into(), "user-bill".into()));
    }
}
