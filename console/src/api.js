// The controller's APIs as the console uses them. The token lives in this tab's sessionStorage only
// (gone when the tab closes; never in a URL, never in a cookie) and goes out as a bearer header.

const TOKEN_KEY = 'aiwg.console.token';

export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY),
  set: (value) => sessionStorage.setItem(TOKEN_KEY, value),
  clear: () => sessionStorage.removeItem(TOKEN_KEY),
};

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

const refusedListeners = new Set();

/** `listener()` runs whenever the controller refuses the token (401). */
export function onTokenRefused(listener) {
  refusedListeners.add(listener);
}

/** The error an API answered with: admin problem+json, the A2A error body, or the status alone. */
async function errorOf(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not JSON (a proxy's page): the status says enough
  }
  if (body && body.error && typeof body.error === 'object') {
    const reason = (body.error.details || []).find((d) => d && d.metadata && d.metadata.code);
    return new ApiError(response.status, reason ? reason.metadata.code : body.error.status, body.error.message);
  }
  if (body && (body.detail || body.title)) {
    return new ApiError(response.status, body.code || '', body.detail || body.title);
  }
  return new ApiError(response.status, '', `${response.status} ${response.statusText}`.trim());
}

/** The error for a failed response; a 401 first tells the listeners the token was refused. */
async function failure(response) {
  if (response.status === 401) refusedListeners.forEach((listener) => listener());
  return errorOf(response);
}

function authorized(headers = {}) {
  return {Authorization: `Bearer ${token.get() || ''}`, ...headers};
}

export async function request(method, path, {body, headers, signal} = {}) {
  const init = {
    method,
    headers: authorized({Accept: 'application/json', ...headers}),
    signal,
    cache: 'no-store',
    credentials: 'omit',
  };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers['Content-Type'] = 'application/json';
  }
  const response = await fetch(path, init);
  if (!response.ok) throw await failure(response);
  return response.status === 204 ? null : response.json();
}

const id = encodeURIComponent;

export const admin = {
  instances: (signal) => request('GET', '/api/v2/admin/instances', {signal}),
  instance: (iid, signal) => request('GET', `/api/v2/admin/instances/${id(iid)}`, {signal}),
  wake: (iid, signal) => request('POST', `/api/v2/admin/instances/${id(iid)}/wake`, {signal}),
  sessions: (iid, signal) => request('GET', `/api/v2/admin/instances/${id(iid)}/sessions`, {signal}),
  session: (iid, sid, signal) => request('GET', `/api/v2/admin/instances/${id(iid)}/sessions/${id(sid)}`, {signal}),
  createSession: (iid, body) => request('POST', `/api/v2/admin/instances/${id(iid)}/sessions`, {body}),
  endSession: (iid, sid) => request('DELETE', `/api/v2/admin/instances/${id(iid)}/sessions/${id(sid)}`),
};

/** The instance's newest A2A tasks with their artifacts (HTTP+JSON binding, A2A v1.0). */
export function tasks(iid, signal) {
  const query = 'pageSize=20&includeArtifacts=true&historyLength=0';
  return request('GET', `/agents/${id(iid)}/tasks?${query}`, {signal, headers: {'A2A-Version': '1.0'}});
}

/** The attach socket's URL (same origin, ws: or wss: as the page). */
export function attachUrl(iid, sid, replayFrom) {
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const query = replayFrom === null || replayFrom === undefined ? '' : `?replay_from=${replayFrom}`;
  return `${scheme}//${location.host}/agents/${id(iid)}/sessions/${id(sid)}/attach${query}`;
}

/** The token as the PTY binding's `bearer.<base64url>` subprotocol entry (browsers cannot set
 * an Authorization header on a WebSocket). */
export function bearerSubprotocol() {
  const bytes = new TextEncoder().encode(token.get() || '');
  const base64 = btoa(String.fromCharCode(...bytes));
  return 'bearer.' + base64.replaceAll('+', '-').replaceAll('/', '_').replace(/=+$/, '');
}

/** Parses a text/event-stream body: calls `onFrame({id, event, data})` per event. */
async function readSse(body, onFrame) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let pending = '';
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    pending += value;
    let end;
    while ((end = pending.indexOf('\n\n')) >= 0) {
      const block = pending.slice(0, end);
      pending = pending.slice(end + 2);
      const frame = {id: null, event: 'message', data: ''};
      for (const line of block.split('\n')) {
        if (line.startsWith(':')) continue; // keep-alive comment
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
        if (field === 'id') frame.id = text;
        else if (field === 'event') frame.event = text;
        else if (field === 'data') frame.data += (frame.data ? '\n' : '') + text;
      }
      if (frame.data) onFrame(frame);
    }
  }
}

/**
 * The instance's events: the newest `limit` first (a snapshot), then live (SSE) from just after
 * them, resuming with Last-Event-ID after a drop. `onEvent(event)` per event, `onState(text)` as
 * the feed connects and drops. Resolves when `signal` aborts; rejects with ApiError when the
 * token may not read events (403) or was refused.
 */
export async function followEvents(iid, {signal, onEvent, onState, limit = 50}) {
  const query = `instance_id=${id(iid)}`;
  const snapshot = await request('GET', `/api/v2/admin/events?${query}&limit=${limit}`, {signal});
  snapshot.items.forEach(onEvent);
  let last = String(snapshot.last_id);
  while (!signal.aborted) {
    try {
      const response = await fetch(`/api/v2/admin/events?${query}&follow=true`, {
        headers: authorized({Accept: 'text/event-stream', 'Last-Event-ID': last}),
        signal,
        cache: 'no-store',
        credentials: 'omit',
      });
      if (!response.ok) throw await failure(response);
      onState('live');
      await readSse(response.body, (frame) => {
        if (frame.id) last = frame.id;
        onEvent(JSON.parse(frame.data));
      });
    } catch (error) {
      if (signal.aborted) return;
      if (error instanceof ApiError && (error.status === 401 || error.status === 403)) throw error;
    }
    onState('reconnecting');
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}
