// A WebSocket client for the OpenAI Realtime protocol as the gateway speaks it,
// with reconnect + session resume.
//
// Why resume: a voice call should survive a Wi-Fi hiccup. The gateway keeps a
// dropped session alive for a grace period and journals its events; this
// client remembers the session id, the single-use resume token and the last
// `server_event_seq` it processed, and on an unexpected close reconnects with
// exponential backoff, sending `session.resume` as its FIRST message. The
// gateway answers `session.resumed` and replays what we missed. If it answers
// an `error` instead (token invalid or expired, events no longer held, resume
// turned off) we fall back to a fresh session — the caller loses the
// conversation context, not the call.
//
// Only a connection that carried a session is resumed. A gateway that was never
// reached (wrong URL, nothing listening) is retried a few times with a visible
// backoff, then left alone; a gateway's own verdict (1000, 1008, 1009, 1013
// full, 4xxx) is never retried as if the network had dropped: the page shows
// the close reason and the last `error` event's message instead.
//
// A handshake the gateway refuses (a wrong key, a key without the scope, an
// origin not allowed, too many connections, a key's session cap) is answered
// with HTTP 401/403/429/503 before the upgrade, which a page script cannot see:
// the socket just closes with 1006 before it opened, like an unreachable one.
// So after such a close the client asks `GET /v1/auth/check` with the same key,
// which answers what the handshake got; a refusal there is final (state
// `closed`, detail.refusal), anything else (200, no answer) is a network problem.
//
// Browsers cannot set headers on a WebSocket, so the API key travels as a
// subprotocol, as openai-node does: ["realtime", "openai-insecure-api-key.<key>"].
// A subprotocol must be an HTTP token, so a key with other characters (a space,
// "/", "=") travels base64url-encoded: "openai-insecure-api-key.b64.<base64url>".

const MIN_BACKOFF_MS = 500;
const MAX_BACKOFF_MS = 10000;
const OPEN_TIMEOUT_MS = 10000;
// Retries before giving up: few for a gateway never reached (a wrong URL does
// not fix itself), more to get back to a session that existed (a Wi-Fi hiccup does).
const RETRIES_UNREACHED = 3;
const RETRIES_SESSION = 6;
const FIRST_BACKOFF_UNREACHED_MS = 1000;
// How long to wait for GET /v1/auth/check after a handshake that failed.
const AUTH_CHECK_TIMEOUT_MS = 3000;
// The statuses with which the gateway refuses a handshake before the upgrade.
const REFUSAL_STATUSES = new Set([401, 403, 429, 503]);

// Close codes with which the gateway ends the connection for a reason a retry
// cannot fix at once; every 4xxx the gateway sends is one too.
const FINAL_CLOSE_CODES = new Set([1000, 1008, 1009, 1013]);
// Close codes that end the session itself (gateway shutting down): reconnect,
// but to a fresh session.
const SESSION_OVER_CODES = new Set([1001]);

const KEY_PROTOCOL = 'openai-insecure-api-key.';
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

/** `key` as an HTTP token: as is when it is one, else `b64.<base64url of its UTF-8, unpadded>`. */
export function keyToken(key) {
  if (TOKEN.test(key)) return key;
  let binary = '';
  for (const byte of new TextEncoder().encode(key)) binary += String.fromCharCode(byte);
  return `b64.${btoa(binary).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '')}`;
}

/** The subprotocol that carries `key`: as is when it is a valid token, else base64url-encoded. */
export function keyProtocol(key) {
  return KEY_PROTOCOL + keyToken(key);
}

const truthy = (value) => value !== null && ['1', 'true'].includes(value.toLowerCase());

/**
 * The gateway's `GET /v1/auth/check?scope=...` URL for a WebSocket URL, asking for the scope that
 * URL's handshake needs (`duplex` for /v1/duplex or ?duplex=1, `observe` for ?call_id=), or null
 * when it is not this page's origin: the gateway answers no CORS preflight, so a page can only
 * read its answer from the gateway that served it.
 */
export function authCheckUrl(socketUrl) {
  let u;
  try {
    u = new URL(socketUrl, location.href);
  } catch {
    return null;
  }
  if (u.protocol === 'ws:') u.protocol = 'http:';
  else if (u.protocol === 'wss:') u.protocol = 'https:';
  if (u.origin !== location.origin) return null;
  let scope = 'realtime';
  let prefix = '';
  const path = u.pathname.replace(/\/+$/, '');
  if (path.endsWith('/v1/realtime')) {
    prefix = path.slice(0, -'/v1/realtime'.length);
    if (u.searchParams.has('call_id')) scope = 'observe';
    else if (truthy(u.searchParams.get('duplex'))) scope = 'duplex';
  } else if (path.endsWith('/v1/duplex')) {
    prefix = path.slice(0, -'/v1/duplex'.length);
    scope = 'duplex';
  }
  const check = new URL(`${prefix}/v1/auth/check`, u.origin);
  check.searchParams.set('scope', scope);
  // A key in ?api_key= (older clients) went with the handshake: it goes with the check too.
  const queryKey = u.searchParams.get('api_key');
  if (queryKey) check.searchParams.set('api_key', queryKey);
  return check.toString();
}

/**
 * Why the gateway refuses a handshake with `key` to `socketUrl`: `{status, code, message,
 * retryAfterS}` when `GET /v1/auth/check` answers 401/403/429/503 with the gateway's JSON error;
 * null when it would be accepted (200), cannot be asked (another origin) or does not answer in time.
 */
export async function checkRefusal(socketUrl, key, timeoutMs = AUTH_CHECK_TIMEOUT_MS) {
  const url = authCheckUrl(socketUrl);
  if (!url) return null;
  const headers = { Accept: 'application/json' };
  if (key) headers.Authorization = `Bearer ${keyToken(key)}`;
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), timeoutMs);
  try {
    const response = await fetch(url, { headers, cache: 'no-store', credentials: 'omit', signal: abort.signal });
    if (!REFUSAL_STATUSES.has(response.status)) return null;
    // Only the gateway's own JSON error is its verdict (a proxy's 503 page is not).
    const error = (await response.json())?.error;
    if (!error || typeof error.code !== 'string') return null;
    const retryAfter = Number.parseInt(response.headers.get('Retry-After') ?? '', 10);
    return {
      status: response.status,
      code: error.code,
      message: typeof error.message === 'string' ? error.message : '',
      retryAfterS: Number.isFinite(retryAfter) && retryAfter >= 0 ? retryAfter : null,
    };
  } catch {
    return null; // no answer (network, timeout) or not JSON: nothing more is known
  } finally {
    clearTimeout(timer);
  }
}

/** `text` with `key` masked, as typed and in each form it travels in (a subprotocol, a query). */
export function redactKey(text, key) {
  let out = String(text ?? '');
  if (!key) return out;
  for (const secret of [keyToken(key), encodeURIComponent(key), key]) {
    if (secret.length >= 3) out = out.split(secret).join('•••');
  }
  return out;
}

/** The URL without its query and credentials, fit to show (a key may ride in `?api_key=`). */
export function displayUrl(url) {
  try {
    const u = new URL(url);
    return `${u.protocol}//${u.host}${u.pathname}`;
  } catch {
    return '(invalid URL)';
  }
}

export class RealtimeClient {
  /**
   * @param {object} o
   * @param {() => string} o.url       WebSocket URL (read at every (re)connect)
   * @param {() => string} o.apiKey    API key or '' (read at every (re)connect)
   * @param {(ev: object) => void} o.onEvent   every server event, once, in order
   * @param {(state: string, detail: object) => void} o.onState  connection state changes
   * @param {(info: object) => void} o.onSession  a session was created or resumed
   */
  constructor({ url, apiKey, onEvent, onState, onSession }) {
    this.url = url;
    this.apiKey = apiKey;
    this.onEvent = onEvent;
    this.onState = onState;
    this.onSession = onSession;
    this.ws = null;
    this.state = 'idle';
    this.wanted = false; // the user wants to be connected
    this.attempt = 0;
    this.retryTimer = null;
    this.sessionId = null;
    this.resumeToken = null;
    this.lastSeq = 0;
    this.resuming = false;
    this.ignoreResumeError = false;
    this.resumeEventId = null;
    this.sent = {}; // client event type -> count (exposed for tests)
    this.reconnects = 0;
    this.resumes = 0;
    this.hadSession = false; // a session existed since connect(): only then is a drop resumed
    this.lastError = null; // the last `error` event on the current socket ({code, message})
    this.retry = null; // the scheduled retry: {at, resume}
    this.generation = 0; // bumped by every open/disconnect: a late auth check for an older one is dropped
  }

  get ready() {
    return this.state === 'connected';
  }

  connect() {
    this.wanted = true;
    this.attempt = 0;
    this.hadSession = false;
    this.forgetSession();
    this.open(false);
  }

  /** Skip the rest of the backoff: retry now. */
  retryNow() {
    if (this.state !== 'reconnecting' || !this.retry) return;
    this.open(this.retry.resume);
  }

  disconnect() {
    this.wanted = false;
    this.generation += 1;
    clearTimeout(this.retryTimer);
    this.retry = null;
    const ws = this.ws;
    this.ws = null;
    if (ws && ws.readyState === WebSocket.OPEN) {
      // session.close ends the session now instead of leaving it detached
      // (and holding an engine slot) for the gateway's resume grace period.
      this.send({ type: 'session.close' }, ws);
      ws.close(1000, 'client disconnect');
    } else if (ws) {
      ws.close();
    }
    this.forgetSession();
    this.setState('idle', {});
  }

  forgetSession() {
    this.sessionId = null;
    this.resumeToken = null;
    this.lastSeq = 0;
  }

  send(event, ws = this.ws) {
    if (!ws || ws.readyState !== WebSocket.OPEN) return false;
    ws.send(JSON.stringify(event));
    this.sent[event.type] = (this.sent[event.type] || 0) + 1;
    return true;
  }

  setState(state, detail) {
    this.state = state;
    this.onState(state, detail);
  }

  socketUrl(resume) {
    const url = new URL(this.url(), location.href);
    if (url.protocol === 'http:') url.protocol = 'ws:';
    if (url.protocol === 'https:') url.protocol = 'wss:';
    // Asks the gateway to wait for our first message instead of opening a new
    // session at once; a gateway that ignores it still gets session.resume first.
    // The session id rides in the URL too: a load balancer in front of several
    // gateways routes the resume to the process holding the session (docs/scaling.md).
    if (resume) {
      url.searchParams.set('resume', '1');
      url.searchParams.set('session_id', this.sessionId);
    }
    return url.toString();
  }

  /** Mask the API key (as typed and as sent) wherever `text` might carry it. */
  redact(text) {
    return redactKey(text, this.apiKey().trim());
  }

  open(resume) {
    clearTimeout(this.retryTimer);
    this.retry = null;
    this.generation += 1;
    const protocols = ['realtime'];
    const key = this.apiKey().trim();
    if (key) protocols.push(keyProtocol(key));
    let ws;
    let url;
    try {
      url = this.socketUrl(resume);
      ws = new WebSocket(url, protocols);
    } catch (err) {
      // A malformed URL, a scheme other than ws(s), or ws:// from an https page.
      // The exception's own text may quote the URL or the key: never shown.
      this.wanted = false;
      const problem = err?.name === 'SecurityError' ? 'insecure_url' : 'invalid_url';
      this.setState('failed', { problem, url: url ? displayUrl(url) : '' });
      return;
    }
    this.ws = ws;
    this.resuming = resume;
    this.ignoreResumeError = false;
    this.lastError = null;
    let opened = false;
    // A close this page asked for (its open timeout, a test simulating a drop) is
    // not the gateway's verdict, whatever code it carries: count it as a drop.
    let closedHere = false;
    const close = ws.close.bind(ws);
    ws.close = (...args) => {
      closedHere = true;
      close(...args);
    };
    this.setState(resume ? 'resuming' : 'connecting', { attempt: this.attempt, url: displayUrl(url) });
    const openTimer = setTimeout(() => {
      if (ws.readyState === WebSocket.CONNECTING) ws.close();
    }, OPEN_TIMEOUT_MS);

    ws.onopen = () => {
      clearTimeout(openTimer);
      opened = true;
      if (resume) {
        this.resumeEventId = `evt_resume_${this.reconnects}`;
        this.send(
          {
            type: 'session.resume',
            event_id: this.resumeEventId,
            session_id: this.sessionId,
            resume_token: this.resumeToken,
            last_received_server_event_seq: this.lastSeq,
          },
          ws,
        );
      }
    };
    ws.onmessage = (message) => {
      if (ws !== this.ws) return; // a socket we already gave up on
      let event;
      try {
        event = JSON.parse(message.data);
      } catch {
        console.warn('non-JSON message from the gateway', message.data);
        return;
      }
      this.receive(ws, event);
    };
    ws.onclose = (event) => {
      clearTimeout(openTimer);
      if (ws !== this.ws) return;
      this.ws = null;
      this.closed(event, { opened, closedHere, url: displayUrl(url), socketUrl: url, key });
    };
    ws.onerror = () => {
      // Always followed by a close event, which carries what we need.
    };
  }

  receive(ws, event) {
    const seq = event.server_event_seq;
    const type = event.type;
    if (type === 'session.created') {
      // A new session (also what a gateway without resume answers a resume with).
      if (this.resuming) this.ignoreResumeError = true;
      this.resuming = false;
      this.sessionId = event.session_id || event.session?.id || null;
      this.resumeToken = event.resume_token || null;
      this.lastSeq = typeof seq === 'number' ? seq : 0;
      this.attempt = 0;
      this.hadSession = true;
      this.setState('connected', { sessionId: this.sessionId });
      this.onSession({ resumed: false, event });
      this.onEvent(event);
      return;
    }
    if (type === 'session.resumed') {
      this.resuming = false;
      this.resumeToken = event.resume_token || null;
      this.sessionId = event.session_id || event.session?.id || this.sessionId;
      this.attempt = 0;
      this.hadSession = true;
      this.resumes += 1;
      // session.resumed is not journaled; the replay that follows starts after lastSeq.
      this.setState('connected', { sessionId: this.sessionId, resumed: true });
      this.onSession({ resumed: true, event });
      this.onEvent(event);
      return;
    }
    if (type === 'session.resync_required' && this.resuming) {
      // The events we missed are no longer held (vLLM-Omni's answer): start over.
      this.startOver(ws, type);
      return;
    }
    if (type === 'error' && (this.resuming || (this.ignoreResumeError && this.aboutResume(event.error)))) {
      const code = event.error?.code;
      if (this.ignoreResumeError) {
        // The gateway opened a fresh session and then rejected our resume; keep the fresh one.
        this.ignoreResumeError = false;
        console.info(`resume not supported here (${code}); continuing with the new session`);
        return;
      }
      // invalid_resume_token / session_expired / resume turned off: start over.
      this.startOver(ws, code);
      return;
    }
    if (typeof seq === 'number') {
      if (seq <= this.lastSeq) return; // replayed twice; already handled
      this.lastSeq = seq;
    }
    if (type === 'error') this.lastError = { code: event.error?.code ?? null, message: event.error?.message ?? '' };
    this.onEvent(event);
  }

  /** The session cannot be resumed: drop it and open a new one. */
  startOver(ws, why) {
    console.info(`session could not be resumed (${why}); starting a new session`);
    this.forgetSession();
    this.resuming = false;
    this.ws = null;
    ws.onclose = null;
    ws.close(1000, 'resume refused');
    this.open(false);
  }

  /** Whether an error answers our session.resume (by event_id, or by what it says). */
  aboutResume(error = {}) {
    if (error.event_id) return error.event_id === this.resumeEventId;
    return /resume/i.test(`${error.code} ${error.param} ${error.message}`);
  }

  closed(close, { opened, closedHere, url, socketUrl, key }) {
    this.resuming = false;
    if (!this.wanted) {
      this.setState('idle', {});
      return;
    }
    const detail = {
      code: close.code,
      reason: close.reason || '',
      error: this.lastError,
      opened,
      hadSession: this.hadSession,
      url,
    };
    const verdict = !closedHere && (FINAL_CLOSE_CODES.has(close.code) || (close.code >= 4000 && close.code <= 4999));
    if (verdict) {
      this.wanted = false;
      this.forgetSession();
      this.setState('closed', detail);
      return;
    }
    if (!opened && !closedHere && close.code === 1006) {
      // Unreachable, or refused before the upgrade: ask the gateway which (the state stays
      // connecting/resuming meanwhile). A Disconnect or a new attempt meanwhile drops the answer.
      const generation = this.generation;
      void checkRefusal(socketUrl, key).then((refusal) => {
        if (generation !== this.generation || !this.wanted) return;
        if (refusal) {
          this.wanted = false;
          this.forgetSession();
          this.setState('closed', { ...detail, refusal });
          return;
        }
        this.retryOrGiveUp(close, detail);
      });
      return;
    }
    this.retryOrGiveUp(close, detail);
  }

  /** A close that was no verdict of the gateway's: schedule the next attempt, or stop after the last. */
  retryOrGiveUp(close, detail) {
    if (SESSION_OVER_CODES.has(close.code)) this.forgetSession();
    const retries = this.hadSession ? RETRIES_SESSION : RETRIES_UNREACHED;
    if (this.attempt >= retries) {
      this.wanted = false;
      this.forgetSession();
      this.setState('failed', { ...detail, problem: this.hadSession ? 'lost' : 'unreachable', attempts: this.attempt + 1 });
      return;
    }
    // Exponential backoff with jitter, so a restarted gateway is not hit by every client at once.
    const first = this.hadSession ? MIN_BACKOFF_MS : FIRST_BACKOFF_UNREACHED_MS;
    const base = Math.min(MAX_BACKOFF_MS, first * 2 ** this.attempt);
    const delay = Math.round(base * (0.8 + 0.4 * Math.random()));
    this.attempt += 1;
    this.reconnects += 1;
    const resume = Boolean(this.sessionId && this.resumeToken);
    this.retry = { at: performance.now() + delay, resume };
    this.setState('reconnecting', {
      ...detail,
      delayMs: delay,
      retryAt: this.retry.at,
      attempt: this.attempt,
      retries,
      resume,
    });
    this.retryTimer = setTimeout(() => this.open(resume), delay);
  }
}
