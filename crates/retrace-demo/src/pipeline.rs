//! The 8-step pipeline: plan → research → analyse → critique → revise → compose → verify →
//! publish, one agent per step, writing a short brief.
//!
//! Five steps ask the model over HTTP; `research` is a `time_bound` tool (a web search, cached
//! for an hour), `verify` a `deterministic` one (checks over the text), and `publish` a
//! `side_effect` with a dry run (a fork never publishes). The critic's prompt is the template
//! `critique@v1`, so a fork can hand it the stricter `v2` (`prompt:critic=v2`). Every step's
//! input holds the previous step's output (compose and the report also the critique), so a
//! change flows downstream and nothing upstream. The job id (a recorded random step) is named in
//! every model request and in `verify`'s arguments, so two runs never share a cached answer.
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use retrace_runtime::{Agent, ModelCall, RuntimeResult, Session, ToolSpec};
use serde_json::{json, Value};

use crate::client::ChatClient;

/// The steps in order, each with the agent that takes it.
pub const STEPS: [(&str, &str); 8] = [
    ("plan", "planner"),
    ("research", "researcher"),
    ("analyse", "analyst"),
    ("critique", "critic"),
    ("revise", "reviser"),
    ("compose", "composer"),
    ("verify", "verifier"),
    ("publish", "publisher"),
];

/// What the brief is about.
pub const TOPIC: &str = "refunds for late returns";

/// The research tool's cache lifetime: search results are good for an hour.
pub const RESEARCH_TTL_S: u64 = 3600;

/// The critic's template, `name@version`.
pub const CRITIQUE_TEMPLATE: &str = "critique@v1";

/// The built-in versions of the critic's template.
pub const CRITIQUE_PROMPTS: [(&str, &str); 2] = [
    ("v1", "Critique this analysis of {topic}. Point out what is missing.\n\n{analysis}"),
    (
        "v2",
        "Critique this analysis of {topic} strictly: flag every claim without a source, every vague \
         number and every case the policy does not cover.\n\n{analysis}",
    ),
];

/// How many times each tool's live function ran (side effects included), for checking that
/// replays and forks run nothing they shouldn't.
#[derive(Clone, Debug, Default)]
pub struct ToolCalls {
    /// `web.search` (research).
    pub research: Arc<AtomicUsize>,
    /// `report.verify` (verify).
    pub verify: Arc<AtomicUsize>,
    /// `cms.publish` (publish).
    pub publish: Arc<AtomicUsize>,
}

impl ToolCalls {
    /// Live runs of (research, verify, publish).
    pub fn counts(&self) -> [usize; 3] {
        [&self.research, &self.verify, &self.publish].map(|c| c.load(Ordering::SeqCst))
    }
}

/// What the pipeline produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Brief {
    /// The job id (a recorded random step).
    pub job: String,
    /// The final text.
    pub report: String,
    /// What `verify` found.
    pub checks: Value,
    /// What `publish` returned (a dry run says it published nothing).
    pub published: Value,
}

/// Runs the pipeline on `session`; the model steps call `client`, the tools count their live
/// runs in `tools`.
pub async fn pipeline(session: &Session, client: &ChatClient, tools: &ToolCalls) -> RuntimeResult<Brief> {
    let planner = step_agent(session, "planner");
    let job = planner.random_id()?;
    let ask = Ask { client, job: &job };
    let plan = ask.chat(&planner, format!("Plan a one-page brief on {TOPIC}."), 48).await?;
    planner.exit();

    let researcher = step_agent(session, "researcher");
    let spec = ToolSpec::time_bound("1", RESEARCH_TTL_S);
    let sources: Value = researcher
        .tool_async("web.search", &json!({ "topic": TOPIC, "plan": plan }), spec, || async {
            tools.research.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(search_results())
        })
        .await?;
    researcher.exit();

    let analyst = step_agent(session, "analyst");
    let analysis = ask.chat(&analyst, format!("Analyse these sources for the brief: {sources}"), 64).await?;
    analyst.exit();

    let critic = step_agent(session, "critic").with_prompt_template(CRITIQUE_TEMPLATE);
    let prompt = critic.template(&json!({ "topic": TOPIC, "analysis": analysis }))?;
    let critique = ask.chat(&critic, prompt, 64).await?;
    critic.exit();

    let reviser = step_agent(session, "reviser");
    let revise =
        format!("Revise the analysis to answer the critique.\nAnalysis: {analysis}\nCritique: {critique}");
    let revised = ask.chat(&reviser, revise, 80).await?;
    reviser.exit();

    let composer = step_agent(session, "composer");
    let compose = format!("Write the final brief on {TOPIC} from: {revised}\nIt must answer: {critique}");
    let body = ask.chat(&composer, compose, 96).await?;
    let report = format!("# Brief: {TOPIC}\n\n{body}\n\n## Review\n- {critique}\n- {revised}\n");
    composer.exit();

    let verifier = step_agent(session, "verifier");
    let checks: Value = verifier
        .tool_async(
            "report.verify",
            &json!({ "job": job, "report": report }),
            ToolSpec::deterministic("1"),
            || async {
                tools.verify.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(verify(&report))
            },
        )
        .await?;
    verifier.exit();

    let publisher = step_agent(session, "publisher");
    let target = format!("report:{job}");
    let ok = checks["ok"].as_bool().unwrap_or(false);
    publisher.decide(if ok { "publish" } else { "hold" }, Some(&target))?;
    let published = if ok {
        let slug = format!("briefs/{job}");
        let spec = ToolSpec::side_effect("1").with_dry_run(
            |args| json!({ "published": false, "dry_run": true, "would_publish": args["slug"] }),
        );
        let args = json!({ "slug": slug, "report": report, "checks": checks });
        publisher
            .tool_async("cms.publish", &args, spec, || async {
                tools.publish.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(json!({ "published": true, "url": format!("https://cms.example/{slug}") }))
            })
            .await?
    } else {
        Value::Null
    };
    publisher.exit();
    Ok(Brief { job, report, checks, published })
}

fn step_agent(session: &Session, id: &str) -> Agent {
    let step = STEPS.iter().find(|(_, agent)| *agent == id).map_or(id, |(step, _)| step);
    session.agent(id).with_role(step)
}

/// How the steps ask the model: through `client`, on behalf of job `job` (named in every
/// request, so two jobs never share a cached answer).
struct Ask<'a> {
    client: &'a ChatClient,
    job: &'a str,
}

impl Ask<'_> {
    /// One chat completion; returns the reply's text.
    async fn chat(&self, agent: &Agent, prompt: String, max_tokens: u64) -> RuntimeResult<String> {
        let system = format!("You are the {} of a small research team, on job {}.", agent.id(), self.job);
        let body = json!({
            "model": "sim-1",
            "temperature": 0,
            "max_tokens": max_tokens,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
        });
        let call = ModelCall { provider: "openai".into(), endpoint: "chat.completions".into(), body };
        let client = &self.client;
        let reply = agent.model_async(&call, |body| async move { client.chat(&body).await }).await?;
        Ok(reply["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned())
    }
}

/// What the search finds (a stand-in for a live web search).
fn search_results() -> Value {
    json!({"hits": [
        {"url": "https://example.com/policy/refunds", "text": "Refunds are granted within 30 days of purchase."},
        {"url": "https://example.com/policy/credit", "text": "After 30 days, offer store credit."},
        {"url": "https://example.com/blog/late-returns", "text": "Most late returns arrive within 45 days."}
    ]})
}

/// The checks `report.verify` makes: a pure function of the text, naming the digest it checked.
fn verify(report: &str) -> Value {
    let words = report.split_whitespace().count();
    let has_title = report.starts_with("# ");
    let checked = retrace_core::Digest::of(report.as_bytes()).to_string();
    json!({ "words": words, "has_title": has_title, "ok": has_title && words >= 8, "checked": checked })
}

/// The critic's template versions written as `critique/<version>.txt` under a fresh temporary
/// folder (the session's `prompts_dir`), removed when dropped.
#[derive(Debug)]
pub struct Prompts {
    dir: PathBuf,
}

impl Prompts {
    /// Writes the built-in prompts.
    pub fn write() -> std::io::Result<Prompts> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let name = format!("retrace-pipeline-prompts-{}-{}", std::process::id(), nanos.as_nanos());
        let prompts = Prompts { dir: std::env::temp_dir().join(name) };
        let critique = prompts.dir.join("critique");
        std::fs::create_dir_all(&critique)?;
        for (version, text) in CRITIQUE_PROMPTS {
            std::fs::write(critique.join(format!("{version}.txt")), text)?;
        }
        Ok(prompts)
    }

    /// The folder to use as `SessionOptions::prompts_dir`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Prompts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
