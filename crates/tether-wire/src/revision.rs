//! The protocol revisions tether serves: with sessions (the session era,
//! [`SUPPORTED`]) and without (the sessionless era, from 2026-07-28, [`SESSIONLESS`]).

/// Served, newest first.
pub const SUPPORTED: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26"];
/// Offered when a client asks for a revision not served.
pub const LATEST: &str = "2025-11-25";
/// Assumed when a request after initialize carries no `MCP-Protocol-Version`.
pub const ASSUMED: &str = "2025-03-26";

/// The sessionless revisions served, newest first.
pub const SESSIONLESS: &[&str] = &["2026-07-28"];
/// The first sessionless revision: a version at or after it is sessionless.
pub const FIRST_SESSIONLESS: &str = "2026-07-28";

/// Whether `v` names a revision of the sessionless era (served or not):
/// revision names are dates, so they order as strings.
pub fn is_sessionless(v: &str) -> bool {
    v >= FIRST_SESSIONLESS
}

/// Whether tether serves revision `v`.
pub fn is_supported(v: &str) -> bool {
    SUPPORTED.contains(&v)
}

/// The revision to answer an `initialize` asking for `requested` with.
pub fn negotiate(requested: Option<&str>) -> &'static str {
    requested.and_then(|r| SUPPORTED.iter().find(|v| **v == r).copied()).unwrap_or(LATEST)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiates_known_versions_and_offers_latest_otherwise() {
        assert_eq!(negotiate(Some("2025-06-18")), "2025-06-18");
        assert_eq!(negotiate(Some("2099-01-01")), LATEST);
        assert_eq!(negotiate(None), LATEST);
    }

    #[test]
    fn sessionless_revisions_are_those_from_2026_07_28_on() {
        assert!(is_sessionless("2026-07-28") && is_sessionless("2027-01-01"));
        assert!(!is_sessionless("2025-11-25") && !is_sessionless("2025-03-26"));
    }
}
