// A pty-ws/v1 attach over the `pty-ws.v1.binary` subprotocol, with the token as the binding's
// `bearer.` subprotocol entry. Output arrives as PW1O frames (magic, 8-byte sequence, stream byte,
// bytes), keys go out as PW1I frames, everything else is JSON envelopes.
//
// Replay: `cursor` is the sequence of the last output shown. A fresh attach paints the join's
// Keyframe and continues after its anchor; a reconnect asks `replay_from=cursor`, so the output
// missed while away arrives in order and nothing is shown twice (the Keyframe after a replay is not
// painted). When the server no longer holds that output (REPLAY_OUT_OF_RANGE) or this socket lagged
// (PTY_OUTPUT_LAGGED), the next Keyframe is painted instead.
//
// A socket that drops without the session ending is reopened with backoff, for as long as the page
// shows the terminal; a socket that never opened is first checked against the admin API, so a
// session that is gone (404) or a token that was refused (401) stops the retries with a reason.

import {ApiError, admin, attachUrl, bearerSubprotocol} from './api.js';

const SUBPROTOCOL = 'pty-ws.v1.binary';
const OUTPUT_MAGIC = [0x50, 0x57, 0x31, 0x4f]; // PW1O
const INPUT_MAGIC = new Uint8Array([0x50, 0x57, 0x31, 0x49]); // PW1I
const HEADER_BYTES = 13;
const INPUT_CHUNK_BYTES = 64 * 1024;
const RETRY_DELAYS_MS = [250, 500, 1000, 2000, 4000];

/** A UUIDv7 (the binding's envelope ids): 48-bit milliseconds, version 7, variant 10, random. */
function uuid7() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  let ms = Date.now();
  for (let i = 5; i >= 0; i--) {
    bytes[i] = ms % 256;
    ms = Math.floor(ms / 256);
  }
  bytes[6] = (bytes[6] & 0x0f) | 0x70;
  bytes[8] = (bytes[8] & 0x3f) | 0x80;
  const hex = Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

function envelope(op, payload = {}) {
  return JSON.stringify({op, id: uuid7(), ts: new Date().toISOString(), payload});
}

function fromBase64(text) {
  return Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
}

export class Attachment {
  /**
   * @param {object} o
   * @param {string} o.instanceId
   * @param {string} o.sessionId
   * @param {boolean} o.observe join as an observer
   * @param {() => {cols: number, rows: number}} o.size the terminal's size (sent when controlling)
   * @param {object} o.on handlers: output(bytes), keyframe(bytes, cols, rows), resize(cols, rows),
   *   role(role, reason), members(controllers, observers), state(text), notice(text), closed(payload),
   *   error(text), gone(text)
   */
  constructor({instanceId, sessionId, observe, size, on}) {
    Object.assign(this, {instanceId, sessionId, observe, size, on});
    this.cursor = null;
    this.paintKeyframe = true;
    this.role = null;
    this.ended = false;
    this.stopped = false;
    this.socket = null;
    this.everOpened = false;
    this.failures = 0;
    this.reconnects = 0;
    this.timer = null;
  }

  start() {
    this._connect();
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    if (this.socket) this.socket.close(1000, 'left');
  }

  /** Keys (a string from xterm's onData, or bytes), sent only while this tab controls the session. */
  send(data) {
    if (this.role !== 'controller' || !this._open()) return;
    const bytes = typeof data === 'string' ? new TextEncoder().encode(data) : data;
    for (let at = 0; at < bytes.length; at += INPUT_CHUNK_BYTES) {
      const chunk = bytes.subarray(at, at + INPUT_CHUNK_BYTES);
      const frame = new Uint8Array(INPUT_MAGIC.length + chunk.length);
      frame.set(INPUT_MAGIC);
      frame.set(chunk, INPUT_MAGIC.length);
      this.socket.send(frame);
    }
  }

  resize(cols, rows) {
    if (this.role === 'controller' && this._open()) this._send('pty.session_resize', {cols, rows});
  }

  requestControl() {
    if (this._open()) this._send('pty.request_role', {role: 'controller'});
  }

  _open() {
    return this.socket !== null && this.socket.readyState === WebSocket.OPEN;
  }

  _send(op, payload) {
    this.socket.send(envelope(op, payload));
  }

  _connect() {
    const resuming = this.everOpened;
    const socket = new WebSocket(attachUrl(this.instanceId, this.sessionId, this.cursor), [
      SUBPROTOCOL,
      bearerSubprotocol(),
    ]);
    socket.binaryType = 'arraybuffer';
    this.socket = socket;
    this.on.state(resuming ? 'reconnecting' : 'connecting');
    socket.onopen = () => {
      this.everOpened = true;
      this.failures = 0;
      const join = {role: this.observe ? 'observer' : 'controller', client_label: 'web console'};
      if (!this.observe) Object.assign(join, this.size());
      this._send('pty.join_session', join);
      if (resuming) {
        this.reconnects += 1;
        const from = this.cursor === null ? 'the start' : `output #${this.cursor}`;
        this.on.notice(`Reconnected after the connection dropped (${this.reconnects}×): resumed after ${from}.`);
      }
    };
    socket.onmessage = (event) => this._frame(event.data);
    socket.onclose = () => {
      if (this.socket === socket) this.socket = null;
      if (this.stopped || this.ended) return;
      this.on.state('disconnected');
      this._retry();
    };
  }

  async _retry() {
    this.failures += 1;
    if (!this.everOpened || this.failures > 1) {
      try {
        await admin.session(this.instanceId, this.sessionId);
      } catch (error) {
        if (error instanceof ApiError && (error.status === 404 || error.status === 401 || error.status === 403)) {
          this.on.gone(error.message);
          return;
        }
      }
    }
    if (this.stopped) return;
    const delay = RETRY_DELAYS_MS[Math.min(this.failures - 1, RETRY_DELAYS_MS.length - 1)];
    this.timer = setTimeout(() => this._connect(), delay);
  }

  _frame(data) {
    if (data instanceof ArrayBuffer) {
      this._output(data);
      return;
    }
    const frame = JSON.parse(data);
    const payload = frame.payload || {};
    switch (frame.op) {
      case 'ping':
        this._send('pong', {client_ts: payload.client_ts || ''});
        break;
      case 'Error':
        if (payload.code === 'REPLAY_OUT_OF_RANGE') {
          this.paintKeyframe = true;
          this.on.notice('Reconnected, but the output missed meanwhile is no longer held: the screen was redrawn.');
        } else {
          this.on.error(`${payload.code}: ${payload.message}`);
        }
        break;
      case 'pty.session_frame':
        this._sessionFrame(payload);
        break;
      case 'binding_goodbye':
        if (payload.reason !== 'session_closed') {
          this.on.state(`server said goodbye (${payload.detail || payload.reason})`);
        }
        break;
      default:
        break; // binding_hello, pong
    }
  }

  _output(buffer) {
    const bytes = new Uint8Array(buffer);
    if (bytes.length < HEADER_BYTES || OUTPUT_MAGIC.some((b, i) => bytes[i] !== b)) return;
    const seq = Number(new DataView(buffer).getBigUint64(4));
    if (this.cursor !== null && seq <= this.cursor) return; // already shown
    this.cursor = seq;
    this.on.output(bytes.subarray(HEADER_BYTES));
  }

  _sessionFrame(payload) {
    switch (payload.kind) {
      case 'Keyframe':
        if (this.paintKeyframe) {
          this.paintKeyframe = false;
          this.cursor = payload.anchor_sequence;
          this.on.keyframe(fromBase64(payload.snapshot), payload.snapshot_cols, payload.snapshot_rows);
        }
        this.on.state('live');
        break;
      case 'Resize':
        this.on.resize(payload.cols, payload.rows);
        break;
      case 'RoleAssigned':
        this.role = payload.role;
        this.on.role(payload.role, payload.downgraded ? payload.reason || 'another client controls it' : null);
        break;
      case 'MembershipChanged':
        this.on.members(payload.controllers.length, payload.observers.length);
        break;
      case 'Closed':
        this.ended = true;
        this.on.closed(payload);
        break;
      case 'Error':
        if (payload.code === 'PTY_OUTPUT_LAGGED') this.paintKeyframe = true;
        else this.on.error(`${payload.code}: ${payload.message}`);
        break;
      default:
        break;
    }
  }
}
