//! The history checker (`support/history.rs`) catches each broken rule:
//! hand-made histories, one rule broken in each, and a clean one it passes.
//! A checker that passes everything would make every fault test worthless.

mod support;

use support::history::{History, Seen};

fn response(id: u64) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"n":{id}}}}}"#)
}

fn note(n: u64) -> String {
    format!(r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"data":{n}}}}}"#)
}

/// Request 1 on session `s`: primed, one notification, its response; all
/// stored and replayed.
fn clean() -> History {
    let h = History::new();
    h.sent("s", 1);
    h.read("s", 1, vec![Seen::new("ra.0", ""), Seen::new("ra.1", note(1)), Seen::new("ra.2", response(1))]);
    h.replayed("s", "ra.0", vec![Seen::new("ra.1", note(1)), Seen::new("ra.2", response(1))]);
    h
}

fn violations(h: &History) -> Vec<String> {
    let report = h.check();
    report.violations
}

#[test]
fn a_clean_history_passes_with_its_totals() {
    let report = clean().check();
    report.assert_clean();
    assert_eq!((report.requests, report.acknowledged, report.events_checked), (1, 1, 3));
}

#[test]
fn an_event_read_twice_is_caught() {
    let h = clean();
    h.read("s", 1, vec![Seen::new("ra.2", response(1))]);
    let report = h.check();
    assert_eq!(report.duplicated, 1, "{:?}", report.violations);
}

#[test]
fn events_out_of_order_are_caught() {
    let h = History::new();
    h.sent("s", 1);
    h.read("s", 1, vec![Seen::new("ra.0", ""), Seen::new("ra.2", response(1)), Seen::new("ra.1", note(1))]);
    h.replayed("s", "ra.0", vec![Seen::new("ra.1", note(1)), Seen::new("ra.2", response(1))]);
    let report = h.check();
    assert_eq!(report.reordered, 1, "{:?}", report.violations);
}

#[test]
fn a_replay_out_of_order_is_caught() {
    let h = clean();
    h.replayed("s", "ra.0", vec![Seen::new("ra.2", response(1)), Seen::new("ra.1", note(1))]);
    assert_eq!(h.check().reordered, 1);
}

#[test]
fn a_priming_event_may_repeat_the_resume_position_but_not_go_back() {
    let h = clean();
    // A resumption's priming event names the ID it resumes from: fine.
    h.read("s", 1, vec![Seen::new("ra.2", "")]);
    h.check().assert_clean();
    h.read("s", 1, vec![Seen::new("ra.1", "")]);
    assert_eq!(h.check().reordered, 1);
}

#[test]
fn an_acknowledged_response_that_does_not_replay_is_caught() {
    let h = History::new();
    h.sent("s", 1);
    h.read("s", 1, vec![Seen::new("ra.0", ""), Seen::new("ra.1", response(1))]);
    // The stream replays empty: the store does not have what was sent.
    h.replayed("s", "ra.0", vec![]);
    let report = h.check();
    assert!(report.lost >= 1, "{:?}", report.violations);
    assert!(violations(&h).iter().any(|v| v.contains("does not replay")), "{:?}", violations(&h));
}

#[test]
fn an_event_read_but_never_stored_is_caught() {
    let h = History::new();
    h.sent("s", 1);
    h.read("s", 1, vec![Seen::new("ra.0", ""), Seen::new("ra.1", note(7)), Seen::new("ra.2", response(1))]);
    // Stored: the response, not the notification the client read.
    h.replayed("s", "ra.0", vec![Seen::new("ra.2", response(1))]);
    let report = h.check();
    assert_eq!(report.lost, 1, "{:?}", report.violations);
    assert!(report.violations[0].contains("not stored"), "{:?}", report.violations);
}

#[test]
fn a_stream_never_replayed_counts_as_unchecked_and_fails() {
    let h = History::new();
    h.sent("s", 1);
    h.read("s", 1, vec![Seen::new("ra.0", ""), Seen::new("ra.1", response(1))]);
    assert!(!h.check().is_clean());
}

#[test]
fn an_event_in_two_versions_is_caught() {
    let h = clean();
    // Another read of the same stream (e.g. another client) shows other data under ra.1.
    h.replayed("s", "ra.0", vec![Seen::new("ra.1", note(99)), Seen::new("ra.2", response(1))]);
    let report = h.check();
    assert!(report.duplicated >= 1, "{:?}", report.violations);
}

#[test]
fn a_primed_request_that_never_ends_is_caught() {
    let h = History::new();
    h.sent("s", 1);
    h.read("s", 1, vec![Seen::new("ra.0", ""), Seen::new("ra.1", note(1))]);
    h.replayed("s", "ra.0", vec![Seen::new("ra.1", note(1))]);
    let report = h.check();
    assert_eq!(report.unended, 1, "{:?}", report.violations);
}

#[test]
fn a_request_with_two_final_messages_is_caught() {
    let h = History::new();
    h.sent("s", 1);
    h.read("s", 1, vec![Seen::new("ra.0", ""), Seen::new("ra.1", response(1))]);
    // The store holds a second final (an "interrupted" after the result).
    let interrupted = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"interrupted"}}"#;
    h.replayed("s", "ra.0", vec![Seen::new("ra.1", response(1)), Seen::new("ra.2", interrupted)]);
    let report = h.check();
    assert_eq!(report.duplicated, 1, "{:?}", report.violations);
}

#[test]
fn a_response_to_another_request_on_this_stream_is_misrouted() {
    let h = History::new();
    h.sent("s", 1);
    h.sent("s", 2);
    h.read("s", 1, vec![Seen::new("ra.0", ""), Seen::new("ra.1", response(2)), Seen::new("ra.2", response(1))]);
    h.replayed("s", "ra.0", vec![Seen::new("ra.1", response(2)), Seen::new("ra.2", response(1))]);
    let report = h.check();
    assert_eq!(report.misrouted, 1, "{:?}", report.violations);
}

#[test]
fn an_event_of_another_stream_is_misrouted() {
    let h = clean();
    h.read("s", 1, vec![Seen::new("rb.3", note(3))]);
    let report = h.check();
    assert_eq!(report.misrouted, 1, "{:?}", report.violations);
}

#[test]
fn a_request_id_sent_twice_is_caught() {
    let h = clean();
    h.sent("s", 1);
    assert!(!h.check().is_clean());
}

/// A history whose reads are stamped with `clock` (the power-loss tests
/// stamp them with the WAL's fsync count).
fn clocked() -> (History, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    let clock = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let read = clock.clone();
    (History::with_clock(move || read.load(std::sync::atomic::Ordering::Relaxed)), clock)
}

#[test]
fn a_loss_the_store_is_allowed_is_counted_not_failed() {
    let (h, clock) = clocked();
    h.sent("s", 1);
    h.read("s", 1, vec![Seen::new("ra.0", ""), Seen::new("ra.1", note(1))]);
    clock.store(1, std::sync::atomic::Ordering::Relaxed);
    h.read("s", 1, vec![Seen::new("ra.2", response(1))]);
    // After the cut the response is gone and a restart ended the request otherwise.
    let interrupted = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"interrupted"}}"#;
    h.replayed("s", "ra.0", vec![Seen::new("ra.1", note(1)), Seen::new("ra.2", interrupted)]);
    let report = h.check_with(|stamp| stamp >= 1);
    report.assert_clean();
    assert_eq!(report.allowed_losses, 1);
    // The same history where nothing may be lost fails.
    assert!(!h.check().is_clean());
}

#[test]
fn a_loss_before_the_last_sync_is_caught() {
    let (h, _clock) = clocked();
    h.sent("s", 1);
    h.read("s", 1, vec![Seen::new("ra.0", ""), Seen::new("ra.1", note(1)), Seen::new("ra.2", response(1))]);
    h.replayed("s", "ra.0", vec![Seen::new("ra.1", note(1))]);
    let report = h.check_with(|stamp| stamp >= 1);
    assert!(report.lost >= 1, "{:?}", report.violations);
}

#[test]
fn a_loss_in_the_middle_of_a_stream_is_caught() {
    let (h, clock) = clocked();
    clock.store(1, std::sync::atomic::Ordering::Relaxed);
    h.sent("s", 1);
    h.read("s", 1, vec![Seen::new("ra.0", ""), Seen::new("ra.1", note(1)), Seen::new("ra.2", response(1))]);
    // ra.1 is gone but ra.2 after it survived: not what a power loss does.
    h.replayed("s", "ra.0", vec![Seen::new("ra.2", response(1))]);
    let report = h.check_with(|stamp| stamp >= 1);
    assert!(report.violations.iter().any(|v| v.contains("survived but")), "{:?}", report.violations);
}
