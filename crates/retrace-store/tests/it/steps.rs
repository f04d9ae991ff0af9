//! Steps for the SQLite tests that commit events one at a time.
use retrace_core::{Digest, Event, EventType};
use retrace_store::{Batch, BlobHint, BlobPut};

/// A batch of one tool call of `run` at `seq` by agent `agent`, chained onto `prev`, carrying
/// its request and output as raw blobs.
pub fn tool_call(run: &str, seq: u64, request: String, output: String, prev: Option<Digest>) -> Batch {
    let (request, output) =
        (BlobPut::new(request.into_bytes(), BlobHint::Raw), BlobPut::new(output.into_bytes(), BlobHint::Raw));
    let mut e = Event::new(run, "agent", EventType::ToolCall);
    e.seq = seq;
    e.key = Digest::of(seq.to_string().as_bytes());
    e.request_ref = Some(request.digest());
    e.output_ref = Some(output.digest());
    e.seal(prev).unwrap();
    Batch { run_id: run.into(), events: vec![e], blobs: vec![request, output], cache: Vec::new() }
}
