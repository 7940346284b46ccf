// A form from a JSON Schema object (a tool's inputSchema, an elicitation's
// requestedSchema): strings, numbers, integers, booleans and enums get their
// own fields; arrays, objects and anything else are typed as JSON.

let counter = 0;

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'text') node.textContent = v;
    else if (k === 'class') node.className = v;
    else if (k === 'testid') node.dataset.testid = v;
    else if (v === true) node.setAttribute(k, '');
    else node.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function kindOf(prop) {
  if (!prop || typeof prop !== 'object') return 'json';
  const enumValues = Array.isArray(prop.enum) ? prop.enum : Array.isArray(prop.oneOf) && prop.oneOf.every((o) => o && 'const' in o) ? prop.oneOf.map((o) => o.const) : null;
  if (enumValues && enumValues.every((v) => typeof v === 'string')) return 'enum';
  const type = Array.isArray(prop.type) ? prop.type.find((t) => t !== 'null') : prop.type;
  if (type === 'string') return 'string';
  if (type === 'number' || type === 'integer') return type;
  if (type === 'boolean') return 'boolean';
  return 'json';
}

function enumOptions(prop) {
  if (Array.isArray(prop.enum)) {
    const names = Array.isArray(prop.enumNames) ? prop.enumNames : [];
    return prop.enum.map((v, i) => ({ value: v, label: typeof names[i] === 'string' ? names[i] : v }));
  }
  return prop.oneOf.map((o) => ({ value: o.const, label: typeof o.title === 'string' ? o.title : o.const }));
}

/**
 * Builds the fields of `schema` into `container`. Each field has a label and
 * `data-testid="<testPrefix><name>"`. Returns `collect()`, which gives
 * `{value}` or `{errors: [sentence…]}` (and marks the fields in error).
 */
export function buildForm(container, schema, { testPrefix, initial = {} }) {
  container.replaceChildren();
  const form = `f${++counter}`;
  const properties = schema && typeof schema === 'object' && schema.properties && typeof schema.properties === 'object' ? schema.properties : {};
  const required = new Set(Array.isArray(schema?.required) ? schema.required : []);
  const fields = [];
  // Required fields first (a server may have sorted the keys), each group in the schema's order.
  const names = Object.keys(properties).sort((a, b) => Number(required.has(b)) - Number(required.has(a)));
  if (names.length === 0) {
    container.append(el('p', { class: 'desc', text: 'No arguments.' }));
  }
  names.forEach((name, index) => {
    const prop = properties[name] || {};
    const kind = kindOf(prop);
    const id = `${form}-${index}`;
    const hintId = `${id}-hint`;
    const isRequired = required.has(name);
    const title = typeof prop.title === 'string' && prop.title ? prop.title : name;
    const label = el('label', { for: id }, title, isRequired ? el('span', { class: 'req', 'aria-hidden': 'true', text: ' *' }) : null);
    const hintText = [typeof prop.description === 'string' ? prop.description : '', kind === 'json' ? `JSON${prop.type ? ` (${[].concat(prop.type).join(' or ')})` : ''}` : '']
      .filter(Boolean)
      .join(' · ');
    const hint = hintText ? el('span', { id: hintId, class: 'hint', text: hintText }) : null;
    const start = name in initial ? initial[name] : prop.default;
    let input;
    if (kind === 'enum') {
      input = el('select', { id, name, 'aria-describedby': hint ? hintId : null, required: isRequired });
      if (!isRequired || start === undefined) input.append(el('option', { value: '', text: isRequired ? '(choose one)' : '(none)' }));
      for (const o of enumOptions(prop)) input.append(el('option', { value: o.value, text: o.label, selected: o.value === start }));
    } else if (kind === 'boolean') {
      input = el('input', { id, name, type: 'checkbox', 'aria-describedby': hint ? hintId : null, checked: start === true });
    } else if (kind === 'number' || kind === 'integer') {
      input = el('input', {
        id, name, type: 'number', inputmode: kind === 'integer' ? 'numeric' : 'decimal', step: kind === 'integer' ? '1' : 'any',
        min: prop.minimum, max: prop.maximum, required: isRequired, 'aria-describedby': hint ? hintId : null,
        value: typeof start === 'number' ? String(start) : null,
      });
    } else if (kind === 'string') {
      const long = prop.maxLength === undefined || prop.maxLength > 200;
      input = el(long ? 'textarea' : 'input', {
        id, name, rows: long ? 2 : null, type: long ? null : 'text', required: isRequired, spellcheck: 'false',
        'aria-describedby': hint ? hintId : null, placeholder: prop.format || null,
      });
      if (typeof start === 'string') input.value = start;
    } else {
      input = el('textarea', { id, name, rows: 3, spellcheck: 'false', class: 'json', required: isRequired, 'aria-describedby': hint ? hintId : null });
      if (start !== undefined) input.value = JSON.stringify(start, null, 2);
    }
    input.dataset.testid = testPrefix + name;
    const row = el('div', { class: `field field-${kind}` });
    if (kind === 'boolean') row.append(input, label, hint || '');
    else row.append(label, input, hint || '');
    container.append(row);
    fields.push({ name, kind, prop, input, required: isRequired, title });
  });

  function collect() {
    const value = {};
    const errors = [];
    for (const f of fields) {
      f.input.removeAttribute('aria-invalid');
      const fail = (sentence) => {
        errors.push(`${f.title}: ${sentence}`);
        f.input.setAttribute('aria-invalid', 'true');
      };
      if (f.kind === 'boolean') {
        if (f.required || f.input.checked) value[f.name] = f.input.checked;
        continue;
      }
      const raw = f.input.value;
      if (raw.trim() === '') {
        if (f.required) fail('required');
        continue;
      }
      if (f.kind === 'number' || f.kind === 'integer') {
        const n = Number(raw);
        if (!Number.isFinite(n)) fail('not a number');
        else if (f.kind === 'integer' && !Number.isInteger(n)) fail('a whole number is wanted');
        else value[f.name] = n;
      } else if (f.kind === 'json') {
        try {
          value[f.name] = JSON.parse(raw);
        } catch (e) {
          fail(`not JSON (${e.message})`);
        }
      } else {
        value[f.name] = raw;
      }
    }
    return errors.length ? { errors } : { value };
  }

  return { collect, focusFirst: () => fields[0]?.input.focus() };
}
