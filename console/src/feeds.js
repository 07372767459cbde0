// What happens in an instance: its recent A2A tasks (polled, with their artifacts) and its live
// event feed (the admin event stream narrowed to the instance; admin and operator tokens only).

import {ApiError, followEvents, tasks} from './api.js';
import {every, h, replace, section, show, table, when} from './dom.js';
import {errorLine} from './instances.js';

const TASKS_REFRESH_MS = 5000;
const ARTIFACT_PREVIEW_CHARS = 400;
const MAX_EVENTS = 200;

/** TASK_STATE_INPUT_REQUIRED -> input required */
function taskState(state) {
  return String(state || '').replace(/^TASK_STATE_/, '').toLowerCase().replaceAll('_', ' ');
}

function partText(part) {
  if (typeof part.text === 'string') return part.text;
  if (part.data !== undefined) return JSON.stringify(part.data);
  if (part.file) return `[file ${part.file.name || part.file.uri || ''}]`;
  return '';
}

function artifacts(task) {
  const items = (task.artifacts || []).map((artifact) => {
    const text = (artifact.parts || []).map(partText).join('');
    const shown = text.length > ARTIFACT_PREVIEW_CHARS ? `${text.slice(0, ARTIFACT_PREVIEW_CHARS)}…` : text;
    return h('li', {}, h('span', {class: 'artifact-name'}, artifact.name || artifact.artifactId), h('pre', {}, shown));
  });
  return items.length ? h('ul', {class: 'artifacts'}, items) : '';
}

const TASK_COLUMNS = [
  {title: 'Task', cell: (t) => h('code', {title: t.id}, t.id.slice(0, 13))},
  {title: 'State', cell: (t) => h('span', {class: 'task-state'}, taskState(t.status && t.status.state))},
  {title: 'Updated', cell: (t) => when(t.status && t.status.timestamp)},
  {title: 'Artifacts', cell: artifacts},
];

export function tasksSection(instanceId, signal) {
  const {element, body} = section('Recent tasks');
  element.id = 'tasks';
  every(TASKS_REFRESH_MS, signal, async () => {
    try {
      const page = await tasks(instanceId, signal);
      const rows = page.tasks || [];
      show(body, rows, () => table(TASK_COLUMNS, rows, 'No tasks yet.', {id: 'task-list'}));
    } catch (error) {
      if (!signal.aborted) show(body, error.message, () => errorLine(error));
    }
  });
  return element;
}

function eventLine(event, instanceId) {
  // The instance is the page's own: its id in every line's data says nothing.
  const entries = Object.entries(event.data || {}).filter(([k, v]) => !(k === 'instance_id' && v === instanceId));
  const shown = Object.fromEntries(entries);
  const data = Object.keys(shown).length ? JSON.stringify(shown) : '';
  return h('li', {class: 'event', dataset: {kind: event.kind}},
    h('time', {}, when(event.timestamp)), ' ',
    h('strong', {}, event.kind), ' ',
    h('span', {class: 'subject'}, event.subject || ''), ' ',
    h('code', {}, data));
}

export function eventsSection(instanceId, signal) {
  const state = h('span', {id: 'events-state', class: 'feed-state'}, 'connecting');
  const {element, body} = section('Events ', state);
  element.id = 'events';
  const list = h('ol', {id: 'event-list', class: 'events', reversed: true});
  replace(body, list);
  followEvents(instanceId, {
    signal,
    onEvent: (event) => {
      list.prepend(eventLine(event, instanceId)); // newest first
      while (list.childElementCount > MAX_EVENTS) list.lastElementChild.remove();
    },
    onState: (text) => {
      state.textContent = text;
    },
  }).catch((error) => {
    if (signal.aborted) return;
    state.textContent = 'unavailable';
    const text = error instanceof ApiError && error.status === 403
      ? 'This token may not read the event feed (admin and operator tokens may).'
      : error.message;
    replace(body, errorLine({message: text}));
  });
  return element;
}
