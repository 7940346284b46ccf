// What both browser suites (console.mjs, admin.mjs) wait and check with:
// every wait is on a condition with a deadline, never a bare sleep.
import net from 'node:net';

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function assert(ok, message) {
  if (!ok) throw new Error(message);
}

/** A TCP port of 127.0.0.1 free a moment ago. */
export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const p = s.address().port;
      s.close(() => resolve(p));
    });
  });
}

/** `fn()`'s first truthy value, asked every 100 ms until `ms` have passed. */
export async function waitFor(what, fn, ms = 30_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await fn();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}
