//! `resolve`: answering a side effect whose intent was logged and whose completion was not.
use retrace_core::envelope::{ToolClass, ToolRef};
use retrace_core::run::RunMode;
use retrace_core::EventType;

use super::*;

/// The idempotency key `resolve` names is the one the side-effect function was handed
/// (`RUN/AGENT/TOOL#N`, N counting the agent's side effects of that tool: the Python SDK's
/// `_tool_flow`), so a person can look the call up where it may have landed.
#[test]
fn resolve_names_the_idempotency_key_the_side_effect_received() {
    let mut b = Builder::new(RUN);
    let side_effect = |name: &str| {
        let tool =
            ToolRef { name: name.into(), version: "1".into(), class: ToolClass::SideEffect, ttl_s: None };
        move |e: &mut retrace_core::Event| e.tool = Some(tool)
    };
    for name in ["mail.send", "pay", "mail.send"] {
        let intent = b.push("payer", EventType::Intent, Some(name), None, None, side_effect(name));
        b.push("payer", EventType::ToolCall, Some(name), None, Some(b"{}".to_vec()), |e| {
            side_effect(name)(e);
            e.causal_parent = Some(intent);
        });
    }
    // The agent's second `pay` (its fifth side effect) never completed: its process died.
    let open = b.push("payer", EventType::Intent, Some("pay"), None, None, side_effect("pay"));
    let home = Home::with(&b.finish(RunMode::Record));
    // Neither answer, or both: the usage error names the two.
    home.run(&["resolve", RUN, &open.to_string()]).expect(2, &[], &["--outcome", "--not-executed"]);
    home.run(&["resolve", RUN, &open.to_string(), "--not-executed", "--outcome", "@x.json"]).expect(
        2,
        &[],
        &["cannot be used with"],
    );
    let resolved = home.run(&["resolve", RUN, &open.to_string(), "--not-executed", "--json"]);
    resolved.expect(0, &[], &[&format!("(pay by payer; idempotency key {RUN}/payer/pay#2) as not executed")]);
    // What it stored, for a script (QA37 S2).
    let said: serde_json::Value = serde_json::from_str(resolved.stdout().trim()).unwrap();
    assert_eq!(said["intent"], open, "{said}");
    assert_eq!((said["executed"].clone(), said["tool"].clone()), (false.into(), "pay".into()), "{said}");
    assert_eq!(said["idempotency_key"], format!("{RUN}/payer/pay#2"), "{said}");
    assert!(said["resolution"].as_u64().is_some_and(|s| s > open), "{said}");
}
