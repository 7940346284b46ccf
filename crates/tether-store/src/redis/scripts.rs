//! The Lua scripts (`scripts/*.lua`), one per multi-key step, loaded once
//! per store; each file says at its top what the script does and what its
//! KEYS and ARGV are.
//!
//! Invariant: a script is one atomic step on the server, so no lock is ever
//! held across a round trip; the functions several scripts share (`drop`,
//! `records`) are put in front of them here, never copied into their files.

use redis::Script;

/// The function `drop(b)` the scripts that remove sessions begin with.
const DROP_SESSION: &str = include_str!("scripts/drop_session.lua");
/// The function `records(blob)` the scripts that read a stream stored whole begin with.
const RECORDS: &str = include_str!("scripts/records.lua");

/// One script per multi-key step; each file says at its top what the script
/// does and what its KEYS and ARGV are.
pub(super) struct Scripts {
    pub(super) create: Script,
    pub(super) update: Script,
    pub(super) touch: Script,
    pub(super) delete: Script,
    pub(super) expire: Script,
    pub(super) streams: Script,
    pub(super) set_cursor: Script,
    pub(super) kv_cas: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        let with_drop = |body: &str| Script::new(&format!("{DROP_SESSION}\n{body}"));
        Self {
            create: with_drop(include_str!("scripts/create_session.lua")),
            update: Script::new(include_str!("scripts/update_session_state.lua")),
            touch: Script::new(include_str!("scripts/touch_session.lua")),
            delete: with_drop(include_str!("scripts/delete_session.lua")),
            expire: with_drop(include_str!("scripts/expire_sessions.lua")),
            streams: Script::new(&format!("{RECORDS}\n{}", include_str!("scripts/streams.lua"))),
            set_cursor: Script::new(include_str!("scripts/set_cursor.lua")),
            kv_cas: Script::new(include_str!("scripts/kv_compare_and_set.lua")),
        }
    }
}

/// The append operation (`append.lua`), run by a [`super::BatchedOp`] once
/// per call.
pub(super) fn append() -> String {
    format!("{RECORDS}\n{}", include_str!("scripts/append.lua"))
}
