//! `verify_run`: a sound run has no problems; each kind of damage is found and named.
use retrace_core::{Digest, EventType};
use retrace_store::verify::{verify_all, verify_run, Problem, ProblemKind};
use retrace_store::Store;

use super::trace_fixture::{conversation, memory, sqlite, Fixture};

fn problems_after(edit: impl FnOnce(&mut Fixture)) -> Vec<Problem> {
    let backend = memory();
    let mut fixture = conversation("01verify", 3);
    edit(&mut fixture);
    fixture.commit(&*backend.store);
    verify_run(&*backend.store, "01verify")
}

fn only(problems: &[Problem], kind: ProblemKind, seq: Option<u64>, needle: &str) {
    assert_eq!(problems.len(), 1, "{problems:#?}");
    let p = &problems[0];
    assert_eq!((p.kind, p.seq, p.run.as_str()), (kind, seq, "01verify"), "{p}");
    assert!(p.to_string().contains(needle), "{p} lacks {needle:?}");
}

#[test]
fn a_sound_run_has_no_problems() {
    for backend in [memory(), sqlite()] {
        conversation("01verify", 3).commit(&*backend.store);
        conversation("01second", 2).commit(&*backend.store);
        assert_eq!(verify_run(&*backend.store, "01verify"), vec![]);
        assert_eq!(verify_all(&*backend.store), vec![]);
    }
}

#[test]
fn a_tampered_event_is_a_hash_mismatch_at_its_seq() {
    let problems = problems_after(|f| f.events[6].latency_ms = Some(1));
    only(&problems, ProblemKind::Hash, Some(7), "run 01verify seq 7: hash mismatch");
}

#[test]
fn a_broken_chain_is_found() {
    let problems = problems_after(|f| {
        f.events[4].seal(Some(Digest::of(b"elsewhere"))).unwrap();
        f.reseal_from(5);
    });
    only(&problems, ProblemKind::Chain, Some(5), "chain broken");
}

#[test]
fn clocks_and_causality() {
    let problems = problems_after(|f| {
        f.events[5].lamport = 1; // planner's send at seq 6 after its clock reached 2
        f.reseal_from(5);
    });
    assert!(problems.iter().any(|p| p.kind == ProblemKind::Lamport && p.seq == Some(6)), "{problems:#?}");
    let problems = problems_after(|f| {
        let send = f.events[1].lamport;
        f.events[2].lamport = send; // the delivery of seq 2 is not after its send
        f.reseal_from(2);
    });
    assert!(
        problems
            .iter()
            .any(|p| p.kind == ProblemKind::Lamport && p.seq == Some(3) && p.message.contains("its send")),
        "{problems:#?}"
    );
    let problems = problems_after(|f| {
        f.events[3].causal_parent = Some(9);
        f.reseal_from(3);
    });
    only(&problems, ProblemKind::Causal, Some(4), "causal_parent 9 is not an earlier event");
    let problems = problems_after(|f| {
        f.events[2].causal_parent = Some(1); // a deliver whose parent is a model call
        f.reseal_from(2);
    });
    only(&problems, ProblemKind::Causal, Some(3), "not a send");
    let problems = problems_after(|f| {
        f.events[3].inbound = vec![2];
        f.reseal_from(3);
    });
    only(&problems, ProblemKind::Inbound, Some(4), "inbound 2 is not an earlier deliver to reviewer");
}

#[test]
fn head_and_run_id() {
    let problems = problems_after(|f| f.meta.head = Some(Digest::of(b"x")));
    only(&problems, ProblemKind::Head, Some(13), "run head");
    let problems = problems_after(|f| {
        f.events[7].run_id = "01other".into();
        f.reseal_from(7);
    });
    only(&problems, ProblemKind::RunId, Some(8), "names run 01other");
}

#[test]
fn a_missing_blob_is_named() {
    let backend = memory();
    let mut fixture = conversation("01verify", 1);
    let ghost = Digest::of(b"never stored");
    fixture.events[0].output_ref = Some(ghost);
    fixture.reseal_from(0);
    fixture.commit(&*backend.store);
    let problems = verify_run(&*backend.store, "01verify");
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_eq!((problems[0].kind, problems[0].digest), (ProblemKind::BlobMissing, Some(ghost)));
    assert!(problems[0].to_string().contains(&ghost.to_string()));
}

#[test]
fn a_corrupted_blob_file_is_named() {
    let backend = sqlite();
    let fixture = conversation("01verify", 2);
    fixture.commit(&*backend.store);
    // Turn 1's tool output is 100 KB: a file in the blob folder.
    let big = fixture.events.iter().find(|e| e.kind == EventType::ToolCall && e.seq > 4).unwrap();
    let digest = big.output_ref.unwrap();
    let dir = backend.dir.as_ref().unwrap().path().join("blobs");
    let file = find_file(&dir, &digest.hex()).expect("the big blob is a file");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[10] ^= 1;
    std::fs::write(&file, bytes).unwrap();
    let problems = verify_run(&*backend.store, "01verify");
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_eq!(
        (problems[0].kind, problems[0].digest, problems[0].seq),
        (ProblemKind::BlobCorrupt, Some(digest), Some(big.seq))
    );
    assert!(backend.store.get_blob(&digest).is_err());
}

fn find_file(dir: &std::path::Path, hex: &str) -> Option<std::path::PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find_file(&path, hex) {
                return Some(found);
            }
        } else if path.to_string_lossy().replace('/', "").contains(&hex[6..]) {
            return Some(path);
        }
    }
    None
}

#[test]
fn a_missing_run_is_a_problem_not_a_panic() {
    let backend = memory();
    let problems = verify_run(&*backend.store, "01nothere");
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].kind, ProblemKind::Unreadable);
    assert!(verify_all(&*backend.store).is_empty());
    let _: &dyn Store = &*backend.store;
}
