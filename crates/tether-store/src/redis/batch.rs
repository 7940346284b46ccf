//! Group commit on Redis: many concurrent calls of a scripted operation
//! (an append, a thought) run as one script call, and the calls of every
//! operation on a connection, with concurrent plain reads (a session's
//! stamp), go to Redis as one pipeline.
//!
//! What a Redis call costs its server is mostly not the work inside it: the
//! command is parsed, the script looked up and its `KEYS`/`ARGV` tables
//! built, the reply encoded, and the socket read and written. Run one by
//! one, 64 concurrent `tools/call`s spent more of Redis's CPU on that than on
//! their writes. A single server's connection has one batching task
//! ([`BatchQueue`]) that every [`BatchedOp`] on it shares: while a batch is
//! on the wire it queues calls, then sends what it gathered as one pipeline,
//! per operation one `EVALSHA` that runs the operation once per call, each
//! under `pcall` (one call's failure is its own), and publishes the
//! announcements the calls left (`notes`) as one message. One pipeline for
//! every operation, not one per operation, because the socket writes and
//! wake-ups per batch were a large part of tether's own CPU per call.
//!
//! On a single server only: a Redis Cluster runs a script on one slot, so
//! there each call is its own script call (the same script, one operation,
//! its keys declared), sent at once.
//!
//! The operation is Lua source defining `local function op(k, a, n, notes)`:
//! its keys are `ARGV[k + 1]`, `ARGV[k + 2]`…, its `n` arguments `ARGV[a + 1]`
//! … `ARGV[a + n]` (read in place: building tables per call cost Redis more
//! than the calls' own commands), and `notes` a table it may add
//! announcement lines to. The batch's `ARGV` is the announcement channel (or
//! `''`), then per call: its key count, its argument count, its keys, its
//! arguments. The reply is flat: `1, result` or `0, message` per call (a
//! nested table per call cost more too).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use redis::{Script, ScriptInvocation, ServerErrorKind, Value as RValue};
use tokio::sync::{mpsc, oneshot};

use super::{RESPONSE_TIMEOUT, RedisConn, unavailable};
use crate::{StoreError, StoreResult};

/// Calls waiting for the next batch; beyond this, callers wait (backpressure).
const QUEUE: usize = 4096;
/// Calls in one batch at most...
const MAX_CALLS: usize = 256;
/// ...and bytes of input (a call that crosses it is the batch's last).
const MAX_BYTES: usize = 1 << 20;

/// The loop every batch runs, around the operation's source.
const DRIVER: &str = r#"
local out, notes, i, n = {}, {}, 2, #ARGV
while i <= n do
  local nk, na = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  local ok, r = pcall(op, i + 1, i + 1 + nk, na, notes)
  if ok then
    -- false, not nil: a nil would not take its place in the reply.
    if r == nil then r = false end
    out[#out + 1] = 1
    out[#out + 1] = r
  else
    out[#out + 1] = 0
    out[#out + 1] = type(r) == 'table' and r.err or tostring(r)
  end
  i = i + 2 + nk + na
end
if ARGV[1] ~= '' and #notes > 0 then redis.call('PUBLISH', ARGV[1], table.concat(notes, '\n')) end
return out
"#;

/// One call: the operation's keys and arguments.
#[derive(Debug, Default)]
pub struct Call {
    keys: Vec<Bytes>,
    args: Vec<Bytes>,
}

impl Call {
    /// A call with no keys and no arguments yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a key (`KEYS[n]` of the script).
    pub fn key(mut self, key: impl Into<Bytes>) -> Self {
        self.keys.push(key.into());
        self
    }

    /// Adds an argument (`ARGV[n]` of the script).
    pub fn arg(mut self, arg: impl Into<Bytes>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// A number, as Redis reads it.
    pub fn num(self, n: impl std::fmt::Display) -> Self {
        self.arg(Bytes::from(n.to_string()))
    }

    fn size(&self) -> usize {
        self.keys.iter().chain(&self.args).map(|b| b.len() + 16).sum()
    }
}

struct Job {
    runner: Arc<Runner>,
    call: Call,
    reply: oneshot::Sender<StoreResult<RValue>>,
}

/// The queue of a single server's batching task, which every [`BatchedOp`]
/// on that connection shares: one pipeline per batch carries the calls of
/// every operation, so a request's stamp, thought and answer of concurrent
/// requests go to Redis together.
#[derive(Clone)]
pub struct BatchQueue(mpsc::Sender<Job>);

/// Starts the batching task of a single server's connection (`conn`: one
/// without a queue); it ends when the queue's last sender is dropped.
pub(crate) fn start(conn: RedisConn) -> BatchQueue {
    let (tx, rx) = mpsc::channel(QUEUE);
    tokio::spawn(run(conn, rx));
    BatchQueue(tx)
}

/// Calls of one scripted operation, or of plain commands, run in batches on
/// a single server.
#[derive(Clone)]
pub struct BatchedOp {
    inner: Arc<Inner>,
}

struct Inner {
    conn: RedisConn,
    runner: Arc<Runner>,
}

/// How a batch's calls of one operation are sent.
enum Runner {
    /// One script call running the operation once per call; the batch
    /// publishes its notes on `channel` (`''`: nowhere).
    Script { script: Script, channel: Bytes },
    /// Each call is a command, its first argument the command's name (reads
    /// such as a session's stamp, where a script would cost Redis more than
    /// the command).
    Commands,
}

impl BatchedOp {
    /// `op` is the operation's Lua source (see the module's doc); `channel`
    /// receives the batch's notes (`''`: none).
    pub fn script(conn: RedisConn, op: &str, channel: &str) -> Self {
        let script = Script::new(&format!("{op}\n{DRIVER}"));
        Self::new(conn, Runner::Script { script, channel: Bytes::copy_from_slice(channel.as_bytes()) })
    }

    /// Plain commands, batched with the rest (the multiplexed connection
    /// would send them together too, but each as a request of its own, with
    /// its own bookkeeping on both sides).
    pub fn commands(conn: RedisConn) -> Self {
        Self::new(conn, Runner::Commands)
    }

    fn new(conn: RedisConn, runner: Runner) -> Self {
        Self { inner: Arc::new(Inner { conn, runner: Arc::new(runner) }) }
    }

    /// Runs one call and returns its result. A call not answered within
    /// Redis's response timeout fails as unavailable, whether it waited in
    /// the queue (behind a batch Redis does not answer) or in its batch: one
    /// that had not been sent yet is then never sent.
    pub async fn call(&self, call: Call) -> StoreResult<RValue> {
        let Some(queue) = self.inner.conn.batch_queue() else {
            let mut conn = self.inner.conn.clone();
            let answer = send(&mut conn, &[(&*self.inner.runner, vec![&call])], true).await.pop();
            return answer.unwrap_or_else(|| Err(StoreError::Corrupt("a Redis batch lost a call".into())));
        };
        let stopped = || StoreError::Unavailable("the Redis batching task has stopped".into());
        let queued = async {
            let (reply, answer) = oneshot::channel();
            queue.0.send(Job { runner: self.inner.runner.clone(), call, reply }).await.map_err(|_| stopped())?;
            answer.await.map_err(|_| stopped())?
        };
        match tokio::time::timeout(RESPONSE_TIMEOUT, queued).await {
            Ok(answer) => answer,
            Err(_) => {
                crate::observe::error();
                Err(no_answer())
            }
        }
    }
}

/// Sends each operation's calls (`groups`, in order) in one pipeline: one
/// `EVALSHA` per scripted operation, one command per plain call. Returns an
/// answer per call, in the order of `groups` and their calls.
/// `declare_keys`: name the keys of the (one) call as the script's `KEYS`,
/// for a cluster's routing. A script Redis does not know (`NOSCRIPT`: it
/// restarted or was flushed) did not run; it is loaded and its calls sent
/// again, alone.
async fn send(conn: &mut RedisConn, groups: &[(&Runner, Vec<&Call>)], declare_keys: bool) -> Vec<StoreResult<RValue>> {
    let invocations: Vec<Option<ScriptInvocation<'_>>> =
        groups.iter().map(|(runner, calls)| runner.invocation(calls, declare_keys)).collect();
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for ((_, calls), invocation) in groups.iter().zip(&invocations) {
        match invocation {
            Some(invocation) => {
                pipe.invoke_script(invocation);
            }
            None => {
                for call in calls {
                    let mut cmd = redis::Cmd::new();
                    // The name is the first argument on the wire, as it is.
                    for arg in &call.args {
                        cmd.arg(arg.as_ref());
                    }
                    pipe.add_command(cmd);
                }
            }
        }
    }
    let calls: usize = groups.iter().map(|(_, calls)| calls.len()).sum();
    let replies: Vec<RValue> = match pipe.query_async(conn).await {
        Ok(replies) => replies,
        Err(e) => {
            let e = unavailable(e);
            return (0..calls).map(|_| Err(e.clone())).collect();
        }
    };
    let mut replies = replies.into_iter();
    let mut answers = Vec::with_capacity(calls);
    for ((_, group), invocation) in groups.iter().zip(&invocations) {
        match invocation {
            Some(invocation) => {
                let reply = match replies.next() {
                    Some(RValue::ServerError(e)) if e.kind() == Some(ServerErrorKind::NoScript) => {
                        invocation.invoke_async(conn).await.map_err(unavailable)
                    }
                    Some(reply) => server_error(reply),
                    None => Err(too_few_replies()),
                };
                match reply.and_then(|reply| results(reply, group.len())) {
                    Ok(results) => answers.extend(results),
                    Err(e) => answers.extend(group.iter().map(|_| Err(e.clone()))),
                }
            }
            None => answers.extend(group.iter().map(|_| match replies.next() {
                Some(reply) => server_error(reply),
                None => Err(too_few_replies()),
            })),
        }
    }
    answers
}

/// A call Redis did not answer within its response timeout.
fn no_answer() -> StoreError {
    StoreError::Unavailable(format!("redis did not answer within {}s", RESPONSE_TIMEOUT.as_secs()))
}

fn too_few_replies() -> StoreError {
    StoreError::Corrupt("a Redis pipeline answered fewer replies than it sent".into())
}

/// A reply, or the error Redis answered in its place.
fn server_error(reply: RValue) -> StoreResult<RValue> {
    match reply {
        RValue::ServerError(e) => {
            crate::observe::error();
            Err(StoreError::Backend(format!("redis: {e}")))
        }
        reply => Ok(reply),
    }
}

impl Runner {
    /// The one script call of a batch of this operation's `calls`; `None`
    /// for plain commands.
    fn invocation(&self, calls: &[&Call], declare_keys: bool) -> Option<ScriptInvocation<'_>> {
        let Runner::Script { script, channel } = self else { return None };
        let mut invocation = script.prepare_invoke();
        if declare_keys {
            for key in calls.iter().flat_map(|c| &c.keys) {
                invocation.key(key.as_ref());
            }
        }
        invocation.arg(channel.as_ref());
        for call in calls {
            invocation.arg(call.keys.len()).arg(call.args.len());
            for part in call.keys.iter().chain(&call.args) {
                invocation.arg(part.as_ref());
            }
        }
        Some(invocation)
    }
}

/// Takes what is queued (at least one call), sends it as one pipeline,
/// answers each caller; until every sender is gone.
/// Calls whose callers gave up (timed out) are dropped unsent.
async fn run(mut conn: RedisConn, mut queue: mpsc::Receiver<Job>) {
    let mut batch: Vec<Job> = Vec::with_capacity(MAX_CALLS);
    while let Some(first) = queue.recv().await {
        let mut bytes = first.call.size();
        batch.push(first);
        if queue.is_empty() {
            // Let the tasks that are ready run first: those about to queue a
            // call join this batch instead of waiting a whole round trip.
            tokio::task::yield_now().await;
        }
        while batch.len() < MAX_CALLS && bytes < MAX_BYTES {
            let Ok(next) = queue.try_recv() else { break };
            bytes += next.call.size();
            batch.push(next);
        }
        batch.retain(|job| !job.reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        // Group by operation, keeping the jobs in the order of the answers.
        batch.sort_by_key(|job| Arc::as_ptr(&job.runner));
        let mut groups: Vec<(&Runner, Vec<&Call>)> = Vec::new();
        for job in &batch {
            match groups.last_mut() {
                Some((runner, calls)) if std::ptr::eq(*runner, &*job.runner) => calls.push(&job.call),
                _ => groups.push((&*job.runner, vec![&job.call])),
            }
        }
        let started = Instant::now();
        let answers = match tokio::time::timeout(RESPONSE_TIMEOUT, send(&mut conn, &groups, false)).await {
            Ok(answers) => answers,
            Err(_) => {
                let e = no_answer();
                batch.iter().map(|_| Err(e.clone())).collect()
            }
        };
        drop(groups);
        if let Some(observer) = crate::observe::observer() {
            observer.commit(started.elapsed(), batch.len());
        }
        for (job, answer) in batch.drain(..).zip(answers) {
            let _ = job.reply.send(answer);
        }
    }
}

/// The batch's flat reply (`ok, value` per call) as one answer per call,
/// `count` of them.
fn results(reply: RValue, count: usize) -> StoreResult<Vec<StoreResult<RValue>>> {
    let RValue::Array(flat) = reply else {
        return Err(StoreError::Corrupt(format!("a Redis batch of {count} calls answered {reply:?}")));
    };
    if flat.len() != 2 * count {
        return Err(StoreError::Corrupt(format!("a Redis batch of {count} calls answered {} values", flat.len())));
    }
    let mut flat = flat.into_iter();
    Ok(std::iter::from_fn(|| Some(one_result(flat.next()?, flat.next()?))).collect())
}

/// `1, result` → the result; `0, message` → the operation's error.
fn one_result(ok: RValue, value: RValue) -> StoreResult<RValue> {
    match (ok, value) {
        (RValue::Int(1), value) => Ok(value),
        (RValue::Int(0), RValue::BulkString(message)) => {
            crate::observe::error();
            Err(StoreError::Backend(format!("redis: {}", String::from_utf8_lossy(&message))))
        }
        _ => Err(StoreError::Corrupt("a Redis batch answered a call with something else".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_answers_its_value_or_its_error() {
        let flat = |v: Vec<RValue>| RValue::Array(v);
        let answers = results(
            flat(vec![
                RValue::Int(1),
                RValue::Int(7),
                RValue::Int(1),
                RValue::Nil,
                RValue::Int(0),
                RValue::BulkString(b"WRONGTYPE".to_vec()),
                RValue::Int(2),
                RValue::Nil,
            ]),
            4,
        )
        .unwrap();
        assert_eq!(answers[0].as_ref().unwrap(), &RValue::Int(7));
        assert_eq!(answers[1].as_ref().unwrap(), &RValue::Nil);
        assert!(matches!(&answers[2], Err(StoreError::Backend(m)) if m.contains("WRONGTYPE")));
        assert!(matches!(&answers[3], Err(StoreError::Corrupt(_))));
        assert!(results(flat(vec![RValue::Int(1)]), 1).is_err(), "a value missing");
        assert!(results(flat(vec![]), 1).is_err());
        assert!(results(RValue::Int(1), 1).is_err());
    }
}
