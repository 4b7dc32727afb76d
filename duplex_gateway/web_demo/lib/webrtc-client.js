// The Realtime protocol over WebRTC, as OpenAI's browser clients speak it: the page posts its SDP
// offer to `POST /v1/realtime/calls`, the microphone goes out as an Opus track, the reply comes
// back on the gateway's track, and the events travel on the `oai-events` data channel.
//
// It offers the page what `RealtimeClient` does (state, send, connect, disconnect), so the page
// runs one conversation either way. What differs, and why:
// - No audio events: the caller's audio is the track, so the page sends no
//   `input_audio_buffer.append`, and the gateway sends no `response.output_audio.delta`. It paces
//   the reply itself and says when the track starts, stops and is cut
//   (`output_audio_buffer.started` / `stopped` / `cleared`).
// - The gateway knows what was played: a barge-in is truncated by the gateway, not by a
//   `conversation.item.truncate` from the page.
// - No resume: a call that drops is over (its media cannot be picked up again from another
//   connection), so a lost call says so and Retry starts a new one.
// - A refusal is readable: the POST answers the gateway's JSON error (401, 403, 429, 503, 501), so
//   there is no need for the WebSocket path's `/v1/auth/check` detour.

import { displayUrl, keyToken, redactKey } from './realtime-client.js';

// How long the POST and then the media connection may take before the call is given up.
const ANSWER_TIMEOUT_MS = 10000;
const CONNECT_TIMEOUT_MS = 15000;
// How often the browser's own statistics of the call are read (packets, jitter buffer, loss).
const STATS_EVERY_MS = 1000;

/**
 * The calls endpoint for the page's Gateway URL: `ws://host/v1/realtime` (or `/v1/realtime`)
 * becomes `http://host/v1/realtime/calls`. Null when the URL is not a Realtime URL: a call has
 * no other address.
 */
export function callsUrl(gatewayUrl) {
  let u;
  try {
    u = new URL(gatewayUrl, location.href);
  } catch {
    return null;
  }
  if (u.protocol === 'ws:') u.protocol = 'http:';
  else if (u.protocol === 'wss:') u.protocol = 'https:';
  if (u.protocol !== 'http:' && u.protocol !== 'https:') return null;
  const path = u.pathname.replace(/\/+$/, '');
  if (!path.endsWith('/v1/realtime')) return null;
  return new URL(`${path}/calls`, u.origin).toString();
}

/** Whether this browser can make the call at all. */
export const webrtcSupported = () => typeof RTCPeerConnection !== 'undefined';

export class WebRTCClient {
  /**
   * @param {object} o
   * @param {() => string} o.url       the Gateway URL (read at every connect)
   * @param {() => string} o.apiKey    API key or '' (read at every connect)
   * @param {() => MediaStreamTrack|null} o.micTrack  the microphone's track to send
   * @param {(stream: MediaStream) => void} o.onTrack  the gateway's reply track arrived
   * @param {(ev: object) => void} o.onEvent   every server event, once, in order
   * @param {(state: string, detail: object) => void} o.onState  connection state changes
   * @param {(info: object) => void} o.onSession  a session was created
   * @param {(stats: object) => void} o.onStats  the call's statistics, every second
   */
  constructor({ url, apiKey, micTrack, onTrack, onEvent, onState, onSession, onStats }) {
    Object.assign(this, { url, apiKey, micTrack, onTrack, onEvent, onState, onSession, onStats });
    this.transport = 'webrtc';
    this.pc = null;
    this.channel = null;
    this.sender = null;
    this.state = 'idle';
    this.sessionId = null;
    this.callId = null;
    this.sent = {}; // client event type -> count (exposed for tests)
    this.reconnects = 0; // a call is never resumed: kept for the page's counters
    this.resumes = 0;
    this.lastError = null;
    this.generation = 0; // bumped by every connect/disconnect: late answers of an older call are dropped
    this.statsTimer = null;
  }

  get ready() {
    return this.state === 'connected' && this.channel?.readyState === 'open';
  }

  /** Mask the API key wherever `text` might carry it. */
  redact(text) {
    return redactKey(text, this.apiKey().trim());
  }

  send(event) {
    if (!this.channel || this.channel.readyState !== 'open') return false;
    this.channel.send(JSON.stringify(event));
    this.sent[event.type] = (this.sent[event.type] || 0) + 1;
    return true;
  }

  /** The microphone changed (another device): the call sends the new track from now on. */
  replaceMic(track) {
    if (this.sender && track) void this.sender.replaceTrack(track).catch(() => {});
  }

  retryNow() {
    this.connect();
  }

  connect() {
    this.teardown();
    this.generation += 1;
    this.lastError = null;
    this.sessionId = null;
    void this.call(this.generation);
  }

  disconnect() {
    this.generation += 1;
    // session.close ends the session at once rather than when the gateway notices the peer gone.
    this.send({ type: 'session.close' });
    this.teardown();
    this.setState('idle', {});
  }

  setState(state, detail) {
    this.state = state;
    this.onState(state, { ...detail, transport: 'webrtc' });
  }

  teardown() {
    clearInterval(this.statsTimer);
    this.statsTimer = null;
    const { pc, channel } = this;
    this.pc = null;
    this.channel = null;
    this.sender = null;
    this.callId = null;
    this.lastJitter = null;
    if (channel) channel.onclose = channel.onmessage = null;
    if (pc) {
      pc.onconnectionstatechange = pc.ontrack = null;
      pc.close();
    }
  }

  async call(generation) {
    const endpoint = callsUrl(this.url());
    const shown = endpoint ? displayUrl(endpoint) : displayUrl(new URL(this.url(), location.href).toString());
    this.setState('connecting', { attempt: 0, url: shown });
    if (!endpoint) {
      this.setState('failed', { problem: 'webrtc_url', url: shown });
      return;
    }
    const track = this.micTrack();
    const pc = new RTCPeerConnection();
    this.pc = pc;
    // One audio transceiver each way: the microphone out, the reply in.
    this.sender = pc.addTransceiver(track ?? 'audio', { direction: 'sendrecv' }).sender;
    pc.ontrack = (event) => this.onTrack(event.streams[0] ?? new MediaStream([event.track]));
    const channel = pc.createDataChannel('oai-events');
    this.channel = channel;
    channel.onmessage = (message) => this.receive(message.data);
    let connected = false;
    const connectTimer = setTimeout(() => {
      if (generation === this.generation && !connected) this.lost(generation, 'ice', shown);
    }, CONNECT_TIMEOUT_MS);
    pc.onconnectionstatechange = () => {
      if (pc.connectionState === 'connected') {
        connected = true;
        clearTimeout(connectTimer);
      } else if (pc.connectionState === 'failed') {
        clearTimeout(connectTimer);
        this.lost(generation, connected ? 'lost' : 'ice', shown);
      }
    };
    // The gateway closing the events channel ends the call (hang-up, idle timeout, an error).
    channel.onclose = () => {
      clearTimeout(connectTimer);
      if (generation !== this.generation) return;
      if (this.sessionId) this.ended(generation);
      else this.lost(generation, connected ? 'lost' : 'ice', shown);
    };

    let answer;
    try {
      await pc.setLocalDescription(await pc.createOffer());
      answer = await this.post(endpoint, pc.localDescription.sdp);
    } catch (err) {
      if (generation !== this.generation) return;
      clearTimeout(connectTimer);
      this.teardown();
      this.setState('failed', { problem: 'unreachable', attempts: 1, url: shown, why: err?.name });
      return;
    }
    if (generation !== this.generation) return;
    if (answer.refusal) {
      clearTimeout(connectTimer);
      this.teardown();
      this.setState('closed', { refusal: answer.refusal, url: shown });
      return;
    }
    this.callId = answer.callId;
    try {
      await pc.setRemoteDescription({ type: 'answer', sdp: answer.sdp });
    } catch (err) {
      if (generation !== this.generation) return;
      clearTimeout(connectTimer);
      this.teardown();
      this.setState('failed', { problem: 'bad_answer', url: shown, why: String(err?.message ?? err) });
      return;
    }
    this.statsTimer = setInterval(() => void this.readStats(pc), STATS_EVERY_MS);
  }

  /** POST the offer: `{sdp, callId}` for a 201, `{refusal}` for the gateway's JSON error. */
  async post(endpoint, sdp) {
    const headers = { 'Content-Type': 'application/sdp' };
    const key = this.apiKey().trim();
    if (key) headers.Authorization = `Bearer ${keyToken(key)}`;
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), ANSWER_TIMEOUT_MS);
    try {
      const response = await fetch(endpoint, {
        method: 'POST', body: sdp, headers, cache: 'no-store', credentials: 'omit', signal: abort.signal,
      });
      if (response.status === 201) {
        const location = response.headers.get('Location') ?? '';
        return { sdp: await response.text(), callId: location.split('/').pop() || null };
      }
      let error = null;
      try {
        error = (await response.json())?.error ?? null;
      } catch {
        error = null; // not the gateway's JSON (a proxy's page): its status is all there is
      }
      const retryAfter = Number.parseInt(response.headers.get('Retry-After') ?? '', 10);
      return {
        refusal: {
          status: response.status,
          code: typeof error?.code === 'string' ? error.code : `http_${response.status}`,
          message: typeof error?.message === 'string' ? error.message : '',
          retryAfterS: Number.isFinite(retryAfter) && retryAfter >= 0 ? retryAfter : null,
        },
      };
    } finally {
      clearTimeout(timer);
    }
  }

  receive(data) {
    let event;
    try {
      event = JSON.parse(data);
    } catch {
      console.warn('non-JSON message on the events channel', data);
      return;
    }
    if (event.type === 'session.created') {
      this.sessionId = event.session?.id || event.session_id || null;
      this.setState('connected', { sessionId: this.sessionId, callId: this.callId });
      this.onSession({ resumed: false, event });
    }
    if (event.type === 'error') this.lastError = { code: event.error?.code ?? null, message: event.error?.message ?? '' };
    this.onEvent(event);
  }

  /** The gateway ended a call that had a session (its last `error`, if any, says why). */
  ended(generation) {
    if (generation !== this.generation) return;
    this.teardown();
    this.setState('closed', { call: true, error: this.lastError });
  }

  /** The media connection never came up (`ice`) or broke (`lost`). */
  lost(generation, problem, url) {
    if (generation !== this.generation) return;
    const hadSession = Boolean(this.sessionId);
    this.teardown();
    this.setState('failed', { problem, attempts: 1, url, hadSession });
  }

  async readStats(pc) {
    if (pc !== this.pc) return;
    const out = { packetsSent: 0, packetsReceived: 0, packetsLost: 0, jitterBufferMs: null, jitterTargetMs: null, roundTripMs: null };
    try {
      const report = await pc.getStats();
      report.forEach((s) => {
        if (s.type === 'outbound-rtp' && s.kind === 'audio') out.packetsSent = s.packetsSent ?? 0;
        if (s.type === 'inbound-rtp' && s.kind === 'audio') {
          out.packetsReceived = s.packetsReceived ?? 0;
          out.packetsLost = s.packetsLost ?? 0;
          // Over the last reading, not since the call began: the buffer adapts as the network does.
          const last = this.lastJitter;
          const emitted = (s.jitterBufferEmittedCount ?? 0) - (last?.emitted ?? 0);
          if (emitted > 0) {
            out.jitterBufferMs = Math.round((((s.jitterBufferDelay ?? 0) - (last?.delay ?? 0)) / emitted) * 1000);
          }
          if (s.jitterBufferTargetDelay !== undefined && s.jitterBufferEmittedCount > 0) {
            out.jitterTargetMs = Math.round((s.jitterBufferTargetDelay / s.jitterBufferEmittedCount) * 1000);
          }
          this.lastJitter = { emitted: s.jitterBufferEmittedCount ?? 0, delay: s.jitterBufferDelay ?? 0 };
        }
        if (s.type === 'candidate-pair' && s.nominated && s.currentRoundTripTime !== undefined) {
          out.roundTripMs = Math.round(s.currentRoundTripTime * 1000);
        }
      });
    } catch {
      return; // the call closed meanwhile
    }
    if (pc === this.pc) this.onStats(out);
  }
}
