//! The `_meta` keys tether reads and writes. Keys under `dev.tether/` are
//! tether's own; the others come from the source designs.

/// Everything tether adds under its own prefix (the bridge hides these from its host).
pub const TETHER_PREFIX: &str = "dev.tether/";

/// In an `initialize` result: the token that resumes this session later;
/// in `initialize` params: the token presented to resume one.
pub const SESSION_RESUME_TOKEN: &str = "dev.tether/sessionResumeToken";
/// In an `initialize` result that presented a token: whether it resumed.
pub const RESUMED: &str = "dev.tether/resumed";
/// Why a presented token did not resume (one word).
pub const RESUME_REFUSED: &str = "dev.tether/resumeRefused";

/// In a partial result: the token to ask for the next part with.
pub const NEXT_RESUME_TOKEN: &str = "nextResumeToken";
/// In a repeated request: the token of the part asked for.
pub const RESUME_TOKEN: &str = "resumeToken";
/// In a `tools/call` request's `_meta`, `true`: this client follows
/// `nextResumeToken`, so a tool that runs as an operation answers in pages
/// of at most `--result-chunk-bytes` (without it: the whole result, up to
/// `--max-result-bytes`). The same key in both eras.
pub const PAGING: &str = "dev.tether/paging";
/// In a partial result: nothing new was ready yet.
pub const PENDING: &str = "dev.tether/pending";

/// In `tools/list`: this tool's calls run as resumable operations.
pub const RESUMABLE: &str = "dev.tether/resumable";
/// In `tools/list`: how long a call of this tool usually takes.
pub const EXPECTED_DURATION_MS: &str = "dev.tether/expectedDurationMs";
/// In `tools/list`: an interrupted call continues after a restart.
pub const RESTARTABLE: &str = "dev.tether/restartable";

/// In request params: the token progress notifications carry.
pub const PROGRESS_TOKEN: &str = "progressToken";

/// In request params: the W3C `traceparent` of the caller's span, where a
/// request without HTTP headers of its own (2026-07-28, stdio) carries it.
pub const TRACEPARENT: &str = "traceparent";
/// In request params: the W3C `tracestate` beside [`TRACEPARENT`].
pub const TRACESTATE: &str = "tracestate";

/// 2026-07-28, in every request's `_meta`: the revision it speaks (the claim
/// that makes a request sessionless).
pub const PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// 2026-07-28, in every request's `_meta`: the client's capabilities (`{}`: none).
pub const CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// 2026-07-28, in a request's `_meta`: who the client is.
pub const CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
/// 2026-07-28, in a request's `_meta`: the lowest log level to send; none: no logs.
pub const LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
/// 2026-07-28, in each result's `_meta`: the server's name and version.
pub const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
/// In a 2026-07-28 `thought` call and result: the notebook session it goes to.
pub const NOTEBOOK_SESSION: &str = "dev.tether/notebookSession";
/// A virtual server's tool or prompt: the member it comes from.
pub const MEMBER: &str = "dev.tether/member";
/// In a partial result of a resumable operation (session era): the ID under
/// which a 2026-07-28 client follows the same operation as a task.
pub const TASK_ID: &str = "dev.tether/taskId";
/// The Tasks extension's name, in `capabilities.extensions`.
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";
/// 2026-07-28, on every message of a `subscriptions/listen` stream: the listen request's id.
pub const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
