//! Resource URIs as `[[policies]]` match them: one spelling per resource,
//! so that a rule's glob cannot be passed by spelling the URI otherwise.
//! Pure functions, no I/O.
//!
//! [`normalize`] applies RFC 3986's normalisations (section 6.2.2): the
//! scheme and the host in lowercase, escapes of unreserved characters
//! decoded (`%73` is `s`), the other escapes in uppercase hex, characters a
//! URI may not hold raw (a space inside, anything not ASCII) escaped, dot
//! segments of an absolute path removed, an empty or default port dropped;
//! and, for `file` (RFC 8089, read as POSIX does), `localhost` as the empty
//! authority (`file:///p`), `file:/p` as `file:///p`, repeated slashes as
//! one.
//!
//! What cannot be normalised safely is an error ([`Unsafe`], with the
//! scheme when one could be read), never a guess: a bad percent escape, a
//! `..` above the root, a control character, a space at either end, a raw
//! `\` (some parsers read it as `/`), an authority that does not parse; in
//! a `file` URI also an encoded `/`, `\` or NUL (`%2F`, `%5C`, `%00`), a host
//! other than `localhost`, a user or a port, a path that is not absolute,
//! and a query or fragment (a server that takes the text after `file://` as
//! a path reads `?/../..` as a traversal).
//!
//! Guarantees: [`normalize`] never panics; its result is ASCII and a
//! normalised URI normalises to itself; two spellings RFC 3986 (and, for
//! `file`, POSIX) call equal give the same result. [`normalize_glob`] puts
//! the literal parts of a rule's glob in the same form (`FILE:///secret/*`
//! and `file://localhost/secret/*` become `file:///secret/*`), and refuses a
//! glob that could never match a normalised URI (a `..` segment, `%2F` in a
//! `file` path) with a sentence saying why. [`glob_covers_scheme`] says
//! whether a glob may match URIs of a scheme: the rules that decide about a
//! URI that cannot be normalised.
//!
//! Not in scope: symbolic links and case-insensitive file systems (the URI
//! names a path; what the upstream's file system makes of it is its own),
//! hosts in Unicode (IDNA), and a server that decodes twice (`%252F`).

use std::fmt;

/// Why a URI cannot be normalised safely.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unsafe {
    /// The URI's scheme, lowercase, when one could be read.
    pub scheme: Option<String>,
    pub why: &'static str,
}

impl fmt::Display for Unsafe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.why)
    }
}

const BAD_ESCAPE: &str = "a `%` that does not start an escape of two hex digits";
const ABOVE_ROOT: &str = "a `..` segment above the root of the path";
const BACKSLASH: &str = "a raw `\\` (some parsers read it as `/`)";

/// The one spelling of `uri` policies match (see the module doc), or why there is none.
pub(crate) fn normalize(uri: &str) -> Result<String, Unsafe> {
    let Some((scheme, rest)) = split_scheme(uri) else {
        return Err(Unsafe { scheme: None, why: "no scheme (a URI starts with one, like `file:`)" });
    };
    let scheme = scheme.to_ascii_lowercase();
    normalize_after(&scheme, rest).map_err(|why| Unsafe { scheme: Some(scheme), why })
}

fn normalize_after(scheme: &str, rest: &str) -> Result<String, &'static str> {
    if rest.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err("a control character");
    }
    if rest.ends_with(' ') {
        return Err("a space at the end");
    }
    if rest.contains('\\') {
        return Err(BACKSLASH);
    }
    let (rest, fragment) = split(rest, '#');
    let (hier, query) = split(rest, '?');
    let (authority, path) = match hier.strip_prefix("//") {
        Some(after) => {
            let end = after.find('/').unwrap_or(after.len());
            (Some(&after[..end]), &after[end..])
        }
        None => (None, hier),
    };
    let mut normal_path = String::with_capacity(path.len());
    percent(path, Part::Path, &mut normal_path)?;
    if scheme == "file" {
        if query.is_some() || fragment.is_some() {
            return Err("a query or fragment in a file URI");
        }
        if let Some(authority) = authority {
            file_authority(authority)?;
        }
        return Ok(format!("file://{}", file_path(&normal_path, authority.is_some())?));
    }
    let mut out = format!("{scheme}:");
    if let Some(authority) = authority {
        out.push_str("//");
        normalize_authority(scheme, authority, &mut out)?;
    }
    if normal_path.starts_with('/') {
        normal_path = remove_dot_segments(&normal_path)?;
        if authority.is_none() && normal_path.starts_with("//") {
            return Err("a path that would read as an authority (`//` at its start)");
        }
    }
    out.push_str(&normal_path);
    for (mark, part) in [('?', query), ('#', fragment)] {
        if let Some(part) = part {
            out.push(mark);
            percent(part, Part::Query, &mut out)?;
        }
    }
    Ok(out)
}

/// `text` before and after the first `mark`.
fn split(text: &str, mark: char) -> (&str, Option<&str>) {
    match text.split_once(mark) {
        Some((before, after)) => (before, Some(after)),
        None => (text, None),
    }
}

/// `scheme ":"` (RFC 3986: a letter, then letters, digits, `+`, `-`, `.`) and the rest.
fn split_scheme(uri: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = uri.split_once(':')?;
    let mut bytes = scheme.bytes();
    let first = bytes.next()?;
    let valid = first.is_ascii_alphabetic() && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    valid.then_some((scheme, rest))
}

/// A file URI's authority: empty or `localhost`, nothing else.
fn file_authority(authority: &str) -> Result<(), &'static str> {
    if authority.contains(['@', ':']) {
        return Err("a user or a port in a file URI");
    }
    let mut host = String::new();
    percent(authority, Part::Host, &mut host)?;
    match host.to_ascii_lowercase().as_str() {
        "" | "localhost" => Ok(()),
        _ => Err("a file URI naming a host other than localhost"),
    }
}

/// A file URI's path, percent-normalised: absolute, one slash between
/// segments, no dot segments, no encoded `/`, `\` or NUL.
fn file_path(path: &str, had_authority: bool) -> Result<String, &'static str> {
    for (escape, why) in [
        ("%2F", "an encoded `/` (%2F) in a file path"),
        ("%5C", "an encoded `\\` (%5C) in a file path"),
        ("%00", "an encoded NUL (%00) in a file path"),
    ] {
        if path.contains(escape) {
            return Err(why);
        }
    }
    if path.is_empty() && had_authority {
        return Ok("/".to_owned());
    }
    if !path.starts_with('/') {
        return Err("a file URI whose path is not absolute");
    }
    remove_dot_segments(&collapse_slashes(path))
}

/// Every run of `/` as one.
fn collapse_slashes(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if !(c == '/' && out.ends_with('/')) {
            out.push(c);
        }
    }
    out
}

/// RFC 3986 5.2.4 on an absolute path, except that a `..` above the root
/// is an error rather than dropped.
fn remove_dot_segments(path: &str) -> Result<String, &'static str> {
    let segments: Vec<&str> = path.strip_prefix('/').unwrap_or(path).split('/').collect();
    let mut kept: Vec<&str> = Vec::with_capacity(segments.len());
    let mut ends_in_dir = false;
    for segment in &segments {
        ends_in_dir = matches!(*segment, "." | "..");
        match *segment {
            "." => {}
            ".." => {
                kept.pop().ok_or(ABOVE_ROOT)?;
            }
            other => kept.push(other),
        }
    }
    let mut out = String::with_capacity(path.len());
    out.push('/');
    out.push_str(&kept.join("/"));
    if ends_in_dir && !kept.is_empty() {
        out.push('/');
    }
    Ok(out)
}

/// `[userinfo "@"] host [":" port]`, normalised onto `out`.
fn normalize_authority(scheme: &str, authority: &str, out: &mut String) -> Result<(), &'static str> {
    let (userinfo, host_port) = match authority.rsplit_once('@') {
        Some((user, _)) if user.contains('@') => return Err("more than one `@` in the authority"),
        Some((user, host_port)) => (Some(user), host_port),
        None => (None, authority),
    };
    let (host, port) = if host_port.starts_with('[') {
        let end = host_port.find(']').ok_or("an IP literal without its `]`")?;
        let port = match &host_port[end + 1..] {
            "" => None,
            after => Some(after.strip_prefix(':').ok_or("text after an IP literal that is not a port")?),
        };
        (&host_port[..=end], port)
    } else {
        match host_port.split_once(':') {
            Some((_, port)) if port.contains(':') => return Err("more than one `:` in the authority"),
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        }
    };
    if let Some(user) = userinfo {
        percent(user, Part::UserInfo, out)?;
        out.push('@');
    }
    if host.starts_with('[') {
        let inner = &host[1..host.len() - 1];
        if !inner.bytes().all(|b| b.is_ascii_alphanumeric() || b":.-_~!$&'()*+,;=".contains(&b)) {
            return Err("an IP literal with characters it may not hold");
        }
        out.push('[');
        out.push_str(&inner.to_ascii_lowercase());
        out.push(']');
    } else {
        let mut normal = String::with_capacity(host.len());
        percent(host, Part::Host, &mut normal)?;
        out.push_str(&lowercase_outside_escapes(&normal));
    }
    match port {
        None | Some("") => {}
        Some(port) => {
            const BAD_PORT: &str = "a port that is not a number up to 65535";
            if !port.bytes().all(|b| b.is_ascii_digit()) {
                return Err(BAD_PORT);
            }
            let digits = port.trim_start_matches('0');
            let number: u32 = match digits.len() {
                0 => 0,
                1..=5 => digits.parse().map_err(|_| BAD_PORT)?,
                _ => return Err(BAD_PORT),
            };
            if number > 65_535 {
                return Err(BAD_PORT);
            }
            if default_port(scheme) != Some(number) {
                out.push(':');
                out.push_str(&number.to_string());
            }
        }
    }
    Ok(())
}

fn default_port(scheme: &str) -> Option<u32> {
    match scheme {
        "http" | "ws" => Some(80),
        "https" | "wss" => Some(443),
        "ftp" => Some(21),
        _ => None,
    }
}

/// `text` in lowercase but for the hex of its escapes (which stays uppercase).
fn lowercase_outside_escapes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut hex_left = 0;
    for c in text.chars() {
        if hex_left > 0 {
            hex_left -= 1;
            out.push(c);
        } else {
            hex_left = if c == '%' { 2 } else { 0 };
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// Which component text is in: what it may hold raw.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Path,
    /// A query or a fragment.
    Query,
    UserInfo,
    /// A registered name; a character it may not hold is an error, not escaped.
    Host,
    /// A literal run of a glob: also the delimiters `?` and `#`.
    Glob,
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn is_sub_delim(b: u8) -> bool {
    matches!(b, b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=')
}

fn allowed(part: Part, b: u8) -> bool {
    let pchar = is_unreserved(b) || is_sub_delim(b) || matches!(b, b':' | b'@');
    match part {
        Part::Path => pchar || b == b'/',
        Part::Query => pchar || matches!(b, b'/' | b'?'),
        Part::UserInfo => is_unreserved(b) || is_sub_delim(b) || b == b':',
        Part::Host => is_unreserved(b) || is_sub_delim(b),
        Part::Glob => pchar || matches!(b, b'/' | b'?' | b'#'),
    }
}

/// Appends `text` percent-normalised onto `out`: escapes of unreserved
/// characters decoded, other escapes in uppercase hex, bytes `part` may
/// not hold raw escaped (in a host: an error).
fn percent(text: &str, part: Part, out: &mut String) -> Result<(), &'static str> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let value = bytes.get(i + 1..i + 3).and_then(|hex| Some(hex_value(hex[0])? * 16 + hex_value(hex[1])?));
            let value = value.ok_or(BAD_ESCAPE)?;
            if is_unreserved(value) {
                out.push(char::from(value));
            } else {
                push_escape(out, value);
            }
            i += 3;
            continue;
        }
        if allowed(part, b) {
            out.push(char::from(b));
        } else if part == Part::Host {
            return Err("a character a host may not hold");
        } else {
            push_escape(out, b);
        }
        i += 1;
    }
    Ok(())
}

fn hex_value(b: u8) -> Option<u8> {
    char::from(b).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

fn push_escape(out: &mut String, b: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(char::from(HEX[usize::from(b >> 4)]));
    out.push(char::from(HEX[usize::from(b & 0xf)]));
}

/// The characters of a glob (the `glob` crate's syntax) that are not literal.
fn is_glob_meta(c: char) -> bool {
    matches!(c, '*' | '?' | '[' | ']')
}

/// A glob's scheme part: what comes before its first `:` when that holds
/// no `/` and only scheme characters or glob syntax.
fn glob_scheme(glob: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = glob.split_once(':')?;
    let valid = !scheme.is_empty()
        && scheme.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.' | '!') || is_glob_meta(c));
    valid.then_some((scheme, rest))
}

/// A rule's resource glob with its literal parts normalised as [`normalize`]
/// does URIs (glob syntax left as it is), or why it could never match a
/// normalised URI. A glob with no scheme (`*`) is kept as written.
pub(crate) fn normalize_glob(glob: &str) -> Result<String, String> {
    let Some((scheme, rest)) = glob_scheme(glob) else { return Ok(glob.to_owned()) };
    let scheme = scheme.to_ascii_lowercase();
    let file = scheme == "file";
    let never = |why: &str| Err(format!("`{glob}` never matches: {why}"));
    let (authority, path) = match rest.strip_prefix("//") {
        Some(after) => {
            let end = after.find('/').unwrap_or(after.len());
            (Some(&after[..end]), &after[end..])
        }
        None => (None, rest),
    };
    let mut out = format!("{scheme}:");
    match authority {
        Some(authority) if authority.contains(is_glob_meta) => {
            out.push_str("//");
            out.push_str(&lowercase_outside_escapes(authority));
        }
        Some(authority) if file => match file_authority(authority) {
            Ok(()) => out.push_str("//"),
            Err(why) => return never(&format!("{why}, and such URIs are refused")),
        },
        Some(authority) => {
            out.push_str("//");
            if let Err(why) = normalize_authority(&scheme, authority, &mut out) {
                return never(why);
            }
        }
        None if file && path.starts_with('/') => out.push_str("//"),
        None => {}
    }
    // The path: literal runs normalised, glob syntax (`*`, `?`, `[...]`) as it is.
    let mut normal = String::with_capacity(path.len());
    for (literal, text) in glob_tokens(path) {
        if !literal {
            normal.push_str(text);
            continue;
        }
        if text.contains('\\') {
            return never(BACKSLASH);
        }
        let mut run = String::with_capacity(text.len());
        if let Err(why) = percent(text, Part::Glob, &mut run) {
            return Err(format!("`{glob}`: {why}"));
        }
        if file {
            for escape in ["%2F", "%5C", "%00"] {
                if run.contains(escape) {
                    return never(&format!("{escape} in a file path, and such URIs are refused"));
                }
            }
            run = collapse_slashes(&run);
            if normal.ends_with('/') && run.starts_with('/') {
                run.remove(0);
            }
        }
        normal.push_str(&run);
    }
    if normal.starts_with('/') {
        // Glob syntax stands in as a character that is neither `/` nor `.`.
        let shape: String =
            glob_tokens(&normal).map(|(literal, t)| if literal { t.to_owned() } else { "*".to_owned() }).collect();
        if shape.split('/').any(|segment| segment == "." || segment == "..") {
            return never("a `.` or `..` segment (URIs are matched with theirs removed)");
        }
    }
    out.push_str(&normal);
    Ok(out)
}

/// A glob split into literal runs (`true`) and glob syntax (`false`): `*`,
/// `?`, and a `[...]` class (whose first character may be `]`, after an
/// optional `!`); an unclosed `[` makes the rest syntax.
fn glob_tokens(glob: &str) -> impl Iterator<Item = (bool, &str)> {
    let mut rest = glob;
    std::iter::from_fn(move || {
        let first = rest.chars().next()?;
        let end = match first {
            '*' | '?' | ']' => 1,
            '[' => {
                let body = &rest[1..];
                let skip = usize::from(body.starts_with('!'));
                let skip = skip + usize::from(body[skip..].starts_with(']'));
                body[skip..].find(']').map_or(rest.len(), |i| 1 + skip + i + 1)
            }
            _ => rest.find(is_glob_meta).unwrap_or(rest.len()),
        };
        let (token, after) = rest.split_at(end);
        rest = after;
        Some((!is_glob_meta(first), token))
    })
}

/// Whether `glob` may match URIs of `scheme` (lowercase; `None`: a URI
/// whose scheme could not be read, which every resource glob covers).
pub(crate) fn glob_covers_scheme(glob: &str, scheme: Option<&str>) -> bool {
    match (glob_scheme(glob), scheme) {
        (Some((prefix, _)), Some(scheme)) => {
            glob::Pattern::new(&prefix.to_ascii_lowercase()).map_or(true, |pattern| pattern.matches(scheme))
        }
        _ => true,
    }
}

/// [`normalize_glob`] over a rule's `resources`, naming the glob that fails.
pub(crate) fn normalize_globs(globs: &Option<Vec<String>>) -> Result<Option<Vec<String>>, String> {
    globs.as_ref().map(|list| list.iter().map(|g| normalize_glob(g)).collect()).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(uri: &str) -> String {
        normalize(uri).unwrap_or_else(|e| panic!("{uri:?}: {e}"))
    }

    fn unsafe_why(uri: &str) -> &'static str {
        match normalize(uri) {
            Err(e) => e.why,
            Ok(n) => panic!("{uri:?} normalised to {n:?}, but cannot be safely"),
        }
    }

    #[test]
    fn every_spelling_of_a_file_path_is_one_uri() {
        for uri in [
            "file:///secret/b",
            "file:////secret/b",
            "file://///secret//b",
            "FILE:///secret/b",
            "File:///secret/b",
            "file://localhost/secret/b",
            "file://LOCALHOST/secret/b",
            "file://%6Cocalhost/secret/b",
            "file:/secret/b",
            "file:///%73ecret/b",
            "file:///%73%65%63%72%65%74/%62",
            "file:///./secret/b",
            "file:///secret/./b",
            "file:///public/../secret/b",
            "file:///public/%2e%2E/secret/b",
            "file:///public/.%2e/secret/b",
            "file:///public//..//secret/b",
            "file:///a/b/c/../../../secret/b",
        ] {
            assert_eq!(ok(uri), "file:///secret/b", "{uri}");
        }
        assert_eq!(ok("file:///secret/b/"), "file:///secret/b/");
        assert_eq!(ok("file:///secret/b/."), "file:///secret/b/");
        assert_eq!(ok("file:///secret/b/c/.."), "file:///secret/b/");
        assert_eq!(ok("file:///"), "file:///");
        assert_eq!(ok("file://"), "file:///");
        assert_eq!(ok("file://localhost"), "file:///");
        assert_eq!(ok("file:///."), "file:///");
    }

    #[test]
    fn escapes_that_stay_are_uppercase_and_raw_characters_a_uri_may_not_hold_are_escaped() {
        assert_eq!(ok("file:///a%2a%7e%7E%41"), "file:///a%2A~~A");
        assert_eq!(ok("file:///caf%c3%a9"), "file:///caf%C3%A9");
        assert_eq!(ok("file:///café"), "file:///caf%C3%A9", "the same file, raw or escaped");
        assert_eq!(ok("file:///a b"), "file:///a%20b");
        assert_eq!(ok("file:///a%0Ab"), "file:///a%0Ab", "an escaped newline is a POSIX file name byte");
        assert_eq!(ok("file:///a%25b"), "file:///a%25b", "`%25` stays: it is not unreserved");
        assert_eq!(ok("x:a%41b%3a"), "x:aAb%3A");
    }

    #[test]
    fn a_file_uri_that_cannot_be_normalised_safely_says_why() {
        for (uri, why) in [
            ("file:///public/..%2Fsecret/b", "%2F"),
            ("file:///public/..%2fsecret/b", "%2F"),
            ("file:///public/..%5Csecret/b", "%5C"),
            ("file:///public/..%5csecret/b", "%5C"),
            ("file:///secret/b%00.txt", "NUL"),
            ("file:///public/%zz", "escape"),
            ("file:///public/%4", "escape"),
            ("file:///public/%", "escape"),
            ("file:///public/%%41", "escape"),
            ("file:///../secret/b", "above the root"),
            ("file:///public/../../secret/b", "above the root"),
            ("file:///..", "above the root"),
            ("file://evil/secret/b", "other than localhost"),
            ("file://127.0.0.1/secret/b", "other than localhost"),
            ("file://user@localhost/secret/b", "user or a port"),
            ("file://localhost:80/secret/b", "user or a port"),
            ("file://localhost:/secret/b", "user or a port"),
            ("file:secret/b", "not absolute"),
            ("file:", "not absolute"),
            ("file:///public/a?/../../secret/b", "query or fragment"),
            ("file:///public/a#/../../secret/b", "query or fragment"),
            ("file:///secret/b?", "query or fragment"),
            ("file:///public\\..\\secret\\b", "`\\`"),
            ("file:///se\tcret/b", "control"),
            ("file:///secret/b\n", "control"),
            ("file:///secret/b\u{7f}", "control"),
            ("file:///secret/b ", "space"),
        ] {
            let got = unsafe_why(uri);
            assert!(got.contains(why), "{uri:?}: {got:?} does not say {why:?}");
            assert_eq!(normalize(uri).unwrap_err().scheme.as_deref(), Some("file"), "{uri:?}");
        }
        for uri in [" file:///secret/b", "://x", "", "secret/b", "1file:///x", "%66ile:///x", "fi le:///x"] {
            assert_eq!(normalize(uri).unwrap_err().scheme, None, "{uri:?}");
        }
    }

    #[test]
    fn other_schemes_get_the_generic_normalisations() {
        assert_eq!(ok("HTTPS://Example.COM:443/a/./b/../c?Q=%7e#F%2f"), "https://example.com/a/c?Q=~#F%2F");
        assert_eq!(ok("http://example.com:80/"), "http://example.com/");
        assert_eq!(ok("http://example.com:/"), "http://example.com/");
        assert_eq!(ok("http://example.com:0080/"), "http://example.com/");
        assert_eq!(ok("http://example.com:8080/"), "http://example.com:8080/");
        assert_eq!(ok("http://User@Example.com/"), "http://User@example.com/", "userinfo keeps its case");
        assert_eq!(ok("http://[::FFFF:1]:8443/x"), "http://[::ffff:1]:8443/x");
        assert_eq!(ok("http://%45xample.com/%7Ea"), "http://example.com/~a");
        assert_eq!(ok("http://ex%C3%A9.com/"), "http://ex%C3%A9.com/");
        assert_eq!(ok("fixture://fx/info"), "fixture://fx/info");
        assert_eq!(ok("fixture://fx/%2Fx//y"), "fixture://fx/%2Fx//y", "only file collapses slashes and refuses %2F");
        assert_eq!(ok("urn:isbn:0451450523"), "urn:isbn:0451450523");
        assert_eq!(ok("x:a/../b"), "x:a/../b", "a rootless path keeps its dots");
        assert_eq!(ok("x:/a/../b"), "x:/b");
        assert_eq!(ok("x://h"), "x://h");
        assert_eq!(ok("x:"), "x:");
        for (uri, why) in [
            ("https://example.com/../a", "above the root"),
            ("https://a@b@example.com/", "`@`"),
            ("https://example.com:65536/", "port"),
            ("https://example.com:8x/", "port"),
            ("https://example.com:1:2/", "`:`"),
            ("https://[::1/", "`]`"),
            ("https://[::1]x/", "port"),
            ("https://[::1%]/", "IP literal"),
            ("https://exa mple.com/", "host"),
            ("https://exämple.com/", "host"),
            ("https://example.com/a\\b", "`\\`"),
            ("x:/././/a", "authority"),
            ("x:%zz", "escape"),
        ] {
            let got = unsafe_why(uri);
            assert!(got.contains(why), "{uri:?}: {got:?} does not say {why:?}");
        }
        assert_eq!(normalize("HTTPS://x/%zz").unwrap_err().scheme.as_deref(), Some("https"));
    }

    #[test]
    fn a_glob_is_written_in_the_form_it_is_matched_against() {
        for glob in [
            "file:///secret/*",
            "FILE:///secret/*",
            "file://localhost/secret/*",
            "file://LocalHost/secret/*",
            "file:////secret/*",
            "file:/secret/*",
            "file:///%73ecret/*",
            "file:///secret//*",
        ] {
            assert_eq!(normalize_glob(glob).unwrap(), "file:///secret/*", "{glob}");
        }
        assert_eq!(normalize_glob("file://*").unwrap(), "file://*");
        assert_eq!(normalize_glob("file:*").unwrap(), "file:*");
        assert_eq!(normalize_glob("*").unwrap(), "*");
        assert_eq!(normalize_glob("*secret*").unwrap(), "*secret*");
        assert_eq!(normalize_glob("FIXTURE://FX/items/[a-z]?%7e*").unwrap(), "fixture://fx/items/[a-z]?~*");
        assert_eq!(normalize_glob("HTTPS://*.Example.com/*").unwrap(), "https://*.example.com/*");
        assert_eq!(normalize_glob("https://example.com:443/a b/*").unwrap(), "https://example.com/a%20b/*");
        assert_eq!(normalize_glob("file:///[!.]*/x").unwrap(), "file:///[!.]*/x", "a class is syntax, not a dot segment");
        assert_eq!(normalize_glob("file:///a/..*").unwrap(), "file:///a/..*");
        assert_eq!(normalize_glob("x:a%23b#c%7e*").unwrap(), "x:a%23b#c~*", "`#` stays the delimiter it is in a URI");
        for (glob, why) in [
            ("file:///public/../secret/*", "`..` segment"),
            ("file:///./secret/*", "`..` segment"),
            ("x:/a/./*", "`..` segment"),
            ("file:///a%2Fb/*", "%2F"),
            ("file:///a%5c*", "%5C"),
            ("file://evil/*", "other than localhost"),
            ("file:///a\\*", "`\\`"),
            ("file:///a%z*", "escape"),
            ("https://a:x/*", "port"),
        ] {
            let got = normalize_glob(glob).unwrap_err();
            assert!(got.contains(why) && got.contains(glob), "{glob:?}: {got:?} does not say {why:?}");
        }
        assert_eq!(normalize_globs(&None), Ok(None));
        assert_eq!(normalize_globs(&Some(vec!["FILE:///a".into()])), Ok(Some(vec!["file:///a".to_owned()])));
    }

    #[test]
    fn a_normalised_uri_matches_the_normalised_glob_of_its_rule() {
        let glob = glob::Pattern::new(&normalize_glob("FILE://LOCALHOST/secret/*").unwrap()).unwrap();
        for uri in ["file:////secret/b", "file:///%73ecret/b", "file:///public/../secret/b", "file://localhost/secret/b"] {
            assert!(glob.matches(&ok(uri)), "{uri}");
            assert!(!glob.matches(uri) || uri == "file:///secret/b", "the raw {uri} would pass the glob");
        }
        assert!(!glob.matches(&ok("file:///public/secret/b")));
    }

    #[test]
    fn the_scheme_a_glob_covers() {
        assert!(glob_covers_scheme("file:///secret/*", Some("file")));
        assert!(!glob_covers_scheme("file:///secret/*", Some("https")));
        assert!(glob_covers_scheme("*", Some("https")));
        assert!(glob_covers_scheme("*secret*", Some("file")));
        assert!(glob_covers_scheme("f*:///secret/*", Some("file")));
        assert!(glob_covers_scheme("[fg]ile:*", Some("file")));
        assert!(!glob_covers_scheme("fixture://*", Some("file")));
        assert!(glob_covers_scheme("fixture://*", None), "a URI without a scheme is covered by every glob");
    }

    #[test]
    fn a_policy_decides_on_the_normalised_uri_and_refuses_one_that_cannot_be_where_a_rule_covers_its_scheme() {
        use crate::policy::{Decision, Policy, RuleConfig, Subject, Target};
        let rule = |resources: &[&str], allow: &str| RuleConfig {
            endpoint: "fx".into(),
            tools: None,
            prompts: None,
            resources: Some(resources.iter().map(|r| r.to_string()).collect()),
            allow: allow.into(),
            scope: Some("files".into()),
        };
        let policy = Policy::new(vec![
            rule(&["FILE://LOCALHOST/secret/*"], "false"),
            rule(&["file:*"], r#"mcp.resource.uri.startsWith("file:///") && mcp.name == mcp.resource.uri"#),
        ])
        .unwrap();
        let nobody = Subject::default();
        let decide = |uri| policy.decide("fx", "resources/read", Target::Resource(uri), &nobody);
        assert!(decide("file://localhost/public/a").is_allowed(), "the expression sees file:///public/a");
        assert_eq!(
            decide("file:////secret/b"),
            Decision::Deny { rules: vec!["false".into()], scopes: vec!["files".into()] },
            "the glob is matched normalised too"
        );
        assert_eq!(
            decide("file:///public/..%2Fsecret/b"),
            Decision::Deny {
                rules: vec!["the resource URI cannot be normalised: an encoded `/` (%2F) in a file path".into()],
                scopes: vec![],
            },
            "no scope would help"
        );
        assert!(decide("fixture://fx/%zz").is_allowed(), "no rule covers the scheme `fixture`");
        assert!(!decide("no scheme %zz").is_allowed(), "every resource rule covers a URI with no scheme");
        assert!(
            policy.decide("other", "resources/read", Target::Resource("file:///%zz"), &nobody).is_allowed(),
            "nor the endpoint"
        );
        let bad = Policy::new(vec![rule(&["file:///public/../secret/*"], "false")]).unwrap_err();
        assert!(bad.contains("#1") && bad.contains("never matches"), "{bad}");
    }

    /// Text made of the pieces URIs are spelled with, for the properties below.
    fn spelled() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let pieces = "/|//|.|..|%2e|%2E|%2F|%41|%7e|%zz|%|a|B|~|?|#|@|:|\\| |é|localhost|LocalHost|secret|*|[|]|%00|:80";
        let piece = prop::sample::select(pieces.split('|').collect::<Vec<_>>());
        let scheme = prop::sample::select(vec!["file:", "FILE:", "file://", "http://", "x:", "x://", ""]);
        (scheme, prop::collection::vec(piece, 0..12)).prop_map(|(s, pieces)| format!("{s}{}", pieces.concat()))
    }

    proptest::proptest! {
        #[test]
        fn normalising_is_idempotent_and_never_panics(uri in spelled()) {
            if let Ok(normal) = normalize(&uri) {
                proptest::prop_assert!(normal.is_ascii());
                proptest::prop_assert_eq!(normalize(&normal), Ok(normal.clone()), "{:?}", uri);
                if normal.starts_with("file:") {
                    proptest::prop_assert!(normal.starts_with("file:///"));
                    let path = &normal["file://".len()..];
                    proptest::prop_assert!(!path.contains("//"), "{}", normal);
                    proptest::prop_assert!(!path.split('/').any(|s| s == "." || s == ".."), "{}", normal);
                }
            }
            let _ = normalize_glob(&uri);
        }

        #[test]
        fn any_string_is_answered(uri in ".{0,40}") {
            if let Ok(normal) = normalize(&uri) {
                proptest::prop_assert_eq!(normalize(&normal), Ok(normal.clone()));
            }
            let _ = normalize_glob(&uri);
            let _ = glob_covers_scheme(&uri, Some("file"));
        }
    }
}
