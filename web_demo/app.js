// The voice-chat page: wires the microphone, the Realtime connection, playback
// and the UI together. It uses only the public protocol described in the
// README, so it doubles as a reference client: nothing here assumes a
// particular engine (partial transcripts, text-only replies and missing
// events all degrade gracefully).

import { AudioIO, listMicrophones } from './lib/audio.js';
import { FORMATS, base64ToBytes, bytesToBase64, decode, formatName } from './lib/codecs.js';
import { ConversationView } from './lib/conversation.js';
import { JitterEstimator } from './lib/jitter.js';
import { CaptureClock, LatencyTracker } from './lib/latency.js';
import { RealtimeClient } from './lib/realtime-client.js';
import { renderLatency } from './lib/timeline.js';

const $ = (id) => document.getElementById(id);

// ---------------------------------------------------------------------------
// Settings (persisted locally; the API key only for this browser tab)

const STORAGE_KEY = 'duplex-gateway-demo';
const IN_RATES = [8000, 16000, 24000, 48000];
const OUT_RATES = [8000, 16000, 22050, 24000, 44100, 48000];
const form = $('settings');

function fillSelect(select, options, value) {
  select.replaceChildren(
    ...options.map(([v, label]) => {
      const opt = document.createElement('option');
      opt.value = String(v);
      opt.textContent = label;
      return opt;
    }),
  );
  select.value = String(value);
}

function initSettingsForm() {
  const formats = Object.entries(FORMATS).map(([name, f]) => [name, f.label]);
  fillSelect($('in-format'), formats, 'pcm16');
  fillSelect($('out-format'), formats, 'pcm16');
  fillSelect($('in-rate'), IN_RATES.map((r) => [r, r.toLocaleString('en')]), 24000);
  fillSelect($('out-rate'), OUT_RATES.map((r) => [r, r.toLocaleString('en')]), 24000);
  let saved = {};
  try {
    saved = JSON.parse(localStorage.getItem(STORAGE_KEY) || '{}');
  } catch {
    saved = {};
  }
  for (const [name, value] of Object.entries(saved)) {
    const field = form.elements.namedItem(name);
    if (field && name !== 'apiKey' && name !== 'device') field.value = value;
  }
  $('api-key').value = sessionStorage.getItem(`${STORAGE_KEY}:key`) || '';
  form.classList.toggle('no-vad', $('turn').value === 'none');
}

function readSettings() {
  const num = (id, fallback) => {
    const v = Number($(id).value);
    return Number.isFinite(v) && v > 0 ? v : fallback;
  };
  return {
    url: $('url').value.trim() || '/v1/realtime',
    apiKey: $('api-key').value,
    device: $('device').value,
    voice: $('voice').value.trim() || 'default',
    turn: $('turn').value,
    threshold: Math.min(0.95, Math.max(0.05, num('threshold', 0.5))),
    silence: Math.round(num('silence', 500)),
    inFormat: $('in-format').value,
    inRate: num('in-rate', 24000),
    outFormat: $('out-format').value,
    outRate: num('out-rate', 24000),
    frameMs: num('frame-ms', 20),
  };
}

function saveSettings() {
  const { apiKey, device, ...rest } = readSettings();
  localStorage.setItem(STORAGE_KEY, JSON.stringify(rest));
  sessionStorage.setItem(`${STORAGE_KEY}:key`, apiKey);
}

// ---------------------------------------------------------------------------
// State

/** Counters for people and for tests (window.__demo.stats). */
const stats = {
  state: 'idle',
  sessionId: null,
  samplesPlayed: 0,
  playbackRate: 0,
  bufferedMs: 0,
  jitterTargetMs: 120,
  underruns: 0,
  flushes: 0,
  truncatesSent: 0,
  acksSent: 0,
  responses: 0,
  responsesCancelled: 0,
  turns: 0,
  lastLatencyMs: null,
  medianLatencyMs: null,
  framesSent: 0,
  audioMsSent: 0,
  reconnects: 0,
  resumes: 0,
};
const errors = [];
const recentEvents = [];

let session = null; // what the gateway says the session is (see readSession)
let streaming = false; // mic frames go to the gateway (off while a session.update is in flight)
let muted = false;
let sessionsSeen = 0;
let uncommittedMs = 0; // audio sent since the last commit (push-to-talk)
let committedMs = null; // audio in the turn our last commit ended
let updateCount = 0;
let pendingUpdateId = null; // event_id of the session.update awaiting its answer
let activeResponseId = null;
const speechStartMs = new Map(); // caller item -> audio_start_ms (for the bubble's duration)
/** responseId -> {itemId, rate, receivedSamples, audio, fenced, ended, finished} */
const responses = new Map();

const view = new ConversationView($('transcript'), $('empty-hint'));
const captureClock = new CaptureClock();
const jitter = new JitterEstimator();
const latency = new LatencyTracker((turn) => {
  stats.turns = latency.turns.length;
  stats.lastLatencyMs = turn.totalMs;
  stats.medianLatencyMs = latency.median();
  renderLatency(
    { value: $('latency-value'), median: $('latency-median'), timeline: $('timeline') },
    latency.turns,
  );
});

const audio = new AudioIO({ onFrame, onPlayback });
const client = new RealtimeClient({
  url: () => readSettings().url,
  apiKey: () => readSettings().apiKey,
  onEvent,
  onState,
  onSession,
});

window.__demo = {
  stats,
  errors,
  events: recentEvents,
  get sent() {
    return client.sent;
  },
  transcript: () => view.snapshot(),
  turns: () => latency.turns.map(({ id, totalMs, parts, how }) => ({ id, totalMs, parts, how })),
  client,
  audio,
};

// ---------------------------------------------------------------------------
// Session configuration

function defaultRate(name) {
  return name === 'g711_ulaw' || name === 'g711_alaw' ? 8000 : 24000;
}

/**
 * The session object of session.created/updated/resumed, GA or beta shape.
 * Engine capabilities only come with session.created/resumed; updates keep them.
 */
function readSession(s, previous = null) {
  const ain = s.audio?.input;
  const aout = s.audio?.output;
  const inFmt = ain?.format ?? s.input_audio_format;
  const outFmt = aout?.format ?? s.output_audio_format;
  const inName = formatName(inFmt);
  const outName = formatName(outFmt);
  return {
    id: s.id,
    input: { format: inName, rate: inFmt?.rate ?? s.sample_rate_hz ?? defaultRate(inName) },
    output: { format: outName, rate: outFmt?.rate ?? s.output_sample_rate_hz ?? defaultRate(outName) },
    turnDetection: ain ? ain.turn_detection ?? null : s.turn_detection ?? null,
    voice: aout?.voice ?? s.voice,
    voices: s.capabilities?.voices || previous?.voices || [],
    engine: s.capabilities?.engine || previous?.engine,
  };
}

function sendSessionUpdate() {
  const s = readSettings();
  const turnDetection =
    s.turn === 'none'
      ? null
      : {
          type: 'server_vad',
          threshold: s.threshold,
          silence_duration_ms: s.silence,
          create_response: true,
          interrupt_response: true,
        };
  // Frames already captured in the old format must not reach the gateway after
  // it switched: hold the mic until session.updated confirms the new format.
  streaming = false;
  updateCount += 1;
  pendingUpdateId = `evt_update_${updateCount}`;
  client.send({
    type: 'session.update',
    event_id: pendingUpdateId,
    session: {
      type: 'realtime',
      audio: {
        input: {
          format: { type: FORMATS[s.inFormat].ga, rate: s.inRate },
          turn_detection: turnDetection,
          transcription: { model: 'whisper-1' },
        },
        output: {
          format: { type: FORMATS[s.outFormat].ga, rate: s.outRate },
          voice: s.voice,
        },
      },
    },
  });
}

/** Adopt the session as the gateway reports it (never what we merely asked for). */
function adoptSession(s) {
  session = readSession(s, session);
  applySession();
}

/** Point capture, playback and the UI at `session`, and let the mic stream. */
function applySession() {
  audio.configureCapture({ ...session.input, frameMs: readSettings().frameMs });
  audio.setOutputRate(session.output.rate);
  const voices = $('voices');
  if (session.voices.length) {
    voices.replaceChildren(
      ...session.voices.map((v) => Object.assign(document.createElement('option'), { value: v })),
    );
  }
  const td = session.turnDetection;
  const ptt = td === null;
  $('ptt').hidden = !ptt;
  const fmt = (f) => `${f.format} ${f.rate / 1000} kHz`;
  $('session-info').textContent = [
    session.engine && `engine ${session.engine}`,
    `in ${fmt(session.input)}`,
    `out ${fmt(session.output)}`,
    ptt ? 'push-to-talk' : `VAD ${td.silence_duration_ms ?? ''} ms`,
  ]
    .filter(Boolean)
    .join(' · ');
  streaming = true;
  updateControls();
}

function onSession({ resumed, event }) {
  stats.sessionId = client.sessionId;
  if (resumed) {
    stats.resumes = client.resumes;
    view.divider('Reconnected · session resumed');
    adoptSession(event.session || {});
    return;
  }
  // A new session: whatever was playing belongs to a conversation that is gone.
  if (sessionsSeen > 0) view.divider('New session');
  sessionsSeen += 1;
  void audio.flush('new_session');
  responses.clear();
  activeResponseId = null;
  captureClock.reset();
  latency.reset();
  speechStartMs.clear();
  uncommittedMs = 0;
  session = readSession(event.session || {});
  sendSessionUpdate();
}

// ---------------------------------------------------------------------------
// Microphone -> gateway

function onFrame(frame) {
  showLevel(frame.rms);
  if (!streaming || muted || !client.ready || !session) return;
  // A frame cut before a reconfiguration reached the worklet: drop it.
  if (frame.rate !== session.input.rate || frame.format !== session.input.format) return;
  client.send({ type: 'input_audio_buffer.append', audio: bytesToBase64(frame.bytes) });
  const ms = (frame.samples * 1000) / frame.rate;
  captureClock.sent(ms, frame.endTime);
  uncommittedMs += ms;
  stats.framesSent += 1;
  stats.audioMsSent += ms;
}

let levelPending = null;
function showLevel(rms) {
  // dBFS mapped to 0-100 over a 60 dB range: speech sits in the upper half.
  const db = 20 * Math.log10(Math.max(rms, 1e-6));
  const pct = Math.round(Math.min(100, Math.max(0, ((db + 60) / 60) * 100)));
  if (levelPending !== null) {
    levelPending = pct;
    return;
  }
  levelPending = pct;
  requestAnimationFrame(() => {
    const meter = $('meter');
    meter.firstElementChild.style.width = `${levelPending}%`;
    meter.setAttribute('aria-valuenow', String(levelPending));
    levelPending = null;
  });
}

// ---------------------------------------------------------------------------
// Gateway -> page

function responseFor(id) {
  let r = responses.get(id);
  if (!r) {
    r = { itemId: null, rate: session?.output.rate || 24000, receivedSamples: 0, audio: false };
    responses.set(id, r);
    if (responses.size > 64) responses.delete(responses.keys().next().value);
  }
  return r;
}

const receivedMs = (r) => Math.floor((r.receivedSamples * 1000) / r.rate);

function onEvent(ev) {
  recentEvents.push({ type: ev.type, seq: ev.server_event_seq, t: Math.round(performance.now()) });
  if (recentEvents.length > 400) recentEvents.splice(0, 100);
  const handler = HANDLERS[ev.type];
  if (handler) handler(ev);
}

function onAudioDelta(ev) {
  const r = responseFor(ev.response_id);
  if (r.fenced || r.finished) return; // the caller already cut this reply off
  const samples = decode(base64ToBytes(ev.delta), session.output.format);
  if (samples.length === 0) return;
  r.itemId = ev.item_id || r.itemId || ev.response_id;
  r.rate = session.output.rate;
  r.receivedSamples += samples.length;
  r.audio = true;
  const target = jitter.arrival(ev.response_id, performance.now());
  if (target !== stats.jitterTargetMs) {
    stats.jitterTargetMs = target;
    audio.setTarget(target);
  }
  latency.firstAudio(ev.response_id, audio.now());
  audio.push(r.itemId, ev.response_id, samples);
}

function endAudio(ev) {
  const r = responses.get(ev.response_id);
  if (r && r.audio && !r.ended && !r.fenced) {
    r.ended = true;
    audio.end(r.itemId);
  }
}

function onResponseDone(ev) {
  const id = ev.response_id || ev.response?.id;
  const status = ev.response?.status;
  stats.responses += 1;
  if (activeResponseId === id) activeResponseId = null;
  const r = responses.get(id);
  if (status === 'cancelled') {
    stats.responsesCancelled += 1;
    latency.responseEnded(id);
    // Cancelled by someone else than us (another tab, the server): stop it here too.
    if (r && r.audio && !r.finished) void interruptPlayback('cancelled');
  } else if (r) {
    endAudio({ response_id: id });
    if (!r.audio) latency.responseEnded(id);
  }
  updateControls();
}

function onError(ev) {
  const e = ev.error || {};
  errors.push(e);
  console.warn(`gateway error ${e.code}: ${e.message}`);
  notice(`${e.code || 'error'}: ${e.message || ''}`);
  // Our session.update was refused: carry on with the session as it was.
  if (pendingUpdateId && e.event_id === pendingUpdateId) {
    pendingUpdateId = null;
    if (session && client.ready) applySession();
  }
}

function setSpeaking(on) {
  $('speaking').textContent = on ? 'speaking…' : '';
}

const transcriptDelta = (ev) => view.assistantDelta(ev.item_id, ev.delta || '');
const transcriptDone = (ev) => view.assistantDone(ev.item_id, ev.transcript ?? ev.text);

function onItem(ev) {
  const item = ev.item || {};
  if (!item.id) return;
  const part = (item.content || [])[0] || {};
  if (item.role === 'user') {
    view.ensure(item.id, 'user');
    if (part.type === 'input_text' && part.text) view.callerFinal(item.id, part.text);
    else if (part.transcript) view.callerFinal(item.id, part.transcript);
  } else if (item.role === 'assistant') {
    view.ensure(item.id, 'assistant');
  }
}

const HANDLERS = {
  'session.updated': (ev) => {
    pendingUpdateId = null;
    notice('');
    adoptSession(ev.session || {});
  },
  'input_audio_buffer.speech_started': (ev) => {
    setSpeaking(true);
    if (ev.item_id) {
      view.callerSpeaking(ev.item_id);
      // audio_start_ms reaches back prefix_padding_ms before the speech itself.
      const padding = session?.turnDetection?.prefix_padding_ms ?? 0;
      speechStartMs.set(ev.item_id, (ev.audio_start_ms ?? 0) + padding);
      if (speechStartMs.size > 100) speechStartMs.delete(speechStartMs.keys().next().value);
    }
    // The caller talks over the reply: stop it now, not when the server's cancel arrives.
    void interruptPlayback('speech_started');
  },
  'input_audio_buffer.speech_stopped': (ev) => {
    setSpeaking(false);
    const silence = session?.turnDetection?.silence_duration_ms ?? 0;
    const now = audio.now();
    const endMs = (ev.audio_end_ms ?? 0) - silence;
    if (ev.item_id) view.callerStopped(ev.item_id, endMs - (speechStartMs.get(ev.item_id) ?? endMs));
    const spokenEnd = captureClock.timeOf(endMs);
    latency.turnEnded(spokenEnd ?? now, now, 'vad');
  },
  'input_audio_buffer.committed': (ev) => {
    uncommittedMs = 0;
    // Push-to-talk turns have no speech_started/stopped: label the bubble with what was sent.
    if (committedMs !== null && ev.item_id) {
      view.ensure(ev.item_id, 'user');
      view.callerStopped(ev.item_id, committedMs, 'audio');
    }
    committedMs = null;
  },
  'conversation.item.added': onItem,
  'conversation.item.created': onItem,
  'conversation.item.input_audio_transcription.delta': (ev) => view.callerPartial(ev.item_id, ev.delta || ''),
  'conversation.item.input_audio_transcription.completed': (ev) => view.callerFinal(ev.item_id, ev.transcript),
  'conversation.item.input_audio_transcription.failed': (ev) => view.callerFinal(ev.item_id, ''),
  'conversation.item.truncated': (ev) => view.interrupted(ev.item_id, ev.audio_end_ms),
  'response.created': (ev) => {
    const id = ev.response_id || ev.response?.id;
    activeResponseId = id;
    responseFor(id);
    latency.responseCreated(id, audio.now());
    updateControls();
  },
  'response.output_item.added': (ev) => {
    if (ev.item?.id && ev.response_id) responseFor(ev.response_id).itemId = ev.item.id;
    onItem(ev);
  },
  'response.output_audio.delta': onAudioDelta,
  'response.audio.delta': onAudioDelta,
  'response.output_audio.done': endAudio,
  'response.audio.done': endAudio,
  'response.output_audio_transcript.delta': transcriptDelta,
  'response.audio_transcript.delta': transcriptDelta,
  'response.output_text.delta': transcriptDelta,
  'response.text.delta': transcriptDelta,
  'response.output_audio_transcript.done': transcriptDone,
  'response.audio_transcript.done': transcriptDone,
  'response.output_text.done': transcriptDone,
  'response.text.done': transcriptDone,
  'response.done': onResponseDone,
  'session.closed': (ev) => notice(`session closed: ${ev.reason || ''}`),
  error: onError,
};

// ---------------------------------------------------------------------------
// Playback reports and barge-in

function onPlayback(msg) {
  switch (msg.type) {
    case 'progress':
      stats.samplesPlayed = msg.samplesPlayed;
      stats.playbackRate = msg.sampleRate;
      stats.bufferedMs = Math.round(msg.bufferedMs);
      break;
    case 'started': {
      latency.playbackStarted(msg.responseId, msg.time);
      break;
    }
    case 'drained': {
      // The reply played to its end: tell the gateway what the caller heard.
      const r = responses.get(msg.responseId);
      if (!r || r.finished) break;
      r.finished = true;
      const played = Math.min(Math.floor((msg.playedSamples * 1000) / msg.sampleRate), receivedMs(r));
      if (client.send({ type: 'playback.ack', response_id: msg.responseId, item_id: msg.itemId, played_ms: played })) {
        stats.acksSent += 1;
      }
      break;
    }
    case 'underrun':
      stats.underruns = msg.underruns;
      break;
    default:
      break;
  }
}

/**
 * Stop reply audio now and report, per interrupted item, how much was heard.
 * Returns true if anything was cut.
 */
async function interruptPlayback(reason) {
  const live = [...responses.entries()].filter(([, r]) => r.audio && !r.finished);
  // Anything the gateway still sends for the current reply is stale from here on.
  if (activeResponseId) responseFor(activeResponseId).fenced = true;
  for (const [, r] of live) r.fenced = true;
  if (live.length === 0) return false;
  const result = await audio.flush(reason);
  let cut = false;
  for (const item of result.items) {
    const r = responses.get(item.responseId);
    if (!r || r.finished) continue;
    r.finished = true;
    const played = Math.floor((item.playedSamples * 1000) / result.sampleRate);
    // Never claim more than arrived (the gateway rejects truncates past its audio).
    const audioEndMs = Math.min(played, receivedMs(r));
    if (client.send({ type: 'conversation.item.truncate', item_id: item.itemId, content_index: 0, audio_end_ms: audioEndMs })) {
      stats.truncatesSent += 1;
    }
    view.interrupted(item.itemId, audioEndMs);
    cut = true;
  }
  for (const [, r] of live) r.finished = true;
  if (cut) stats.flushes += 1;
  return cut;
}

// ---------------------------------------------------------------------------
// Connection state and controls

const STATE_TEXT = {
  idle: () => 'Disconnected',
  connecting: () => 'Connecting…',
  resuming: () => 'Resuming session…',
  connected: (d) => (d.resumed ? 'Connected · resumed' : 'Connected'),
  reconnecting: (d) =>
    `Reconnecting in ${(d.delayMs / 1000).toFixed(1)} s (attempt ${d.attempt})${d.resume ? '' : ' · new session'}`,
  closed: (d) => `Closed: ${d.reason || d.code}`,
  failed: (d) => `Failed: ${d.reason}`,
};

function onState(state, detail) {
  stats.state = state;
  stats.reconnects = client.reconnects;
  $('conn').dataset.state = state;
  $('conn-text').textContent = STATE_TEXT[state](detail || {});
  if (state !== 'connected') streaming = false;
  if (state === 'reconnecting' && detail.code !== undefined) {
    notice(`Connection lost (code ${detail.code}); reconnecting…`);
  }
  if (state === 'connected') notice('');
  if (state === 'closed' || state === 'failed') {
    notice(STATE_TEXT[state](detail || {}));
    void stopAudio();
  }
  updateControls();
}

function updateControls() {
  const live = client.state !== 'idle' && client.state !== 'closed' && client.state !== 'failed';
  const ready = client.ready && streaming;
  const button = $('connect');
  button.textContent = live ? 'Disconnect' : 'Connect';
  button.classList.toggle('connected', live);
  $('mute').disabled = !ready;
  $('barge').disabled = !ready;
  $('commit').disabled = !ready;
  $('respond').disabled = !ready;
}

function notice(text) {
  const el = $('notice');
  el.textContent = text;
  el.hidden = !text;
}

async function refreshDevices() {
  const select = $('device');
  const current = select.value || audio.currentDeviceId();
  const mics = await listMicrophones();
  select.replaceChildren(
    Object.assign(document.createElement('option'), { value: '', textContent: 'Default microphone' }),
    ...mics
      .filter((d) => d.deviceId && d.deviceId !== 'default')
      .map((d, i) =>
        Object.assign(document.createElement('option'), {
          value: d.deviceId,
          textContent: d.label || `Microphone ${i + 1}`,
        }),
      ),
  );
  if ([...select.options].some((o) => o.value === current)) select.value = current;
}

async function stopAudio() {
  streaming = false;
  await audio.stop();
  showLevel(0);
  setSpeaking(false);
}

async function toggleConnection() {
  if (client.state !== 'idle' && client.state !== 'closed' && client.state !== 'failed') {
    client.disconnect();
    await stopAudio();
    return;
  }
  saveSettings();
  notice('');
  const s = readSettings();
  try {
    // Started inside the click handler: browsers only let a user gesture start audio.
    await audio.start({
      deviceId: s.device,
      input: { format: s.inFormat, rate: s.inRate, frameMs: s.frameMs },
      output: { rate: s.outRate },
      targetMs: jitter.targetMs,
    });
  } catch (err) {
    notice(`Microphone unavailable: ${err.message}`);
    await stopAudio();
    return;
  }
  void refreshDevices();
  client.connect();
}

function commitTurn() {
  if (client.send({ type: 'input_audio_buffer.commit' })) {
    committedMs = uncommittedMs;
    uncommittedMs = 0;
  }
}

function requestResponse() {
  // "Respond" after talking without pressing Commit: commit the turn first.
  if (uncommittedMs > 100) commitTurn();
  const now = audio.now();
  // With push-to-talk the turn is over when the caller asks for the reply.
  latency.turnEnded(now, now, 'commit');
  client.send({ type: 'response.create' });
}

function bargeIn() {
  // barge_in fences the reply at the gateway; the truncate says what was heard.
  client.send({ type: 'barge_in' });
  void interruptPlayback('user');
}

function renderStats() {
  const rate = stats.playbackRate || 48000;
  $('st-played').textContent = `${(stats.samplesPlayed / rate).toFixed(1)} s`;
  $('st-target').textContent = `${stats.jitterTargetMs} ms`;
  $('st-buffered').textContent = audio.running ? `${stats.bufferedMs} ms` : '—';
  $('st-underruns').textContent = String(stats.underruns);
  $('st-flushes').textContent = String(stats.flushes);
  $('st-responses').textContent = String(stats.responses);
}

// ---------------------------------------------------------------------------
// Wiring

initSettingsForm();
$('connect').addEventListener('click', () => void toggleConnection());
$('mute').addEventListener('click', () => {
  muted = !muted;
  $('mute').setAttribute('aria-pressed', String(muted));
  $('mute').textContent = muted ? 'Unmute mic' : 'Mute mic';
});
$('barge').addEventListener('click', bargeIn);
$('commit').addEventListener('click', commitTurn);
$('respond').addEventListener('click', requestResponse);
$('turn').addEventListener('change', () => form.classList.toggle('no-vad', $('turn').value === 'none'));
$('device').addEventListener('change', async () => {
  try {
    await audio.setDevice($('device').value);
  } catch (err) {
    notice(`Could not switch microphone: ${err.message}`);
  }
});
form.addEventListener('submit', (event) => {
  event.preventDefault();
  saveSettings();
  if (client.ready) sendSessionUpdate();
});
navigator.mediaDevices?.addEventListener?.('devicechange', () => void refreshDevices());
setInterval(renderStats, 250);
updateControls();
