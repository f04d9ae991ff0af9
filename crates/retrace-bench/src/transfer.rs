//! Export and import (`retrace_store::export` / `import`): events/s for a run of 1 KB steps,
//! and MB/s for a file dominated by blobs of 64 KB..512 KB.
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;
use std::time::{Duration, Instant};

use retrace_store::export::export_run;
use retrace_store::import::{import_reader, ImportOptions, ImportOutcome};
use retrace_store::{Durability, Store};
use sha2::{Digest as _, Sha256};

use crate::drive;
use crate::env::{note, Config};
use crate::payload::{document, output, request, Rng};
use crate::report::{median, print, Line, Target};

/// Runs the bench and prints its lines.
pub fn run(cfg: &Config, lines: &mut Vec<Line>) {
    let n: u64 = cfg.pick(10_000, 100_000);
    note(&format!("export/import: recording {n} events of 1 KB + 1 KB (setup, untimed)"));
    let source = cfg.store("export", Durability::Batch);
    let run_id = drive::record_generated(source.store.clone(), n, |i| (request(i), output(i)));
    let (exports, imports, _) = measure(cfg, source.store.as_ref(), &run_id, n);
    print(
        lines,
        Line::new(
            "export 1 KB events",
            n as f64 / median(&exports),
            "ev/s",
            None,
            Target::AtLeast(100_000.0),
        ),
    );
    print(
        lines,
        Line::new(
            "import 1 KB events (full verification)",
            n as f64 / median(&imports),
            "ev/s",
            None,
            Target::AtLeast(50_000.0),
        ),
    );

    let k: u64 = cfg.pick(100, 400);
    let size = |i: u64| Rng::new(i).between(64 << 10, 512 << 10) as usize;
    note(&format!("export/import: recording {k} events with 64..512 KB outputs (setup, untimed)"));
    let source = cfg.store("export-blobs", Durability::Batch);
    let run_id = drive::record_generated(source.store.clone(), k, |i| (request(i), document(i, size(i))));
    let (exports, imports, bytes) = measure(cfg, source.store.as_ref(), &run_id, k);
    let mb = bytes as f64 / 1e6;
    note(&format!("blob-heavy trace file: {mb:.1} MB"));
    let floor = mb / median(&raw_pass(cfg, source.store.as_ref(), &run_id));
    print(
        lines,
        Line::new(
            "export blob-heavy file",
            mb / median(&exports),
            "MB/s",
            Some(floor),
            Target::AtLeast(200.0),
        ),
    );
    print(
        lines,
        Line::new(
            "import blob-heavy file (verified)",
            mb / median(&imports),
            "MB/s",
            Some(floor),
            Target::AtLeast(200.0),
        ),
    );
    print(lines, Line::new("blob-heavy floor: read file + sha256", floor, "MB/s", None, Target::Info));
}

/// Times `repeats` exports of the run to a file and imports of that file into fresh stores.
/// Returns both lists of seconds and the file's size.
fn measure(cfg: &Config, store: &dyn Store, run_id: &str, n: u64) -> (Vec<f64>, Vec<f64>, u64) {
    let dir = cfg.temp_dir("trace");
    let path = dir.path().join("run.jsonl");
    let (mut exports, mut imports) = (vec![], vec![]);
    for _ in 0..cfg.repeats {
        exports.push(export_to(store, run_id, &path).as_secs_f64());
        // The export's pages go to disk now, untimed, rather than during the import, whose
        // syncs would queue behind them.
        File::open(&path).and_then(|f| f.sync_all()).expect("syncing the trace");
        let target = cfg.store("import", Durability::Batch);
        let began = Instant::now();
        let reader = BufReader::with_capacity(1 << 20, File::open(&path).expect("opening the trace"));
        let outcome =
            import_reader(target.store.as_ref(), reader, ImportOptions::default()).expect("importing");
        imports.push(began.elapsed().as_secs_f64());
        match outcome {
            ImportOutcome::Imported { events, .. } => assert_eq!(events, n),
            other => panic!("expected a fresh import, got {other:?}"),
        }
    }
    let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    (exports, imports, bytes)
}

fn export_to(store: &dyn Store, run_id: &str, path: &Path) -> Duration {
    let began = Instant::now();
    let mut file = File::create(path).expect("creating the trace file");
    let stats = export_run(store, run_id, &mut file, &mut |_| {}).expect("exporting");
    assert!(stats.events > 0);
    began.elapsed()
}

/// The floor of moving a trace file: read it in 1 MB buffers and sha256 every byte (seconds).
fn raw_pass(cfg: &Config, store: &dyn Store, run_id: &str) -> Vec<f64> {
    let dir = cfg.temp_dir("raw");
    let path = dir.path().join("run.jsonl");
    export_to(store, run_id, &path);
    let mut buf = vec![0u8; 1 << 20];
    (0..cfg.repeats)
        .map(|_| {
            let began = Instant::now();
            let mut file = File::open(&path).expect("opening the trace");
            let mut hasher = Sha256::new();
            loop {
                let read = file.read(&mut buf).expect("reading the trace");
                if read == 0 {
                    break;
                }
                hasher.update(&buf[..read]);
            }
            std::hint::black_box(hasher.finalize());
            began.elapsed().as_secs_f64()
        })
        .collect()
}
