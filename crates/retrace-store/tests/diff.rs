//! `retrace_store::diff`: alignment of forks and unrelated runs, same/changed/only, decisions
//! that moved, cost and savings; then two 100,000-event runs.
//!
//! Runs are written as one line per event (see [`parse`]) and committed to a [`MemoryStore`];
//! each check renders the [`RunDiff`] compactly and compares it with the expected text
//! (`UPDATE_EXPECT=1` rewrites it).
use expect_test::{expect, Expect};
use retrace_core::envelope::{Decision, Usage};
use retrace_core::run::{RunMeta, RunMode};
use retrace_core::{Digest, Event, EventType, Source};
use retrace_store::diff::{diff_runs, Counts, DiffOptions, RunDiff, Tokens};
use retrace_store::memory::MemoryStore;
use retrace_store::{Batch, BlobHint, BlobPut, EventStore, Store, StoreErrorKind};

/// One event per line: `AGENT TYPE[:NAME] KEY OUTPUT [@ORIGIN] [^PARENT] [?PROMPT] [rec|hit|dry]
/// [$IN/OUT/COST] [!ACTION:TARGET]`; OUTPUT `-` for none, else the output is `{"out":"OUTPUT"}`;
/// PROMPT makes the request `{"prompt":"PROMPT"}`.
fn parse(run: &str, first: u64, lines: &str) -> (Vec<Event>, Vec<BlobPut>) {
    let (mut events, mut blobs) = (Vec::new(), Vec::new());
    for (i, line) in lines.lines().map(str::trim).filter(|l| !l.is_empty()).enumerate() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let (kind, name) = words[1].split_once(':').map_or((words[1], None), |(k, n)| (k, Some(n)));
        let mut e = Event::new(run, words[0], kind.parse::<EventType>().unwrap());
        e.seq = first + i as u64;
        e.name = name.map(str::to_owned);
        e.key = Digest::of(words[2].as_bytes());
        if words[3] != "-" {
            let blob = BlobPut::new(format!(r#"{{"out":"{}"}}"#, words[3]).into_bytes(), BlobHint::Raw);
            (e.output_ref, e.output_hash) = (Some(blob.digest()), Some(blob.digest()));
            blobs.push(blob);
        }
        for word in &words[4..] {
            match word.split_at(1) {
                ("@", origin) => e.origin_seq = Some(origin.parse().unwrap()),
                ("^", parent) => e.causal_parent = Some(parent.parse().unwrap()),
                ("?", prompt) => {
                    let blob =
                        BlobPut::new(format!(r#"{{"prompt":"{prompt}"}}"#).into_bytes(), BlobHint::Raw);
                    e.request_ref = Some(blob.digest());
                    blobs.push(blob);
                }
                ("$", usage) => {
                    let parts: Vec<&str> = usage.split('/').collect();
                    let (input_tokens, output_tokens) =
                        (parts[0].parse().unwrap(), parts[1].parse().unwrap());
                    let cost_usd = parts.get(2).map(|c| c.parse().unwrap());
                    e.usage = Some(Usage { input_tokens, output_tokens, cost_usd, ..Default::default() });
                }
                ("~", error) => e.error = Some(error.replace('_', " ")),
                ("!", decision) => {
                    let (action, target) = decision.split_once(':').unwrap();
                    e.decision = Some(Decision { action: action.into(), target: Some(target.into()) });
                }
                _ => {
                    e.source = match *word {
                        "rec" => Source::Recorded,
                        "hit" => Source::CacheHit,
                        "dry" => Source::DryRun,
                        other => panic!("unknown word {other:?} in {line:?}"),
                    }
                }
            }
        }
        events.push(e);
    }
    (events, blobs)
}

/// Creates run `id` (started at `started`) with the events of `lines` from seq `first`.
fn commit(store: &dyn Store, meta: RunMeta, lines: &str) {
    let first = meta.fork_at.unwrap_or(1);
    let (events, blobs) = parse(&meta.id, first, lines);
    store.create_run(&meta).unwrap();
    store.commit(&Batch { run_id: meta.id.clone(), events, blobs, cache: Vec::new() }).unwrap();
}

fn recording(id: &str, started: u64) -> RunMeta {
    RunMeta::new(id, RunMode::Record, started)
}

fn fork(id: &str, source: &str, at: u64, started: u64) -> RunMeta {
    let mut meta = RunMeta::new(id, RunMode::Fork, started);
    (meta.source_run, meta.fork_at) = (Some(source.into()), Some(at));
    meta
}

fn tokens(t: &Tokens) -> String {
    let cost = t.cost_usd.map_or("-".to_owned(), |c| format!("${c:.2}"));
    format!("{} steps {}/{} {cost}", t.steps, t.input_tokens, t.output_tokens)
}

/// The diff as compact text: alignment, counts, changed and lone steps, decisions, cost.
fn render(d: &RunDiff) -> String {
    let mut out = format!(
        "by {:?}, source {:?}, fork at {:?}\nsame {} changed {} only_in_a {} only_in_b {}\n",
        d.alignment.by,
        d.alignment.source,
        d.alignment.fork_at,
        d.counts.same,
        d.counts.changed,
        d.counts.only_in_a,
        d.counts.only_in_b
    );
    for c in &d.changed {
        let label =
            if c.label_a == c.label_b { c.label_a.clone() } else { format!("{} / {}", c.label_a, c.label_b) };
        out.push_str(&format!("changed a{} b{} {} {label}\n", c.seq_a, c.seq_b, c.agent));
    }
    for (side, lone) in [("a", &d.only_in_a), ("b", &d.only_in_b)] {
        for s in lone {
            out.push_str(&format!("only_in_{side} {} {} {}\n", s.seq, s.agent, s.label));
        }
    }
    for m in &d.decisions {
        let target = m.target.as_deref().unwrap_or("-");
        let (a, b) = (m.a.as_deref().unwrap_or("(none)"), m.b.as_deref().unwrap_or("(none)"));
        out.push_str(&format!("decision {} {target}: {a} -> {b}\n", m.agent));
    }
    for (name, side) in [("a", &d.a), ("b", &d.b)] {
        out.push_str(&format!("{name} live {}", tokens(&side.live)));
        if let (Some(saved), Some(inherited)) = (&side.saved, &side.inherited) {
            out.push_str(&format!("; saved {}; inherited {}", tokens(saved), tokens(inherited)));
        }
        out.push('\n');
    }
    out
}

fn check(store: &dyn Store, a: &str, b: &str, expected: Expect) {
    let diff = diff_runs(store, a, b, &DiffOptions::default()).unwrap();
    let (counts, events_a, events_b) = (diff.counts, diff.a.events, diff.b.events);
    assert_eq!(counts.same + counts.changed + counts.only_in_a, events_a, "every event of A is counted once");
    assert_eq!(counts.same + counts.changed + counts.only_in_b, events_b, "every event of B is counted once");
    expected.assert_eq(&render(&diff));
}

/// A planner/reviewer run: a model call, a tool, a message, a decision.
const SOURCE: &str = "
    planner model_call:gpt m1 plan1 $1000/100/0.5
    planner tool_call:sql t1 rows1
    planner send:reviewer s1 -
    reviewer deliver:planner d1 -
    reviewer model_call:gpt m2 verdict1 $2000/50/1.0
    reviewer decision d2 - !approve:step:backfill
    planner tool_call:sql t2 rows2
";

#[test]
fn a_fork_aligns_by_origin_seq_and_reports_its_savings() {
    let store = MemoryStore::new();
    commit(&store, recording("src", 10), SOURCE);
    // Forked at 5: the reviewer's model call changed, so did its decision; a new tool call.
    commit(
        &store,
        fork("frk", "src", 5, 20),
        "
        reviewer model_call:gpt m2 verdict2 @5 $2100/60/1.1
        reviewer decision d3 - @6 !reject:step:backfill
        reviewer tool_call:lint t9 ok
        ",
    );
    check(
        &store,
        "src",
        "frk",
        expect![[r#"
            by OriginSeq, source A, fork at Some(5)
            same 4 changed 2 only_in_a 1 only_in_b 1
            changed a5 b5 reviewer model_call gpt
            changed a6 b6 reviewer decision approve / decision reject
            only_in_a 7 planner tool_call sql
            only_in_b 7 reviewer tool_call lint
            decision reviewer step:backfill: approve -> reject
            a live 2 steps 3000/150 $1.50
            b live 1 steps 2100/60 $1.10; saved 0 steps 0/0 -; inherited 1 steps 1000/100 $0.50
        "#]],
    );
    // The same fork named first: the roles swap, the result mirrors.
    check(
        &store,
        "frk",
        "src",
        expect![[r#"
            by OriginSeq, source B, fork at Some(5)
            same 4 changed 2 only_in_a 1 only_in_b 1
            changed a5 b5 reviewer model_call gpt
            changed a6 b6 reviewer decision reject / decision approve
            only_in_a 7 reviewer tool_call lint
            only_in_b 7 planner tool_call sql
            decision reviewer step:backfill: reject -> approve
            a live 1 steps 2100/60 $1.10; saved 0 steps 0/0 -; inherited 1 steps 1000/100 $0.50
            b live 2 steps 3000/150 $1.50
        "#]],
    );
}

#[test]
fn recorded_and_cached_steps_cost_nothing_and_count_as_saved() {
    let store = MemoryStore::new();
    commit(&store, recording("src", 10), SOURCE);
    commit(
        &store,
        fork("frk", "src", 1, 20),
        "
        planner model_call:gpt m1 plan1 @1 rec $1000/100/0.5
        planner tool_call:sql t1 rows1 @2 rec
        planner send:reviewer s1 - @3 rec
        reviewer deliver:planner d1 - @4 rec
        reviewer model_call:gpt m2 verdict1 @5 hit $2000/50/1.0
        reviewer decision d2 - @6 rec !approve:step:backfill
        planner tool_call:sql t2 rows3 @7
        ",
    );
    check(
        &store,
        "src",
        "frk",
        expect![[r#"
            by OriginSeq, source A, fork at Some(1)
            same 6 changed 1 only_in_a 0 only_in_b 0
            changed a7 b7 planner tool_call sql
            a live 2 steps 3000/150 $1.50
            b live 0 steps 0/0 -; saved 2 steps 3000/150 $1.50; inherited 0 steps 0/0 -
        "#]],
    );
}

#[test]
fn unrelated_runs_pair_by_key_then_by_type_and_name_with_the_older_as_source() {
    let store = MemoryStore::new();
    commit(&store, recording("old", 10), SOURCE);
    // The newer run: the planner's steps raced differently, the sql query changed, one more send,
    // the reviewer heard a second message and decided nothing.
    commit(
        &store,
        recording("new", 20),
        "
        planner tool_call:sql t1 rows1
        planner model_call:gpt m1 plan1 $1000/100/0.5
        planner send:reviewer s1 -
        reviewer deliver:planner d1 -
        planner tool_call:sql t3 rows2
        planner send:reviewer s2 -
        reviewer deliver:planner d4 -
        reviewer model_call:gpt m2 verdict1 $2000/50/1.0
        ",
    );
    let expected = expect![[r#"
        by Pairing, source A, fork at None
        same 5 changed 1 only_in_a 1 only_in_b 2
        changed a7 b5 planner tool_call sql
        only_in_a 6 reviewer decision approve
        only_in_b 6 planner send -> reviewer
        only_in_b 7 reviewer deliver <- planner
        decision reviewer step:backfill: approve -> (none)
        a live 2 steps 3000/150 $1.50
        b live 2 steps 3000/150 $1.50
    "#]];
    check(&store, "old", "new", expected);
    // Named the other way round, the older run is still the source.
    check(
        &store,
        "new",
        "old",
        expect![[r#"
            by Pairing, source B, fork at None
            same 5 changed 1 only_in_a 2 only_in_b 1
            changed a5 b7 planner tool_call sql
            only_in_a 6 planner send -> reviewer
            only_in_a 7 reviewer deliver <- planner
            only_in_b 6 reviewer decision approve
            decision reviewer step:backfill: (none) -> approve
            a live 2 steps 3000/150 $1.50
            b live 2 steps 3000/150 $1.50
        "#]],
    );
}

#[test]
fn leftover_steps_pair_with_the_earliest_of_the_same_type_and_name() {
    let store = MemoryStore::new();
    commit(
        &store,
        recording("old", 10),
        "
        a tool_call:x k1 o1
        a tool_call:x k2 o2
        a tool_call:y k3 o3
        a tool_call:x k4 o4
        b deliver:a d1 -
        b deliver:a d2 -
        ",
    );
    // k2 is matched by key although it comes later; k8 and k9 take the earliest leftovers of
    // x (k1, then k4; the latter with the same output but asked differently, so changed); z
    // and y have no partner;
    // the deliveries pair in order, the second with another message's key.
    commit(
        &store,
        recording("new", 20),
        "
        a tool_call:x k8 o8
        a tool_call:x k2 o2
        a tool_call:x k9 o4
        a tool_call:z k5 o3
        b deliver:a d1 -
        b deliver:a d9 -
        b deliver:a d2 -
        ",
    );
    check(
        &store,
        "old",
        "new",
        expect![[r#"
            by Pairing, source A, fork at None
            same 2 changed 3 only_in_a 1 only_in_b 2
            changed a1 b1 a tool_call x
            changed a4 b3 a tool_call x
            changed a6 b6 b deliver <- a
            only_in_a 3 a tool_call y
            only_in_b 4 a tool_call z
            only_in_b 7 b deliver <- a
            a live 0 steps 0/0 -
            b live 0 steps 0/0 -
        "#]],
    );
}

#[test]
fn sibling_forks_and_a_run_against_itself() {
    let store = MemoryStore::new();
    commit(&store, recording("src", 10), SOURCE);
    commit(&store, fork("left", "src", 7, 20), "planner tool_call:sql t2 rows2 @7 rec");
    commit(&store, fork("right", "src", 7, 30), "planner tool_call:sql t2 rows9 @7");
    check(
        &store,
        "left",
        "right",
        expect![[r#"
            by Pairing, source A, fork at None
            same 6 changed 1 only_in_a 0 only_in_b 0
            changed a7 b7 planner tool_call sql
            a live 0 steps 0/0 -
            b live 0 steps 0/0 -
        "#]],
    );
    check(
        &store,
        "src",
        "src",
        expect![[r#"
            by Pairing, source A, fork at None
            same 7 changed 0 only_in_a 0 only_in_b 0
            a live 2 steps 3000/150 $1.50
            b live 2 steps 3000/150 $1.50
        "#]],
    );
}

#[test]
fn changed_outputs_come_with_a_line_diff_and_the_lists_respect_the_limit() {
    let store = MemoryStore::new();
    commit(&store, recording("a", 10), "x tool_call:t k1 one\nx tool_call:t k2 two\nx send:y k3 -");
    commit(&store, recording("b", 20), "x tool_call:t k1 uno\nx tool_call:t k2 dos\nx send:y k4 -");
    let diff = diff_runs(&store, "a", "b", &DiffOptions { limit: 1, max_diff_lines: 10 }).unwrap();
    assert_eq!(diff.counts.changed, 3);
    assert_eq!(diff.changed.len(), 1, "the list is cut at the limit, the count is not");
    let first = &diff.changed[0];
    assert_eq!((first.output_a, first.output_b), (Some(out("one")), Some(out("uno"))));
    expect![[r#"
        --- A seq 1 output
        +++ B seq 1 output
        @@ -1,3 +1,3 @@
         {
        -  "out": "one"
        +  "out": "uno"
         }
    "#]]
    .assert_eq(first.diff.as_deref().unwrap());
    let all = diff_runs(&store, "a", "b", &DiffOptions::default()).unwrap();
    assert_eq!(all.changed[2].diff, None, "sends without request blobs have nothing to show");
    let json = serde_json::to_value(&all).unwrap();
    assert_eq!(json["alignment"]["by"], "pairing");
    assert_eq!(json["changed"][0]["output_a"], out("one").to_string());
    assert_eq!(json["counts"]["changed"], 3);
}

/// Two steps that failed differently are not the same step, and the diff shows each error
/// (QA25 D1: "same", and `(no output)`); a long line is cut (QA25 D4: a 2 MB line printed whole).
#[test]
fn failures_are_compared_and_shown_and_long_lines_are_cut() {
    let store = MemoryStore::new();
    let long = "z".repeat(1_000);
    commit(
        &store,
        recording("a", 10),
        &format!("x tool_call:t k1 - ~connection_refused\nx tool_call:u k2 {long}"),
    );
    commit(&store, recording("b", 20), "x tool_call:t k1 - ~disk_full\nx tool_call:u k2 short");
    let diff = diff_runs(&store, "a", "b", &DiffOptions::default()).unwrap();
    assert_eq!((diff.counts.same, diff.counts.changed), (0, 2), "{diff:?}");
    let failed = diff.changed[0].diff.as_deref().unwrap();
    assert!(
        failed.contains("-(failed) connection refused") && failed.contains("+(failed) disk full"),
        "{failed}"
    );
    let cut = diff.changed[1].diff.as_deref().unwrap();
    assert!(cut.len() < 1_000 && cut.contains("more characters)"), "{cut}");
    // The same failure on both sides is the same step.
    commit(&store, recording("c", 30), "x tool_call:t k1 - ~disk_full\nx tool_call:u k2 short");
    assert_eq!(diff_runs(&store, "b", "c", &DiffOptions::default()).unwrap().counts.same, 2);
}

fn out(word: &str) -> Digest {
    Digest::of(format!(r#"{{"out":"{word}"}}"#).as_bytes())
}

#[test]
fn unknown_runs_and_missing_sources_are_not_found() {
    let store = MemoryStore::new();
    commit(&store, recording("src", 10), SOURCE);
    commit(&store, fork("orphan", "gone", 3, 20), "planner tool_call:sql t2 rows2");
    let err = |a: &str, b: &str| diff_runs(&store, a, b, &DiffOptions::default()).unwrap_err();
    assert_eq!(err("src", "nope").kind, StoreErrorKind::NotFound);
    assert_eq!(err("nope", "src").kind, StoreErrorKind::NotFound);
    let orphan = err("src", "orphan");
    assert_eq!(orphan.kind, StoreErrorKind::NotFound);
    assert!(orphan.message.contains("gone"), "{orphan}");
}

/// Two 100,000-event runs built by commits: a source, and a fork at 1,001 that re-ran the rest
/// with four changed outputs and one step replaced by a new one. Events are not sealed (the diff
/// never reads hashes), and only the changed steps' outputs are stored as blobs (the diff reads
/// no other).
#[test]
fn two_runs_of_100k_events() {
    const N: u64 = 100_000;
    const AT: u64 = 1_001;
    const REPLACED: u64 = 70_000;
    let changed = [AT, 5_000, 50_000, 99_999];
    let agents = ["planner", "reviewer", "executor", "critic"];
    let step = |run: &str, seq: u64, output: &str| {
        let mut e = Event::new(run, agents[(seq % 4) as usize], EventType::ToolCall);
        e.seq = seq;
        e.name = Some(format!("tool{}", seq % 7));
        e.key = Digest::of(format!("key {seq}").as_bytes());
        e.output_hash = Some(Digest::of(output.as_bytes()));
        e.output_ref = e.output_hash;
        e.usage =
            Some(Usage { input_tokens: 10, output_tokens: 2, cost_usd: Some(0.001), ..Default::default() });
        e
    };
    let mut blobs = Vec::new();
    let mut source = Vec::new();
    for seq in 1..=N {
        let output = format!("out {seq}");
        if changed.contains(&seq) {
            blobs.push(BlobPut::new(output.clone().into_bytes(), BlobHint::Raw));
        }
        source.push(step("big-src", seq, &output));
    }
    let mut own = Vec::new();
    for seq in AT..=N {
        let mut e = match seq {
            REPLACED => step("big-frk", seq, "brand new"),
            s if changed.contains(&s) => {
                let output = format!("changed {s}");
                blobs.push(BlobPut::new(output.clone().into_bytes(), BlobHint::Raw));
                step("big-frk", s, &output)
            }
            s => Event { source: Source::Recorded, ..step("big-frk", s, &format!("out {s}")) },
        };
        e.origin_seq = (seq != REPLACED).then_some(seq);
        own.push(e);
    }
    let store = MemoryStore::new();
    store.create_run(&recording("big-src", 10)).unwrap();
    store.create_run(&fork("big-frk", "big-src", AT, 20)).unwrap();
    for (run, events) in [("big-src", source), ("big-frk", own)] {
        for chunk in events.chunks(4096) {
            let batch = Batch { run_id: run.into(), events: chunk.to_vec(), ..Batch::default() };
            store.commit(&batch).unwrap();
        }
    }
    store.commit(&Batch { run_id: "big-frk".into(), blobs, ..Batch::default() }).unwrap();

    let diff = diff_runs(&store, "big-src", "big-frk", &DiffOptions::default()).unwrap();
    assert_eq!((diff.a.events, diff.b.events), (N, N));
    let counts = diff.counts;
    let expected = Counts { same: N - 5, changed: 4, only_in_a: 1, only_in_b: 1 };
    assert_eq!(counts, expected);
    let pairs: Vec<(u64, u64)> = diff.changed.iter().map(|c| (c.seq_a, c.seq_b)).collect();
    assert_eq!(pairs, changed.map(|s| (s, s)));
    for c in &diff.changed {
        let text = c.diff.as_deref().unwrap();
        assert!(text.contains(&format!("\n-out {}\n+changed {}\n", c.seq_a, c.seq_b)), "{text}");
    }
    assert_eq!((diff.only_in_a[0].seq, diff.only_in_b[0].seq), (REPLACED, REPLACED));
    assert_eq!(diff.a.live.steps, N);
    assert_eq!(diff.b.live.steps, 5, "the changed steps and the new one ran live");
    assert_eq!(diff.b.saved.as_ref().unwrap().steps, N - AT + 1 - 5);
    let inherited = diff.b.inherited.as_ref().unwrap();
    assert_eq!((inherited.steps, inherited.input_tokens), (AT - 1, 10 * (AT - 1)));
    assert!(diff.decisions.is_empty());
}

#[test]
fn a_changed_step_whose_request_changed_too_shows_the_request_diff_first() {
    let store = MemoryStore::new();
    commit(&store, recording("a", 10), "x model_call:m k1 one ?hello\nx tool_call:t k2 two ?same");
    commit(&store, recording("b", 20), "x model_call:m k9 uno ?hola\nx tool_call:t k2 dos ?same");
    let diff = diff_runs(&store, "a", "b", &DiffOptions::default()).unwrap();
    assert_eq!(diff.counts.changed, 2);
    expect![[r#"
        --- A seq 1 request
        +++ B seq 1 request
        @@ -1,3 +1,3 @@
         {
        -  "prompt": "hello"
        +  "prompt": "hola"
         }
    "#]]
    .assert_eq(diff.changed[0].request_diff.as_deref().unwrap());
    assert!(diff.changed[0].diff.as_deref().unwrap().contains("+  \"out\": \"uno\""));
    assert_eq!(diff.changed[1].request_diff, None, "the same request: only the output differs");
    let json = serde_json::to_value(&diff).unwrap();
    assert!(json["changed"][0]["request_diff"].as_str().unwrap().contains("hola"));

    // Asked differently, answered the same: changed, with only the request diff to show.
    commit(&store, recording("c", 30), "x model_call:m k1 one ?hello\nx tool_call:t k7 two ?other");
    let diff = diff_runs(&store, "a", "c", &DiffOptions::default()).unwrap();
    assert_eq!((diff.counts.same, diff.counts.changed), (1, 1));
    assert_eq!(diff.changed[0].diff, None, "the outputs are the same");
    assert!(diff.changed[0].request_diff.as_deref().unwrap().contains("+  \"prompt\": \"other\""));
}

/// A delivery's key names only its sender: one that carries a changed message is changed, and
/// shows the message diff; one that carries the same send (inherited, or aligned and the same) is
/// the same.
#[test]
fn a_delivery_is_changed_when_the_message_it_carries_changed() {
    let store = MemoryStore::new();
    let source = "
        planner send:reviewer s1 - ?hello
        reviewer deliver:planner d1 - ^1
        planner send:reviewer s2 - ?again
        reviewer deliver:planner d2 - ^3
        reviewer model_call:gpt m1 v1";
    commit(&store, recording("src", 10), source);
    let edited = "
        planner send:reviewer s2x - ?changed @3
        reviewer deliver:planner d2 - ^3 @4
        reviewer model_call:gpt m1 v1 @5";
    commit(&store, fork("edited", "src", 3, 20), edited);
    check(
        &store,
        "src",
        "edited",
        expect![[r#"
            by OriginSeq, source A, fork at Some(3)
            same 3 changed 2 only_in_a 0 only_in_b 0
            changed a3 b3 planner send -> reviewer
            changed a4 b4 reviewer deliver <- planner
            a live 1 steps 0/0 -
            b live 1 steps 0/0 -; saved 0 steps 0/0 -; inherited 0 steps 0/0 -
        "#]],
    );
    let diff = diff_runs(&store, "src", "edited", &DiffOptions::default()).unwrap();
    expect![[r#"
        --- A seq 4 message
        +++ B seq 4 message
        @@ -1,3 +1,3 @@
         {
        -  "prompt": "again"
        +  "prompt": "changed"
         }
    "#]]
    .assert_eq(diff.changed[1].diff.as_deref().unwrap());

    // The same messages: one inherited send (seq 1), one re-sent the same (seq 3).
    let rerun = "
        reviewer deliver:planner d1 - ^1 @2
        planner send:reviewer s2 - ?again @3
        reviewer deliver:planner d2 - ^3 @4
        reviewer model_call:gpt m1 v1 @5";
    commit(&store, fork("rerun", "src", 2, 30), rerun);
    check(
        &store,
        "src",
        "rerun",
        expect![[r#"
            by OriginSeq, source A, fork at Some(2)
            same 5 changed 0 only_in_a 0 only_in_b 0
            a live 1 steps 0/0 -
            b live 1 steps 0/0 -; saved 0 steps 0/0 -; inherited 0 steps 0/0 -
        "#]],
    );

    // Unrelated runs pair sends by name and deliveries in order: the same verdict.
    let recorded_again = "
        planner send:reviewer s1 - ?hello
        reviewer deliver:planner d1 - ^1
        planner send:reviewer s2x - ?changed
        reviewer deliver:planner d2 - ^3
        reviewer model_call:gpt m1 v1";
    commit(&store, recording("again", 40), recorded_again);
    check(
        &store,
        "src",
        "again",
        expect![[r#"
            by Pairing, source A, fork at None
            same 3 changed 2 only_in_a 0 only_in_b 0
            changed a3 b3 planner send -> reviewer
            changed a4 b4 reviewer deliver <- planner
            a live 1 steps 0/0 -
            b live 1 steps 0/0 -
        "#]],
    );
}

/// Two recordings of one unchanged answer differ in what the provider writes anew each time
/// (the `date` header, ids, creation times): the same step. Another answer is changed.
#[test]
fn a_model_answer_that_differs_only_in_ids_and_headers_is_the_same() {
    let store = MemoryStore::new();
    let document = |date: &str, id: &str, content: &str| {
        format!(
            r#"{{"format":"retrace-http/1","status":200,"headers":[["date","{date}"]],"body":{{"id":"{id}","created":{},"choices":[{{"message":{{"content":"{content}"}}}}]}}}}"#,
            id.len()
        )
    };
    let answers = [
        ("first", document("Sat, 05 Dec 2026 23:01:00 GMT", "chatcmpl-a", "plan: rename, then backfill")),
        ("again", document("Sat, 05 Dec 2026 23:09:00 GMT", "chatcmpl-bb", "plan: rename, then backfill")),
        ("other", document("Sat, 05 Dec 2026 23:09:00 GMT", "chatcmpl-c", "plan: backfill first")),
    ];
    for (i, (id, output)) in answers.iter().enumerate() {
        let (mut events, mut blobs) = parse(id, 1, "planner model_call:gpt m1 - ?hello");
        let blob = BlobPut::new(output.clone().into_bytes(), BlobHint::Raw);
        (events[0].output_ref, events[0].output_hash) = (Some(blob.digest()), Some(blob.digest()));
        blobs.push(blob);
        store.create_run(&recording(id, 10 * (i as u64 + 1))).unwrap();
        store.commit(&Batch { run_id: (*id).into(), events, blobs, cache: Vec::new() }).unwrap();
    }
    let counts = |a: &str, b: &str| diff_runs(&store, a, b, &DiffOptions::default()).unwrap().counts;
    assert_eq!((counts("first", "again").same, counts("first", "again").changed), (1, 0));
    let changed = diff_runs(&store, "first", "other", &DiffOptions::default()).unwrap();
    assert_eq!((changed.counts.same, changed.counts.changed), (0, 1));
    assert!(changed.changed[0].diff.as_deref().unwrap().contains("backfill first"));
}
