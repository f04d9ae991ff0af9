//! `retrace simulate`: a local stand-in for the OpenAI and Anthropic APIs.
use anyhow::Context;
use clap::Parser;
use retrace_demo::providers::Providers;

/// The examples every help shows.
macro_rules! examples {
    () => {
        "Examples:\n  \
         retrace simulate --addr 127.0.0.1:8100 &\n  \
         retrace record --upstream-openai http://127.0.0.1:8100/v1 \\\n      \
         --upstream-anthropic http://127.0.0.1:8100 -- python app.py"
    };
}

/// Serve a local stand-in for the OpenAI and Anthropic APIs (the demo's simulator, not a model).
#[derive(Debug, Parser)]
#[command(
    after_help = examples!(),
    after_long_help = concat!(
        "Serve a local stand-in for the OpenAI and Anthropic HTTP APIs (Chat Completions, Responses, \
Embeddings, Messages; streaming and not), so record and replay can be tried without an API key. \
It is the demo's simulator, not a model: it answers random words, with fresh ids each call. \
Prints its address on standard output, then serves until interrupted.",
        "\n\n",
        examples!()
    )
)]
pub struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8100")]
    addr: String,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let providers =
            Providers::start(&args.addr).await.with_context(|| format!("listening on {}", args.addr))?;
        println!("http://{}", providers.addr());
        eprintln!(
            "retrace: simulating OpenAI at {} and Anthropic at {} (not a model: random words)",
            providers.openai_url(),
            providers.anthropic_url()
        );
        let _ = tokio::signal::ctrl_c().await;
        providers.stop().await;
        Ok(())
    })
}
