//! Forks: only what an edit reaches runs; everything else comes from the source at zero cost;
//! side effects never run; caches respect their class; replaying a fork reproduces it.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use retrace_core::edit::{Content, Edit};
use retrace_core::{EventType, Source};
use retrace_runtime::env_sources::ManualClock;
use retrace_runtime::{ModelCall, ModelReply, Outcome, RuntimeError, Session, SessionOptions, ToolSpec};
use retrace_store::memory::MemoryStore;
use retrace_store::{BlobHint, Store};
use serde_json::{json, Value};

fn store() -> Arc<dyn Store> {
    Arc::new(MemoryStore::new())
}

#[derive(Default)]
struct Calls {
    tool: AtomicUsize,
    model: AtomicUsize,
    side: AtomicUsize,
}

/// A pipeline: fetch (time-bound) → analyse (model) → verify (deterministic) → publish (side
/// effect), each step fed by the previous output.
fn pipeline(s: &Session, calls: &Calls) -> Result<Value, RuntimeError> {
    let a = s.agent("pipeline");
    let fetched: Value = a.tool("fetch", &json!({"q": "rates"}), ToolSpec::time_bound("1", 3600), || {
        calls.tool.fetch_add(1, Ordering::SeqCst);
        Ok::<_, String>(json!({"rate": rand::random::<u8>()}))
    })?;
    let call = ModelCall {
        provider: "openai".into(),
        endpoint: "chat.completions".into(),
        body: json!({"model": "m", "messages": [{"role": "user", "content": format!("analyse {fetched}")}]}),
    };
    let analysis = a.model(&call, |_body| {
        calls.model.fetch_add(1, Ordering::SeqCst);
        Ok::<_, String>(ModelReply {
            body: json!({"text": format!("analysis {}", rand::random::<u16>())}),
            snapshot: None,
            usage: Some(retrace_core::envelope::Usage {
                input_tokens: 100,
                output_tokens: 20,
                cost_usd: Some(0.01),
                ..Default::default()
            }),
        })
    })?;
    let verified: Value = a.tool("verify", &analysis, ToolSpec::deterministic("1"), || {
        calls.tool.fetch_add(1, Ordering::SeqCst);
        Ok::<_, String>(json!({"ok": true, "checked": analysis["text"]}))
    })?;
    let spec = ToolSpec::side_effect("1").with_dry_run(|args| json!({"would_publish": args}));
    let published: Value = a.tool("publish", &verified, spec, || {
        calls.side.fetch_add(1, Ordering::SeqCst);
        Ok::<_, String>(json!({"published": true}))
    })?;
    a.decide(if verified["ok"] == json!(true) { "ship" } else { "hold" }, Some("report"))?;
    Ok(published)
}

fn record(store: &Arc<dyn Store>) -> String {
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let calls = Calls::default();
    pipeline(&s, &calls).unwrap();
    assert_eq!(calls.side.load(Ordering::SeqCst), 1);
    s.finish(Outcome::default()).unwrap().run_id
}

fn fork_events(store: &Arc<dyn Store>, fork: &str) -> Vec<retrace_core::Event> {
    let at = store.run(fork).unwrap().fork_at.unwrap();
    store.events(fork, at, 1000).unwrap()
}

#[test]
fn a_fork_with_no_edits_runs_nothing_live_even_long_after() {
    let store = store();
    let source = record(&store);
    // Forked "a year later": the time-bound fetch's cache entry has expired, but matched steps
    // get the source's output whatever their class or age.
    let clock = Arc::new(ManualClock::new(4_000_000_000_000));
    let calls = Calls::default();
    let options = SessionOptions { clock: clock.clone(), ..Default::default() };
    let f = Session::fork_new(store.clone(), &source, Some(1), vec![], options).unwrap();
    pipeline(&f, &calls).unwrap();
    let report = f.finish(Outcome::default()).unwrap();
    assert_eq!(report.live_calls, 0);
    assert_eq!(calls.tool.load(Ordering::SeqCst) + calls.model.load(Ordering::SeqCst), 0);
    assert_eq!(calls.side.load(Ordering::SeqCst), 0, "a side effect never runs in a fork");
    let source_events = store.events(&source, 1, 1000).unwrap();
    let fork = fork_events(&store, &f.run_id());
    assert_eq!(fork.len(), source_events.len());
    for (e, s) in fork.iter().zip(&source_events) {
        assert_eq!(e.source, Source::Recorded, "{}", e.label());
        assert_eq!(e.origin_seq, Some(s.seq));
        assert_eq!(e.output_hash, s.output_hash, "identical output hashes");
        assert!(e.usage.is_none(), "zero tokens");
    }
}

#[test]
fn one_edit_runs_exactly_the_steps_it_reaches() {
    let store = store();
    let source = record(&store);
    let events = store.events(&source, 1, 100).unwrap();
    let fetch = events.iter().find(|e| e.name.as_deref() == Some("fetch")).unwrap().seq;
    let blob = store.put_blob(br#"{"rate":999}"#, BlobHint::Raw).unwrap();
    let edit = Edit::ToolOutput { seq: fetch, content: Content::Blob(blob) };
    let calls = Calls::default();
    let f = Session::fork_new(store.clone(), &source, None, vec![edit], SessionOptions::default()).unwrap();
    let published = pipeline(&f, &calls).unwrap();
    f.finish(Outcome::default()).unwrap();
    // fetch is served edited; analyse and verify changed inputs and ran live; publish dry-ran.
    assert_eq!(calls.model.load(Ordering::SeqCst), 1);
    assert_eq!(calls.tool.load(Ordering::SeqCst), 1, "verify ran; fetch did not");
    assert_eq!(calls.side.load(Ordering::SeqCst), 0);
    assert!(published.get("would_publish").is_some(), "the dry run's value: {published}");
    let fork = fork_events(&store, &f.run_id());
    let by_name = |n: &str| {
        fork.iter()
            .find(|e| {
                e.name.as_deref() == Some(n) && e.kind == EventType::ToolCall
                    || e.name.as_deref() == Some(n) && e.kind == EventType::ModelCall
            })
            .unwrap()
    };
    assert_eq!(by_name("fetch").source, Source::Recorded);
    assert_eq!(by_name("openai/chat.completions").source, Source::Live);
    assert_eq!(by_name("verify").source, Source::Live);
    assert_eq!(by_name("publish").source, Source::DryRun);
    assert!(fork.iter().all(|e| e.origin_seq.is_some()), "every step paired with its source step");

    // Replaying the fork reproduces it exactly: same outputs, nothing live.
    let calls = Calls::default();
    let r = Session::replay(store.clone(), &f.run_id(), SessionOptions::default()).unwrap();
    assert_eq!(pipeline(&r, &calls).unwrap(), published);
    r.finish(Outcome::default()).unwrap();
    assert_eq!(
        calls.tool.load(Ordering::SeqCst)
            + calls.model.load(Ordering::SeqCst)
            + calls.side.load(Ordering::SeqCst),
        0
    );

    // A fork of that fork serves the dry run from it, still a dry run (no intent before it),
    // and its replay takes it as such (QA15 D3: it diverged at the side effect).
    let ff = Session::fork_new(store.clone(), &f.run_id(), None, vec![], SessionOptions::default()).unwrap();
    assert_eq!(pipeline(&ff, &calls).unwrap(), published);
    ff.finish(Outcome::default()).unwrap();
    let events = fork_events(&store, &ff.run_id());
    let publish = events.iter().find(|e| e.name.as_deref() == Some("publish")).unwrap();
    assert_eq!(publish.source, Source::DryRun, "{publish:?}");
    let r = Session::replay(store.clone(), &ff.run_id(), SessionOptions::default()).unwrap();
    assert_eq!(pipeline(&r, &calls).unwrap(), published);
    r.finish(Outcome::default()).expect("the fork of a fork replays exactly");
    assert_eq!(calls.side.load(Ordering::SeqCst), 0, "a side effect never runs");

    // One whose fork point lies after that dry run inherits it (QA22 D2: it looked for the
    // intent a dry run doesn't log, and diverged there).
    let decided =
        fork_events(&store, &f.run_id()).iter().find(|e| e.kind == EventType::Decision).unwrap().seq;
    let late =
        Session::fork_new(store.clone(), &f.run_id(), Some(decided), vec![], SessionOptions::default())
            .unwrap();
    assert_eq!(pipeline(&late, &calls).expect("inherits the dry run"), published);
    late.finish(Outcome::default()).unwrap();
    assert_eq!(calls.tool.load(Ordering::SeqCst) + calls.side.load(Ordering::SeqCst), 0);
}

#[test]
fn a_fork_between_a_side_effects_intent_and_its_completion_verifies_and_replays() {
    let store = store();
    let source = record(&store);
    let events = store.events(&source, 1, 100).unwrap();
    let intent = events.iter().find(|e| e.kind == EventType::Intent).unwrap();
    // The intent is inherited; the completion is the fork's own.
    let f =
        Session::fork_new(store.clone(), &source, Some(intent.seq + 1), vec![], SessionOptions::default())
            .unwrap();
    let calls = Calls::default();
    let published = pipeline(&f, &calls).unwrap();
    f.finish(Outcome::default()).unwrap();
    assert_eq!(calls.side.load(Ordering::SeqCst), 0);
    let fork = fork_events(&store, &f.run_id());
    let done = fork.iter().find(|e| e.name.as_deref() == Some("publish")).unwrap();
    assert_eq!(done.causal_parent, Some(intent.seq), "the completion names its intent, as at record");
    assert!(done.lamport > intent.lamport, "{} after {}", done.lamport, intent.lamport);
    let problems = retrace_store::verify::verify_run(store.as_ref(), &f.run_id());
    assert!(problems.is_empty(), "{problems:?}");

    let r = Session::replay(store.clone(), &f.run_id(), SessionOptions::default()).unwrap();
    assert_eq!(pipeline(&r, &Calls::default()).unwrap(), published);
    let report = r.finish(Outcome::default()).unwrap();
    assert_eq!(report.status, retrace_core::run::RunStatus::Ok, "{report:?}");
}

#[test]
fn a_step_served_from_the_source_keeps_its_model_snapshot() {
    let store = store();
    let ask = |s: &Session| {
        let call = ModelCall {
            provider: "openai".into(),
            endpoint: "chat.completions".into(),
            body: json!({"model": "m"}),
        };
        s.agent("a").model(&call, |_| {
            Ok::<_, String>(ModelReply {
                body: json!({"text": "hi"}),
                snapshot: Some("m-2026-11-01".into()),
                usage: None,
            })
        })
    };
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    ask(&s).unwrap();
    let source = s.finish(Outcome::default()).unwrap().run_id;
    let f = Session::fork_new(store.clone(), &source, Some(1), vec![], SessionOptions::default()).unwrap();
    ask(&f).unwrap();
    f.finish(Outcome::default()).unwrap();
    let step = &fork_events(&store, &f.run_id())[0];
    assert_eq!(step.source, Source::Recorded);
    assert_eq!(step.model.as_ref().and_then(|m| m.snapshot.as_deref()), Some("m-2026-11-01"));
}

/// A step the LLM cache serves pins the snapshot its live call reported, as one served from the
/// source does (it was stored as `null`: QA8 D1).
#[test]
fn a_step_served_from_the_cache_keeps_its_model_snapshot() {
    let store = store();
    let ask = |s: &Session, prompt: &str| {
        let call = ModelCall {
            provider: "openai".into(),
            endpoint: "chat.completions".into(),
            body: json!({"model": "m", "prompt": prompt}),
        };
        s.agent("a").model(&call, |_| {
            Ok::<_, String>(ModelReply {
                body: json!({"text": prompt}),
                snapshot: Some("m-2026-11-01".into()),
                usage: None,
            })
        })
    };
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    ask(&s, "first").unwrap();
    let source = s.finish(Outcome::default()).unwrap().run_id;
    // Another run asks what the fork will: its answer is cached.
    let other = Session::record(store.clone(), SessionOptions::default()).unwrap();
    ask(&other, "second").unwrap();
    other.finish(Outcome::default()).unwrap();
    let f = Session::fork_new(store.clone(), &source, Some(1), vec![], SessionOptions::default()).unwrap();
    ask(&f, "second").unwrap();
    f.finish(Outcome::default()).unwrap();
    let step = &fork_events(&store, &f.run_id())[0];
    assert_eq!(step.source, Source::CacheHit);
    assert_eq!(step.model.as_ref().and_then(|m| m.snapshot.as_deref()), Some("m-2026-11-01"));
}

/// A program that asks the same model the same thing twice (resampling, a retry until the
/// answer parses) gets two answers in a fork too: the second identical call has its own cache
/// entry, not the first call's (QA17 D2: the fork handed back the first answer twice). A second
/// fork with the same edit gets both from the cache, in order; a deterministic tool's answer
/// still answers every identical call.
#[test]
fn a_repeated_model_call_in_a_fork_gets_its_own_answer_and_a_second_fork_the_same_ones() {
    let store = store();
    let answers = AtomicUsize::new(0);
    let program = |s: &Session, temperature: f64| -> Vec<String> {
        let a = s.agent("a");
        let call = ModelCall::openai_chat(
            json!({"model": "m", "messages": [{"role": "user", "content": "same"}], "temperature": temperature}),
        );
        let mut got: Vec<String> = (0..2)
            .map(|_| {
                let reply = a
                    .model(&call, |_| {
                        let n = answers.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, String>(
                            ModelReply::new(json!({"text": format!("answer {n}")})).snapshot("m-1"),
                        )
                    })
                    .unwrap();
                reply["text"].as_str().unwrap().to_owned()
            })
            .collect();
        for _ in 0..2 {
            let n: u32 = a
                .tool("tax", &json!({"sku": 1}), ToolSpec::deterministic("1"), || {
                    Ok::<_, String>(answers.fetch_add(1, Ordering::SeqCst) as u32)
                })
                .unwrap();
            got.push(n.to_string());
        }
        got
    };
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    assert_eq!(program(&s, 0.0), ["answer 0", "answer 1", "2", "3"]);
    let source = s.finish(Outcome::default()).unwrap().run_id;
    let edit = || vec![Edit::Param { agent: "a".into(), name: "temperature".into(), value: json!(0.5) }];
    let fork = |expect: &[&str], sources: &[Source]| {
        let f =
            Session::fork_new(store.clone(), &source, Some(1), edit(), SessionOptions::default()).unwrap();
        assert_eq!(program(&f, 0.0), expect);
        f.finish(Outcome::default()).unwrap();
        let got: Vec<Source> = fork_events(&store, &f.run_id()).iter().map(|e| e.source).collect();
        assert_eq!(got, sources);
    };
    use Source::{CacheHit, Live, Recorded};
    fork(&["answer 4", "answer 5", "2", "3"], &[Live, Live, Recorded, Recorded]);
    fork(&["answer 4", "answer 5", "2", "3"], &[CacheHit, CacheHit, Recorded, Recorded]);
    assert_eq!(answers.load(Ordering::SeqCst), 6, "two live calls in the first fork, none in the second");
}

#[test]
fn a_second_fork_reuses_the_caches_and_ttl_runs_on_the_forks_clock() {
    let store = store();
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let s = Session::record(store.clone(), SessionOptions { clock: clock.clone(), ..Default::default() })
        .unwrap();
    let a = s.agent("a");
    let _: u32 =
        a.tool("price", &json!({"sku": 1}), ToolSpec::time_bound("1", 60), || Ok::<_, String>(10)).unwrap();
    let _: u32 =
        a.tool("tax", &json!({"sku": 1}), ToolSpec::deterministic("1"), || Ok::<_, String>(2)).unwrap();
    s.finish(Outcome::default()).unwrap();
    // A fork whose agent asks for something else, then for what another run already computed.
    let warm = Session::record(store.clone(), SessionOptions { clock: clock.clone(), ..Default::default() })
        .unwrap();
    let w = warm.agent("a");
    let _: u32 =
        w.tool("price", &json!({"sku": 2}), ToolSpec::time_bound("1", 60), || Ok::<_, String>(11)).unwrap();
    let _: u32 =
        w.tool("tax", &json!({"sku": 2}), ToolSpec::deterministic("1"), || Ok::<_, String>(3)).unwrap();
    warm.finish(Outcome::default()).unwrap();
    for (advance_s, price_live) in [(30, false), (120, true)] {
        clock.advance(advance_s * 1000);
        let live = AtomicUsize::new(0);
        let f = Session::fork_new(
            store.clone(),
            &s.run_id(),
            Some(1),
            vec![],
            SessionOptions { clock: clock.clone(), ..Default::default() },
        )
        .unwrap();
        let a = f.agent("a");
        let p: u32 = a
            .tool("price", &json!({"sku": 2}), ToolSpec::time_bound("1", 60), || {
                live.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(99)
            })
            .unwrap();
        let t: u32 = a
            .tool("tax", &json!({"sku": 2}), ToolSpec::deterministic("1"), || {
                live.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(99)
            })
            .unwrap();
        f.finish(Outcome::default()).unwrap();
        assert_eq!(t, 3, "deterministic: cached forever");
        assert_eq!(p == 99, price_live, "time_bound within its TTL on the fork's own clock");
        assert_eq!(live.load(Ordering::SeqCst), usize::from(price_live));
        let sources: Vec<Source> = fork_events(&store, &f.run_id()).iter().map(|e| e.source).collect();
        assert_eq!(sources[1], Source::CacheHit);
    }
}

#[test]
fn a_changed_side_effect_without_dry_run_raises_dry_run() {
    let store = store();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let _: Value = s
        .agent("a")
        .tool("email", &json!({"to": "ops"}), ToolSpec::side_effect("1"), || {
            Ok::<_, String>(json!({"sent": 1}))
        })
        .unwrap();
    s.finish(Outcome::default()).unwrap();
    let f =
        Session::fork_new(store.clone(), &s.run_id(), Some(1), vec![], SessionOptions::default()).unwrap();
    let ran = AtomicUsize::new(0);
    let err = f
        .agent("a")
        .tool("email", &json!({"to": "ceo"}), ToolSpec::side_effect("1"), || {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<Value, String>(json!({}))
        })
        .unwrap_err();
    assert!(matches!(err, RuntimeError::DryRun { ref tool, .. } if tool == "email"), "{err}");
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

#[test]
fn bad_edits_are_refused_with_a_reason() {
    let store = store();
    let source = record(&store);
    for (edit, why) in [
        ("swap:1,2", "swap exchanges two deliveries"),
        (
            "tool-output:99=@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            "does not exist",
        ),
        ("model:pipeline=claude-3-5-sonnet", "can't change the provider"),
        ("prompt:pipeline=v2", "never called template()"),
    ] {
        let err = Session::fork_new(
            store.clone(),
            &source,
            None,
            vec![edit.parse().unwrap()],
            SessionOptions::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains(why), "{edit}: {err}");
    }
    assert_eq!(store.runs().unwrap().len(), 1, "a refused fork creates nothing");
    // A run without events says so, not "seqs 1-0".
    let empty = Session::record(store.clone(), SessionOptions::default()).unwrap();
    empty.finish(Outcome { exit_status: Some(0) }).unwrap();
    let edit = "tool-output:1=@sha256:0000000000000000000000000000000000000000000000000000000000000000";
    let err = Session::fork_new(
        store.clone(),
        &empty.run_id(),
        None,
        vec![edit.parse().unwrap()],
        SessionOptions::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("seq 1 does not exist (the source run has no events)"), "{err}");

    // Two edits of the same thing: one would silently undo the other.
    let same = ["param:pipeline.temperature=0.1", "param:pipeline.temperature=0.9"];
    let err = Session::fork_new(
        store.clone(),
        &source,
        None,
        same.iter().map(|e| e.parse().unwrap()).collect(),
        SessionOptions::default(),
    )
    .unwrap_err();
    let said = err.to_string();
    assert!(
        said.contains(
            "edits param:pipeline.temperature=0.1 and param:pipeline.temperature=0.9 change the same thing"
        ),
        "{said}"
    );
    // The same swap twice undoes itself (QA15 D2); swaps that
    // compose are checked as ever (by the plan, against the run).
    let twice: Vec<retrace_core::edit::Edit> =
        ["swap:6,8", "swap:6,8"].iter().map(|e| e.parse().unwrap()).collect();
    let said = retrace_runtime::fork::check_distinct(&twice).unwrap_err().to_string();
    assert!(said.contains("change the same thing"), "{said}");
    let composed: Vec<retrace_core::edit::Edit> =
        ["swap:3,5", "swap:5,7"].iter().map(|e| e.parse().unwrap()).collect();
    retrace_runtime::fork::check_distinct(&composed).unwrap();
}

/// An agent edit that no step of its agent takes after the fork point is said to have changed
/// nothing; one that reaches a step is not.
#[test]
fn an_agent_edit_that_reaches_no_step_is_reported() {
    let store = store();
    let source = record(&store);
    let edit: Edit = "param:pipeline.temperature=0.5".parse().unwrap();
    let last = store.last_seq(&source).unwrap();
    for (at, changed) in [(None, true), (Some(last + 1), false)] {
        let f = Session::fork_new(store.clone(), &source, at, vec![edit.clone()], SessionOptions::default())
            .unwrap();
        pipeline(&f, &Calls::default()).unwrap();
        f.finish(Outcome::default()).unwrap();
        let at = store.run(&f.run_id()).unwrap().fork_at.unwrap();
        let warnings = retrace_runtime::fork::unapplied(
            std::slice::from_ref(&edit),
            &store.events(&f.run_id(), at, 100).unwrap(),
        );
        assert_eq!(warnings.is_empty(), changed, "--at {at}: {warnings:?}");
        if !changed {
            assert!(warnings[0].contains("param:pipeline.temperature=0.5 changed nothing"), "{warnings:?}");
            assert!(warnings[0].contains("fork earlier"), "{warnings:?}");
        }
    }
    // Reaching the agent's calls and leaving them as recorded (the value they held already)
    // is not said as a fork point too late (QA15 S5).
    let mut served = retrace_core::Event::new("fork", "pipeline", EventType::ModelCall);
    served.source = Source::Recorded;
    let unchanged = retrace_runtime::fork::unapplied(std::slice::from_ref(&edit), &[served]);
    assert!(
        unchanged[0].contains("they may hold that value already") && !unchanged[0].contains("fork earlier"),
        "{unchanged:?}"
    );
}

#[test]
fn a_prompt_edit_hands_the_agent_another_version() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("reviewer")).unwrap();
    std::fs::write(dir.path().join("reviewer/v1.txt"), "Review {table} strictly.").unwrap();
    std::fs::write(dir.path().join("reviewer/v2.txt"), "Review {table} leniently.").unwrap();
    let options = || SessionOptions { prompts_dir: dir.path().to_path_buf(), ..Default::default() };
    let store = store();
    let program = |s: &Session, live: &AtomicUsize| -> Result<String, RuntimeError> {
        let a = s.agent("reviewer").with_prompt_template("reviewer@v1");
        let prompt = a.template(&json!({"table": "users"}))?;
        let call = ModelCall {
            provider: "openai".into(),
            endpoint: "chat.completions".into(),
            body: json!({"model": "m", "messages": [{"role": "system", "content": prompt}]}),
        };
        let out = a.model(&call, |_body| {
            live.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(ModelReply { body: json!({"said": prompt}), snapshot: None, usage: None })
        })?;
        Ok(out["said"].as_str().unwrap().to_owned())
    };
    let s = Session::record(store.clone(), options()).unwrap();
    assert_eq!(program(&s, &AtomicUsize::new(0)).unwrap(), "Review users strictly.");
    s.finish(Outcome::default()).unwrap();
    let recorded = store.event(&s.run_id(), 1).unwrap();
    assert_eq!(recorded.prompt_template.unwrap().id, "reviewer@v1");

    let live = AtomicUsize::new(0);
    let edit: Edit = "prompt:reviewer=v2".parse().unwrap();
    let f = Session::fork_new(store.clone(), &s.run_id(), None, vec![edit], options()).unwrap();
    assert_eq!(program(&f, &live).unwrap(), "Review users leniently.");
    f.finish(Outcome::default()).unwrap();
    assert_eq!(live.load(Ordering::SeqCst), 1);
    let forked = store.event(&f.run_id(), 1).unwrap();
    assert_eq!(forked.prompt_template.unwrap().id, "reviewer@v2");
    assert_eq!(forked.origin_seq, Some(1), "paired with the source's model call");

    // A fork of that fork starts from its world: the prompt edit applies again, so with no
    // edits of its own, or forked past its end, nothing runs live and the agent still gets v2.
    let last = store.last_seq(&f.run_id()).unwrap();
    for at in [None, Some(last + 1)] {
        let live = AtomicUsize::new(0);
        let g = Session::fork_new(store.clone(), &f.run_id(), at, vec![], options()).unwrap();
        assert_eq!(program(&g, &live).unwrap(), "Review users leniently.", "--at {at:?}");
        let done = g.finish(Outcome::default()).unwrap();
        assert_eq!(done.status, retrace_core::run::RunStatus::Ok, "--at {at:?}: {done:?}");
        assert_eq!(live.load(Ordering::SeqCst), 0, "--at {at:?}: served from the fork");
        // And its replay, which applies both plans again.
        let r = Session::replay(store.clone(), &g.run_id(), options()).unwrap();
        assert_eq!(program(&r, &AtomicUsize::new(0)).unwrap(), "Review users leniently.");
        assert_eq!(r.finish(Outcome::default()).unwrap().status, retrace_core::run::RunStatus::Ok);
    }
    // Its own edit of the same target wins.
    let back: Edit = "prompt:reviewer=v1".parse().unwrap();
    let g = Session::fork_new(store.clone(), &f.run_id(), None, vec![back], options()).unwrap();
    assert_eq!(program(&g, &AtomicUsize::new(0)).unwrap(), "Review users strictly.");
    g.finish(Outcome::default()).unwrap();
}

#[test]
fn a_prompt_version_with_a_placeholder_the_program_does_not_pass_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("reviewer")).unwrap();
    std::fs::write(dir.path().join("reviewer/v1.txt"), "Review {table}.").unwrap();
    std::fs::write(dir.path().join("reviewer/v2.txt"), "Review {table}\nwith {checklist}.").unwrap();
    let options = || SessionOptions { prompts_dir: dir.path().to_path_buf(), ..Default::default() };
    let store = store();
    let program = |s: &Session| -> Result<String, RuntimeError> {
        let a = s.agent("reviewer").with_prompt_template("reviewer@v1");
        let prompt = a.template(&json!({"table": "t"}))?;
        let call =
            ModelCall { provider: "openai".into(), endpoint: "chat.completions".into(), body: json!({}) };
        a.model(&call, |_| Ok::<_, String>(ModelReply { body: json!({}), snapshot: None, usage: None }))?;
        Ok(prompt)
    };
    let s = Session::record(store.clone(), options()).unwrap();
    assert_eq!(program(&s).unwrap(), "Review t.");
    s.finish(Outcome::default()).unwrap();

    // The fork's version asks for a variable the program never passes: the prompt is never
    // sent with `{checklist}` in it.
    let edit: Edit = "prompt:reviewer=v2".parse().unwrap();
    let f = Session::fork_new(store.clone(), &s.run_id(), None, vec![edit], options()).unwrap();
    let err = program(&f).unwrap_err();
    assert!(
        matches!(&err, RuntimeError::TemplateVar { template, missing, .. }
        if template == "reviewer@v2" && missing.name == "checklist" && missing.line == 2),
        "{err}"
    );
    assert!(
        err.to_string().contains("placeholder {checklist} on line 2 has no value (given: table)"),
        "{err}"
    );
}

#[test]
fn model_calls_get_a_cost_from_the_price_table_and_model_edits_reach_the_live_call() {
    let store = store();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let call = ModelCall {
        provider: "openai".into(),
        endpoint: "chat.completions".into(),
        body: json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}),
    };
    let a = s.agent("a");
    a.model(&call, |_body| {
        Ok::<_, String>(ModelReply {
            body: json!({"ok": 1}),
            snapshot: Some("gpt-4o-2024-08-06".into()),
            usage: Some(retrace_core::envelope::Usage {
                input_tokens: 1_000_000,
                output_tokens: 0,
                cost_usd: None,
                ..Default::default()
            }),
        })
    })
    .unwrap();
    s.finish(Outcome::default()).unwrap();
    let e = store.event(&s.run_id(), 1).unwrap();
    assert!(e.usage.unwrap().cost_usd.unwrap() > 0.0, "priced from the built-in table");

    let edit: Edit = "model:a=gpt-4.1".parse().unwrap();
    let f =
        Session::fork_new(store.clone(), &s.run_id(), None, vec![edit], SessionOptions::default()).unwrap();
    let sent = std::sync::Mutex::new(Value::Null);
    f.agent("a")
        .model(&call, |body| {
            *sent.lock().unwrap() = body;
            Ok::<_, String>(ModelReply { body: json!({"ok": 2}), snapshot: None, usage: None })
        })
        .unwrap();
    f.finish(Outcome::default()).unwrap();
    assert_eq!(sent.lock().unwrap()["model"], "gpt-4.1", "the live call sends the edited request");
}

/// An output edit answers its step even where another edit changed the step's request: here
/// the fetched rate is edited, so the analysis is asked something new, and its output is
/// edited too: the edit answers it, nothing runs live (QA15 D1: the edit was dropped, the model
/// called, and the fork still listed the edit).
#[test]
fn an_output_edit_answers_its_step_even_when_another_edit_changed_its_request() {
    let store = store();
    let source = record(&store);
    let events = store.events(&source, 1, 100).unwrap();
    let seq_of = |kind: EventType| events.iter().find(|e| e.kind == kind).unwrap().seq;
    let fetched = store.put_blob(br#"{"rate":999}"#, BlobHint::Raw).unwrap();
    let answer = store.put_blob(br#"{"text":"edited analysis"}"#, BlobHint::Raw).unwrap();
    let edits = vec![
        Edit::ToolOutput { seq: seq_of(EventType::ToolCall), content: Content::Blob(fetched) },
        Edit::ModelOutput { seq: seq_of(EventType::ModelCall), content: Content::Blob(answer) },
    ];
    let calls = Calls::default();
    let f = Session::fork_new(store.clone(), &source, None, edits, SessionOptions::default()).unwrap();
    let published = pipeline(&f, &calls).unwrap();
    f.finish(Outcome::default()).unwrap();
    assert_eq!(calls.model.load(Ordering::SeqCst), 0, "the model-output edit answered the changed call");
    assert_eq!(published["would_publish"]["checked"], "edited analysis", "{published}");
    let fork = fork_events(&store, &f.run_id());
    let model = fork.iter().find(|e| e.kind == EventType::ModelCall).unwrap();
    assert_eq!(model.output_ref, Some(answer), "{model:?}");

    // Its replay is exact.
    let r = Session::replay(store.clone(), &f.run_id(), SessionOptions::default()).unwrap();
    assert_eq!(pipeline(&r, &calls).unwrap(), published);
    r.finish(Outcome::default()).unwrap();
}

/// A fork whose program ends before taking the source's steps before the fork point (it
/// exited early, with status 0) diverges with `steps_left` naming the first step not taken: it
/// was stored `ok` with those steps counted as "same" and no edit applied (QA22 D3).
#[test]
fn a_fork_whose_program_ends_before_the_fork_point_diverges_with_steps_left() {
    let store = store();
    let source = record(&store);
    let events = store.events(&source, 1, 100).unwrap();
    let step = |kind: EventType, name: &str| {
        events.iter().find(|e| e.kind == kind && e.name.as_deref() == Some(name)).unwrap().seq
    };
    let (analyse, publish) =
        (step(EventType::ModelCall, "openai/chat.completions"), step(EventType::ToolCall, "publish"));
    let f =
        Session::fork_new(store.clone(), &source, Some(publish), vec![], SessionOptions::default()).unwrap();
    let a = f.agent("pipeline");
    let _: Value = a
        .tool("fetch", &json!({"q": "rates"}), ToolSpec::time_bound("1", 3600), || Ok::<_, String>(json!({})))
        .unwrap();
    let err = f.finish(Outcome { exit_status: Some(0) }).unwrap_err();
    let d = err.divergence().unwrap_or_else(|| panic!("{err}"));
    assert_eq!((d.code, d.seq), (retrace_core::DivergenceCode::StepsLeft, Some(analyse)), "{d}");
    assert!(d.to_string().contains("before the fork point"), "{d}");
    assert_eq!(store.run(&f.run_id()).unwrap().status, retrace_core::run::RunStatus::Diverged);

    // A program that failed before the fork point is reported as failed, not as steps left.
    let f =
        Session::fork_new(store.clone(), &source, Some(publish), vec![], SessionOptions::default()).unwrap();
    let report = f.finish(Outcome { exit_status: Some(1) }).unwrap();
    assert_eq!(report.status, retrace_core::run::RunStatus::Failed);
}
