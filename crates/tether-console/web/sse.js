// A streaming parser for text/event-stream (the WHATWG rules): fields
// `event`, `data`, `id`, `retry`; comments; CR, LF or CRLF line ends split
// anywhere across chunks. Unlike EventSource it reports events whose data is
// empty (tether's priming events carry only an ID) and it runs over fetch, so
// requests can carry headers (Mcp-Session-Id, Last-Event-ID, Authorization).

export class SseParser {
  /** @param {(ev: {id: string|null, event: string, data: string}) => void} onEvent */
  constructor(onEvent) {
    this.onEvent = onEvent;
    this.buffer = '';
    this.reset();
    this.retry = null;
  }

  reset() {
    this.data = [];
    this.event = '';
    this.id = null;
    this.sawField = false;
  }

  /** Feeds decoded text; calls onEvent for each complete event. */
  push(text) {
    this.buffer += text;
    let start = 0;
    for (;;) {
      let end = -1;
      let next = -1;
      for (let i = start; i < this.buffer.length; i++) {
        const c = this.buffer.charCodeAt(i);
        if (c === 10) { end = i; next = i + 1; break; }
        if (c === 13) {
          if (i + 1 === this.buffer.length) break; // a CR at the end: wait, an LF may follow
          end = i;
          next = this.buffer.charCodeAt(i + 1) === 10 ? i + 2 : i + 1;
          break;
        }
      }
      if (end < 0) break;
      this.line(this.buffer.slice(start, end));
      start = next;
    }
    this.buffer = this.buffer.slice(start);
    if (this.buffer.length > 8 * 1024 * 1024) {
      throw new Error('an SSE line grew past 8 MiB');
    }
  }

  line(line) {
    if (line === '') {
      if (this.sawField) {
        this.onEvent({ id: this.id, event: this.event || 'message', data: this.data.join('\n') });
      }
      this.reset();
      return;
    }
    if (line.startsWith(':')) return; // comment (keep-alive)
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    switch (field) {
      case 'data': this.data.push(value); this.sawField = true; break;
      case 'event': this.event = value; this.sawField = true; break;
      case 'id': if (!value.includes('\0')) { this.id = value; this.sawField = true; } break;
      case 'retry': if (/^\d+$/.test(value)) this.retry = Number(value); break;
      default: break;
    }
  }
}

/**
 * Reads an SSE response body to its end, calling onEvent for each event.
 * Resolves when the stream ends (cleanly or not: a dropped connection is an
 * end too, reported as `{dropped: true}`), or when onEvent returns true (stop).
 */
export async function readSse(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let stop = false;
  const parser = new SseParser((ev) => { if (!stop && onEvent(ev) === true) stop = true; });
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      parser.push(decoder.decode(value, { stream: true }));
      if (stop) break;
    }
  } catch (e) {
    return { dropped: true, retry: parser.retry, error: e };
  } finally {
    if (stop) reader.cancel().catch(() => {});
  }
  return { dropped: false, retry: parser.retry, stopped: stop };
}
