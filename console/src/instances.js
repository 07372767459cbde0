// The instances the token may see (an instance token: its own), refreshed every few seconds.

import {admin} from './api.js';
import {every, h, section, show, table, when} from './dom.js';

export const REFRESH_MS = 5000;

/** The plain mark a host-runtime instance carries: it runs on the host itself, no boundary. */
export function hostAccessMark(instance) {
  return instance.runtime === 'host' ? h('span', {class: 'mark host-access'}, 'full host access') : '';
}

/** The provider, or for a host instance the daemon that supervises it (upstream names none). */
export function providerOf(instance) {
  return instance.provider || (instance.host_daemon ? instance.host_daemon.label : '—');
}

/** The instance's state; a sleeping one's badge says how it sleeps, since when and why. */
export function stateBadge(instance) {
  const {state, sleep} = instance;
  if (state !== 'sleeping' || !sleep) return h('span', {class: `state state-${state}`}, state);
  const title = `asleep (${sleep.how}) since ${when(sleep.since)}, ${sleep.cause}; traffic wakes it`;
  return h('span', {class: 'state state-sleeping mark', title}, `sleeping · ${sleep.how}`);
}

export function errorLine(error) {
  return h('p', {class: 'error', role: 'alert'}, error.message);
}

const COLUMNS = [
  {
    title: 'Name',
    cell: (i) => h('a', {href: `#/instances/${encodeURIComponent(i.id)}`, class: 'instance-link'}, i.name),
  },
  {title: 'Runtime', cell: (i) => i.runtime},
  {title: 'Provider', cell: providerOf},
  {title: 'State', cell: stateBadge},
  {title: 'Loadout', cell: (i) => i.loadout || '—'},
  {title: 'Created', cell: (i) => when(i.created_at)},
  {title: 'Access', cell: hostAccessMark},
];

export function instancesPage(view, {signal}) {
  const {element, body} = section('Instances');
  view.append(element);
  every(REFRESH_MS, signal, async () => {
    try {
      const list = await admin.instances(signal);
      show(body, list.items, () => table(COLUMNS, list.items, 'This token sees no instances.', {id: 'instances'}));
    } catch (error) {
      if (!signal.aborted) show(body, error.message, () => errorLine(error));
    }
  });
  return {dispose() {}};
}
