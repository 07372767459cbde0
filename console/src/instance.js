// An instance's page: what it is, its PTY sessions (live and exited) with a form that starts one,
// its recent A2A tasks and its live event feed (feeds.js), and a link to its signed AgentCard.

import {ApiError, admin} from './api.js';
import {every, h, replace, section, show, table, when} from './dom.js';
import {eventsSection, tasksSection} from './feeds.js';
import {errorLine, hostAccessMark, providerOf, stateBadge} from './instances.js';

const SESSIONS_REFRESH_MS = 3000;
const DEFAULT_ARGV = '/bin/bash -l'; // the API's default, shown as the placeholder

/** Words of a command line; '...' and "..." group words (no escapes, no expansion). */
export function splitArgv(line) {
  const words = [];
  for (const match of line.matchAll(/"([^"]*)"|'([^']*)'|(\S+)/g)) words.push(match[1] ?? match[2] ?? match[3]);
  return words;
}

function sessionHref(instanceId, sessionId, observe) {
  const base = `#/instances/${encodeURIComponent(instanceId)}/sessions/${encodeURIComponent(sessionId)}`;
  return observe ? `${base}/observe` : base;
}

function ending(s) {
  if (s.state !== 'exited') return '';  // running, or pending (its first controller starts it)
  if (s.exit_code !== null && s.exit_code !== undefined) return `exit code ${s.exit_code}`;
  if (s.signal) return `signal ${s.signal}`;
  return s.end_reason || '';
}

function summary(instance) {
  const facts = [
    ['Id', instance.id],
    ['Runtime', instance.runtime],
    ['Provider', providerOf(instance)],
    ['State', h('span', {id: 'instance-state'}, stateBadge(instance))],
    ['Loadout', instance.loadout || '—'],
    ['Created', when(instance.created_at)],
  ];
  return h('div', {class: 'summary'},
    h('h1', {}, instance.name, ' ', hostAccessMark(instance)),
    instance.runtime === 'host'
      ? h('p', {class: 'host-note'},
        'Full host access: this instance runs directly on the host machine, with no container or VM boundary.')
      : '',
    h('dl', {id: 'instance-facts'}, facts.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)])),
    h('p', {}, h('a', {id: 'agent-card', href: instance.agent_card_url, target: '_blank', rel: 'noopener noreferrer'},
      'Signed AgentCard')));
}

function newSessionForm(instanceId, go) {
  const argv = h('input', {id: 'session-argv', placeholder: DEFAULT_ARGV, size: 40});
  const cols = h('input', {id: 'session-cols', type: 'number', min: 1, max: 1024, value: 120, required: true});
  const rows = h('input', {id: 'session-rows', type: 'number', min: 1, max: 1024, value: 30, required: true});
  const message = h('span', {class: 'error', role: 'alert'});
  const button = h('button', {id: 'session-create', type: 'submit'}, 'New session');
  const form = h('form', {id: 'new-session', class: 'inline-form'},
    h('label', {}, 'Command ', argv), h('label', {}, 'Columns ', cols), h('label', {}, 'Rows ', rows),
    button, message);
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    button.disabled = true;
    message.textContent = '';
    try {
      const body = {size: {cols: Number(cols.value), rows: Number(rows.value)}};
      const words = splitArgv(argv.value);
      if (words.length) body.argv = words; // else the API's default
      const created = await admin.createSession(instanceId, body);
      go(sessionHref(instanceId, created.id, false));
    } catch (error) {
      message.textContent = error.message;
    } finally {
      button.disabled = false;
    }
  });
  return form;
}

function sessionColumns(instanceId, refresh) {
  const end = async (s) => {
    try {
      await admin.endSession(instanceId, s.id);
    } finally {
      refresh();
    }
  };
  return [
    {
      title: 'Session',
      cell: (s) => h('a', {href: sessionHref(instanceId, s.id, false), title: s.id}, s.id.slice(0, 13)),
    },
    {title: 'Command', cell: (s) => h('code', {}, s.argv.join(' '))},
    {title: 'State', cell: (s) => h('span', {class: `state state-${s.state}`}, s.state)},
    {title: 'Ended', cell: ending},
    {title: 'Size', cell: (s) => `${s.cols}×${s.rows}`},
    {title: 'Started', cell: (s) => when(s.created_at)},
    {title: '', cell: (s) => [
      h('a', {href: sessionHref(instanceId, s.id, false), class: 'action'}, 'Open'), ' ',
      h('a', {href: sessionHref(instanceId, s.id, true), class: 'action'}, 'Observe'), ' ',
      s.state !== 'exited' ? h('button', {type: 'button', class: 'action', onclick: () => end(s)}, 'End') : '',
    ]},
  ];
}

function sessionsSection(instanceId, signal, go) {
  const {element, body} = section('Sessions');
  element.id = 'sessions';
  element.insertBefore(newSessionForm(instanceId, go), body);
  const refresh = async () => {
    try {
      const list = await admin.sessions(instanceId, signal);
      const rows = list.items.slice().reverse(); // newest first
      const columns = sessionColumns(instanceId, refresh);
      show(body, rows, () => table(columns, rows, 'No sessions yet.', {id: 'session-list'}));
    } catch (error) {
      if (!signal.aborted) show(body, error.message, () => errorLine(error));
    }
  };
  every(SESSIONS_REFRESH_MS, signal, refresh);
  return element;
}

/**
 * Opening a sleeping instance wakes it (a person looking at it wants it awake): the badge says so
 * meanwhile. A token that may not wake it (an instance's own) leaves it asleep; its terminal, once
 * opened, wakes it all the same.
 */
function wakeOnOpen(head, instance, signal) {
  const state = head.querySelector('#instance-state');
  replace(state, h('span', {class: 'state state-sleeping mark'}, 'waking…'));
  admin.wake(instance.id, signal).then(
    (woken) => replace(head, summary(woken)),
    () => { if (!signal.aborted) replace(state, stateBadge(instance)); });
}

/** Mounts the instance page; `named(name)` tells the app the instance's name (breadcrumbs). */
export function instancePage(view, {instanceId, signal, go, named}) {
  const head = h('div', {}, h('p', {}, 'Loading…'));
  view.append(head);
  admin.instance(instanceId, signal).then(
    (instance) => {
      named(instance.name);
      replace(head, summary(instance));
      if (instance.state === 'sleeping') wakeOnOpen(head, instance, signal);
      view.append(
        sessionsSection(instanceId, signal, go),
        tasksSection(instanceId, signal),
        eventsSection(instanceId, signal));
    },
    (error) => {
      if (signal.aborted) return;
      const text = error instanceof ApiError && error.status === 404
        ? 'There is no such instance, or this token may not see it.'
        : error.message;
      replace(head, h('p', {id: 'instance-error', class: 'error', role: 'alert'}, text));
    });
  return {dispose() {}};
}
