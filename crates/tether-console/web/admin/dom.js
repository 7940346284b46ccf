// The admin page's DOM, built from data as text only. Every string a client
// or an upstream chose (principals, client names, tool names, URIs, error
// texts) goes in through text nodes or attributes, never as HTML: nothing
// here parses markup, and the page's policy (Trusted Types, no policy)
// makes every HTML sink throw.

/**
 * An element with `props` and `children` (strings become text nodes).
 * props: class, text, testid, title, hidden, on<event>, any other attribute.
 */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  setProps(node, props);
  append(node, children);
  return node;
}

/** An SVG element (charts), attributes only. */
export function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== undefined && v !== null) node.setAttribute(k, String(v));
  }
  append(node, children);
  return node;
}

function setProps(node, props) {
  for (const [k, v] of Object.entries(props)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') node.className = v;
    else if (k === 'text') node.textContent = String(v);
    else if (k === 'testid') node.dataset.testid = v;
    else if (k === 'dataset') Object.assign(node.dataset, v);
    else if (k.startsWith('on') && typeof v === 'function') node.addEventListener(k.slice(2), v);
    else if (k === 'hidden') node.hidden = true;
    else if (k === 'disabled') node.disabled = true;
    else node.setAttribute(k, v === true ? '' : String(v));
  }
}

function append(node, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    node.append(c instanceof Node ? c : String(c));
  }
}

/** Replaces a node's children (text only, as `el`). */
export function fill(node, ...children) {
  node.replaceChildren();
  append(node, children);
}

/** `ms` as a short duration: 850 ms, 4.2 s, 3 m 12 s, 2 h 5 m, 3 d 4 h. */
export function duration(ms) {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return '–';
  if (ms < 0) ms = 0;
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} m ${Math.floor(s % 60)} s`;
  const h = Math.floor(m / 60);
  if (h < 24) return `${h} h ${m % 60} m`;
  return `${Math.floor(h / 24)} d ${h % 24} h`;
}

/** A session ID cut for a table (the whole ID in the title and to copy). */
export function shortId(id) {
  const s = String(id ?? '');
  return s.length > 16 ? `${s.slice(0, 16)}…` : s;
}

/** The path of an endpoint's name (`""`: `/mcp`). */
export function endpointPath(name) {
  return name ? `/mcp/${name}` : '/mcp';
}

/** A string from anything (a name may be missing or not a string). */
export function str(v) {
  if (v === undefined || v === null) return '';
  return typeof v === 'string' ? v : JSON.stringify(v);
}
