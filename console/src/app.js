// The console's entry: routes (in the URL's fragment, which never holds a secret) to the page that
// shows them, and the read-only hook the browser tests read the terminal through.
//
//   #/                                     the instances (or the sign-in form without a token)
//   #/instances/{id}                       an instance
//   #/instances/{id}/sessions/{sid}        its session's terminal, controlling when it may
//   #/instances/{id}/sessions/{sid}/observe  the same, observing only
//
// Each page gets an AbortSignal and returns {dispose}; leaving a page aborts its requests, closes
// its sockets and disposes its terminal.

import './csp.js'; // first: stamps the style nonce before anything makes a <style>
import {admin, onTokenRefused, token} from './api.js';
import {h, replace} from './dom.js';
import {instancePage} from './instance.js';
import {instancesPage} from './instances.js';
import {signInPage} from './signin.js';
import {terminalPage} from './terminal.js';

const view = document.getElementById('view');
const crumbs = document.getElementById('crumbs');
const signOut = document.getElementById('signout');

let current = null; // {name, page, controller}

const ROUTES = [
  [/^#\/?$/, 'instances'],
  [/^#\/instances\/([^/]+)$/, 'instance'],
  [/^#\/instances\/([^/]+)\/sessions\/([^/]+)(\/observe)?$/, 'terminal'],
];

function match(hash) {
  for (const [pattern, name] of ROUTES) {
    const found = pattern.exec(hash);
    if (found) return {name, args: found.slice(1).map((part) => (part ? decodeURIComponent(part) : part))};
  }
  return {name: 'unknown', args: []};
}

function go(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

function breadcrumbs(instanceId, name, sessionId) {
  const parts = [h('a', {href: '#/'}, 'Instances')];
  if (instanceId) {
    parts.push(' › ', h('a', {href: `#/instances/${encodeURIComponent(instanceId)}`}, name || instanceId));
  }
  if (sessionId) parts.push(' › ', `session ${sessionId.slice(0, 13)}`);
  replace(crumbs, parts);
}

function leave() {
  if (current === null) return;
  current.controller.abort();
  current.page.dispose();
  current = null;
  view.replaceChildren();
}

function route(reason) {
  leave();
  const controller = new AbortController();
  const signal = controller.signal;
  if (!token.get()) {
    signOut.hidden = true;
    replace(crumbs);
    current = {name: 'signin', controller, page: signInPage(view, {reason, done: () => route()})};
    return;
  }
  signOut.hidden = false;
  const {name, args} = match(location.hash || '#/');
  let page;
  if (name === 'instances') {
    breadcrumbs();
    page = instancesPage(view, {signal});
  } else if (name === 'instance') {
    const [instanceId] = args;
    breadcrumbs(instanceId);
    page = instancePage(view, {instanceId, signal, go, named: (label) => breadcrumbs(instanceId, label)});
  } else if (name === 'terminal') {
    const [instanceId, sessionId, observe] = args;
    breadcrumbs(instanceId, null, sessionId);
    admin.instance(instanceId, signal).then((i) => breadcrumbs(instanceId, i.name, sessionId), () => {});
    page = terminalPage(view, {instanceId, sessionId, observe: Boolean(observe)});
  } else {
    breadcrumbs();
    view.append(h('p', {class: 'error'}, 'There is no such page here.'));
    page = {dispose() {}};
  }
  current = {name, controller, page};
}

onTokenRefused(() => {
  token.clear();
  if (current && current.name !== 'signin') route('The controller refused the token; sign in again.');
});
signOut.addEventListener('click', () => {
  token.clear();
  go('#/');
});
window.addEventListener('hashchange', () => route());

// For the browser tests (and the curious): the terminal's screen and state, read-only. It hands
// out copies, never the terminal or its socket.
Object.defineProperty(window, 'aiwgConsole', {
  value: Object.freeze({
    page: () => (current ? current.name : null),
    terminal: () => (current && current.page.snapshot ? current.page.snapshot() : null),
  }),
});

route();
