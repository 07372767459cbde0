// Building the page without HTML strings: every node is made with createElement and every text
// goes in as textContent, so nothing an API returns can become markup (the page's CSP also
// refuses HTML sinks outright: trusted-types 'none').

/** h('a', {href: '#/', class: 'x', onclick: fn}, 'text', child...) */
export function h(tag, props = {}, ...children) {
  const element = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on')) element.addEventListener(key.slice(2), value);
    else if (key === 'class') element.className = value;
    else if (key === 'dataset') Object.assign(element.dataset, value);
    else if (value === true) element.setAttribute(key, '');
    else element.setAttribute(key, String(value));
  }
  append(element, ...children);
  return element;
}

export function append(element, ...children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

export function replace(element, ...children) {
  element.replaceChildren();
  return append(element, ...children);
}

const shown = new WeakMap();

/** Replaces `element`'s children with `build()` only when `data` differs from what it shows, so a
 * refresh that brings nothing new leaves the page (a selection, a link being clicked) alone. */
export function show(element, data, build) {
  const key = JSON.stringify(data);
  if (shown.get(element) === key) return;
  shown.set(element, key);
  replace(element, build());
}

/** An ISO time as the reader's local time, or '' */
export function when(iso) {
  if (!iso) return '';
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? iso : date.toLocaleString();
}

/** A table: columns [{title, cell: row => node|text}], rows; `empty` when there are none. */
export function table(columns, rows, empty, props = {}) {
  if (!rows.length) return h('p', {class: 'empty'}, empty);
  return h('table', props,
    h('thead', {}, h('tr', {}, columns.map((c) => h('th', {}, c.title)))),
    h('tbody', {}, rows.map((row) => h('tr', {}, columns.map((c) => h('td', {}, c.cell(row)))))));
}

/** A section with a heading and a body that can be replaced as data arrives. */
export function section(title, ...extra) {
  const body = h('div', {class: 'section-body'});
  const element = h('section', {}, h('h2', {}, title, ...extra), body);
  return {element, body};
}

/** Repeats `work` every `ms` until `signal` aborts; a failing run does not stop the next. */
export function every(ms, signal, work) {
  let timer = null;
  const run = async () => {
    try {
      await work();
    } catch (error) {
      console.warn(error); // `work` shows its own failures; this only keeps the timer going
    } finally {
      if (!signal.aborted) timer = setTimeout(run, ms);
    }
  };
  signal.addEventListener('abort', () => clearTimeout(timer));
  run();
}
