//! Processes racing each other on one store: recordings starting together on a home that
//! doesn't exist yet, and imports of one file at once. Every process is a real `retrace`,
//! spawned all at once, round after round.
use std::process::Child;

use retrace_core::mask::MaskKey;

use super::*;

/// Rounds of each race. Before the fix, a round of recordings failed about one time in ten
/// and a round of imports about one in three.
const ROUNDS: usize = 15;

/// Waits for each of `children` and what it printed.
fn wait_all(children: Vec<Child>) -> Vec<Ran> {
    children.into_iter().map(|c| Ran(c.wait_with_output().unwrap())).collect()
}

/// Exit codes and standard errors, for a failed assertion's message.
fn described(ran: &[Ran]) -> String {
    let each = ran.iter().map(|r| format!("exit {:?}: {}", r.0.status.code(), r.stderr()));
    each.collect::<Vec<_>>().join("\n")
}

#[test]
fn recordings_starting_together_on_a_new_home_all_record_under_one_key() {
    const PROCESSES: usize = 6;
    let homes = Home::new();
    let project = tempfile::tempdir().unwrap();
    for round in 0..2 * ROUNDS {
        let home = homes.file(&format!("home-{round}"));
        let children = (0..PROCESSES)
            .map(|_| {
                let mut c = homes.command(&["record", "--", "true"]);
                c.env("RETRACE_HOME", &home).env_remove("RETRACE_MASK_KEY").current_dir(project.path());
                c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
            })
            .collect();
        let ran = wait_all(children);
        let context = format!("round {round}:\n{}", described(&ran));
        // Every recording opens the new store and reads a whole key (none sees a partial one).
        assert!(ran.iter().all(|r| r.0.status.success()), "{context}");
        // One process generated the key; every other read it.
        let generated = ran.iter().filter(|r| r.stderr().contains("generated a mask key")).count();
        assert_eq!(generated, 1, "{context}");
        let key_file = home.join("mask.key");
        let key = MaskKey::from_base64(&std::fs::read_to_string(&key_file).unwrap()).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777, 0o600);
        // Each run was recorded under that key, and no temporary key file is left behind.
        let store = open_store(&StoreConfig::in_home(&home)).unwrap();
        let fingerprints: Vec<_> =
            store.runs().unwrap().into_iter().map(|r| r.mask_key_fingerprint).collect();
        assert_eq!(fingerprints, vec![Some(key.fingerprint()); PROCESSES], "{context}");
        let names: Vec<_> = std::fs::read_dir(&home).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(!names.iter().any(|n| n.to_string_lossy().contains(".mask.key.")), "{names:?}");
    }
}

#[test]
fn one_file_imported_at_once_by_several_processes_is_stored_once_and_none_fails() {
    const PROCESSES: usize = 3;
    let source = Home::with(&conversation(RUN, 3));
    let file = source.file("t.jsonl");
    let path = file.to_str().unwrap();
    source.run(&["export", RUN, "-o", path]).expect(0, &[], &[]);
    let exported = std::fs::read(&file).unwrap();
    for round in 0..ROUNDS {
        let home = Home::new();
        let children = (0..PROCESSES)
            .map(|_| {
                let mut c = home.command(&["import", path]);
                c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
            })
            .collect();
        let ran = wait_all(children);
        let context = format!("round {round}:\n{}", described(&ran));
        // Each says what it did: stored the run (one at least), or found it already present.
        for r in &ran {
            r.expect(0, &[RUN], &[]);
            let said = r.stderr();
            assert!(said.contains("imported run") || said.contains("already present"), "{context}");
        }
        assert!(ran.iter().any(|r| r.stderr().contains("imported run")), "{context}");
        home.run(&["verify", RUN]).expect(0, &["ok:"], &[]);
        assert_eq!(home.run(&["export", RUN]).0.stdout, exported, "{context}");
        let store = open_store(&StoreConfig::in_home(home.dir.path())).unwrap();
        let labels = store.run(RUN).unwrap().labels;
        assert!(!labels.contains_key(retrace_store::import::UNFINISHED_LABEL), "{context}");
    }
}
