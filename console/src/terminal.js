// The terminal page: xterm.js on one session's attach socket (ptyws.js). The terminal's size
// follows the window while this tab controls the session; an observer shows the session at the
// size its controller set. The status line says the connection's state and this tab's role, a
// notice says when a dropped connection came back (and from where), a banner how the session ended.

import {FitAddon} from './vendor/addon-fit.mjs';
import {Terminal} from './vendor/xterm.mjs';
import {h} from './dom.js';
import {Attachment} from './ptyws.js';

function describeEnd(closed) {
  if (closed.exit_code !== undefined && closed.exit_code !== null) {
    return `The session ended: exited with code ${closed.exit_code}.`;
  }
  return `The session ended: ${closed.reason}${closed.detail ? ` (${closed.detail})` : ''}.`;
}

/** Mounts the terminal page into `view`; returns {dispose, snapshot} (snapshot: for the test hook). */
export function terminalPage(view, {instanceId, sessionId, observe}) {
  const status = h('span', {id: 'term-status'}, 'connecting');
  const role = h('span', {id: 'term-role'});
  const members = h('span', {id: 'term-members'});
  const control = h('button', {id: 'term-control', type: 'button', hidden: true}, 'Take control');
  const notice = h('div', {id: 'term-notice', class: 'notice', hidden: true});
  const ended = h('div', {id: 'term-exit', class: 'banner', hidden: true});
  const screen = h('div', {id: 'terminal', class: 'terminal'});
  view.append(
    h('div', {class: 'term-page'},
      h('div', {class: 'term-bar'},
        h('strong', {}, `session ${sessionId}`), status, role, members, control),
      notice, ended, screen));

  const term = new Terminal({
    cursorBlink: true,
    fontFamily: 'ui-monospace, "DejaVu Sans Mono", "Liberation Mono", monospace',
    fontSize: 14,
    scrollback: 10000,
  });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(screen);
  fit.fit();

  const state = {status: 'connecting', role: null, exit: null, notice: null};
  const show = (element, text) => {
    element.textContent = text || '';
    element.hidden = !text;
  };
  const attachment = new Attachment({
    instanceId,
    sessionId,
    observe,
    size: () => ({cols: term.cols, rows: term.rows}),
    on: {
      output: (bytes) => term.write(bytes),
      keyframe: (bytes, cols, rows) => {
        if (attachment.role !== 'controller') term.resize(cols, rows);
        term.write(bytes);
      },
      resize: (cols, rows) => {
        if (attachment.role !== 'controller') term.resize(cols, rows);
      },
      role: (assigned, downgradedBecause) => {
        state.role = assigned;
        role.textContent = assigned === 'controller' ? 'controlling' : 'observing (keys are not sent)';
        control.hidden = assigned === 'controller';
        if (downgradedBecause) show(notice, `Joined as an observer: ${downgradedBecause}.`);
        if (assigned === 'controller') {
          fit.fit();
          attachment.resize(term.cols, term.rows);
          term.focus();
        }
      },
      members: (controllers, observers) => {
        members.textContent = `${controllers} controlling, ${observers} observing`;
      },
      state: (text) => {
        state.status = text;
        status.textContent = text;
      },
      notice: (text) => {
        state.notice = text;
        show(notice, text);
      },
      closed: (payload) => {
        state.exit = payload;
        state.status = 'ended';
        status.textContent = 'ended';
        control.hidden = true;
        term.options.disableStdin = true;
        show(ended, describeEnd(payload));
      },
      error: (text) => show(notice, text),
      gone: (text) => {
        state.status = 'gone';
        status.textContent = 'not attached';
        show(ended, `Cannot attach: ${text}`);
      },
    },
  });
  term.onData((data) => attachment.send(data));
  term.onBinary((data) => attachment.send(Uint8Array.from(data, (c) => c.charCodeAt(0) & 0xff)));
  term.onResize(({cols, rows}) => attachment.resize(cols, rows));
  control.addEventListener('click', () => attachment.requestControl());

  // Follow the window (and any layout change) while controlling; rAF coalesces a drag's events.
  let frame = 0;
  const refit = new ResizeObserver(() => {
    cancelAnimationFrame(frame);
    frame = requestAnimationFrame(() => {
      if (attachment.role === 'controller') fit.fit();
    });
  });
  refit.observe(screen);
  attachment.start();
  term.focus();

  return {
    dispose() {
      refit.disconnect();
      cancelAnimationFrame(frame);
      attachment.stop();
      term.dispose();
    },
    snapshot() {
      const buffer = term.buffer.active;
      const lines = [];
      for (let i = 0; i < buffer.length; i++) lines.push(buffer.getLine(i).translateToString(true));
      return {
        lines,
        cols: term.cols,
        rows: term.rows,
        role: state.role,
        status: state.status,
        reconnects: attachment.reconnects,
        cursor: attachment.cursor,
        notice: state.notice,
        exit: state.exit,
      };
    },
  };
}
