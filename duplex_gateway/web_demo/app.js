// The voice-chat page: wires the microphone, the Realtime connection, playback
// and the UI together. It uses only the public protocol described in the
// README, so it doubles as a reference client: nothing here assumes a
// particular engine (partial transcripts, text-only replies and missing
// events all degrade gracefully).

import { AudioIO, listMicrophones, listSpeakers } from './lib/audio.js';
import { FORMATS, base64ToBytes, bytesToBase64, decode, encode, formatName } from './lib/codecs.js';
import { ConversationView } from './lib/conversation.js';
import { JitterEstimator } from './lib/jitter.js';
import { CaptureClock, LatencyTracker } from './lib/latency.js';
import { RealtimeClient } from './lib/realtime-client.js';
import { renderLatency } from './lib/timeline.js';
import { DEMO_TOOL, runTool } from './lib/tools.js';
import { WebRTCClient, webrtcSupported } from './lib/webrtc-client.js';

const $ = (id) => document.getElementById(id);

// ---------------------------------------------------------------------------
// Settings (persisted locally; the API key only for this browser tab)

const STORAGE_KEY = 'duplex-gateway-demo';
const IN_RATES = [8000, 16000, 24000, 48000];
const OUT_RATES = [8000, 16000, 22050, 24000, 44100, 48000];
const EAGERNESS = ['auto', 'low', 'medium', 'high'];
/** WebRTC (Opus on media tracks, events on a data channel) unless asked otherwise or not offered. */
const TRANSPORTS = ['webrtc', 'websocket'];
const TRANSPORT_NAMES = { webrtc: 'WebRTC', websocket: 'WebSocket' };
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
  if (saved.voice) fillVoices([saved.voice], saved.voice);
  for (const [name, value] of Object.entries(saved)) {
    const field = form.elements.namedItem(name);
    if (!field || name === 'apiKey' || name === 'device' || name === 'speaker') continue;
    if (field.type === 'checkbox') field.checked = value === true;
    else field.value = value;
  }
  $('api-key').value = sessionStorage.getItem(`${STORAGE_KEY}:key`) || '';
  // A link may name the transport (?transport=websocket); it wins over what was saved.
  const asked = new URLSearchParams(location.search).get('transport');
  if (TRANSPORTS.includes(asked)) $('transport').value = asked;
  if (!TRANSPORTS.includes($('transport').value)) $('transport').value = 'webrtc';
  if (!webrtcSupported()) {
    $('transport').value = 'websocket';
    $('transport').querySelector('option[value="webrtc"]').disabled = true;
  }
  for (const dir of ['in', 'out']) fitRateToFormat(dir);
  syncVadFields();
  syncTransportFields();
}

/**
 * Over WebRTC the audio is Opus on the call's tracks, its rate the browser's and the gateway's to
 * agree: the wire format fields are the WebSocket's alone.
 */
function syncTransportFields() {
  const rtc = $('transport').value === 'webrtc';
  for (const id of ['in-format', 'in-rate', 'out-format', 'out-rate', 'frame-ms']) $(id).disabled = rtc;
  form.classList.toggle('webrtc', rtc);
  $('format-note').hidden = !rtc;
}

const isG711 = (name) => name === 'g711_ulaw' || name === 'g711_alaw';

/** G.711 is narrowband: choosing it switches its rate to 8 kHz (and back to 24 kHz when leaving it). */
function fitRateToFormat(dir, changed = false) {
  const g711 = isG711($(`${dir}-format`).value);
  const rate = $(`${dir}-rate`);
  for (const opt of rate.options) opt.disabled = g711 && opt.value !== '8000';
  if (g711) rate.value = '8000';
  else if (changed && rate.value === '8000') rate.value = '24000';
}

/**
 * Push-to-talk has no VAD: its fields are disabled, not just greyed. The threshold and the
 * end-of-turn silence are server VAD's (semantic VAD ends a turn by its model); eagerness is
 * semantic VAD's alone, so each shows only with its own mode.
 */
function syncVadFields() {
  const turn = $('turn').value;
  const ptt = turn === 'none';
  const semantic = turn === 'semantic_vad';
  form.classList.toggle('no-vad', ptt);
  for (const id of ['threshold', 'silence']) {
    $(id).disabled = ptt || semantic;
    $(`${id}-field`).hidden = semantic;
  }
  $('eagerness').disabled = !semantic;
  $('eagerness-field').hidden = !semantic;
}

/** The Voice picker offers what the engine announced (session.capabilities.voices). */
function fillVoices(voices, preferred) {
  const select = $('voice');
  const current = preferred ?? select.value;
  const list = voices.length ? voices : ['default'];
  fillSelect(select, list.map((v) => [v, v]), list.includes(current) ? current : list[0]);
}

function readSettings() {
  const num = (id, fallback) => {
    const v = Number($(id).value);
    return Number.isFinite(v) && v > 0 ? v : fallback;
  };
  return {
    transport: TRANSPORTS.includes($('transport').value) ? $('transport').value : 'webrtc',
    url: $('url').value.trim() || '/v1/realtime',
    apiKey: $('api-key').value,
    device: $('device').value,
    voice: $('voice').value || 'default',
    turn: $('turn').value,
    eagerness: EAGERNESS.includes($('eagerness').value) ? $('eagerness').value : 'auto',
    threshold: Math.min(0.95, Math.max(0.05, num('threshold', 0.5))),
    silence: Math.round(num('silence', 500)),
    inFormat: $('in-format').value,
    inRate: num('in-rate', 24000),
    outFormat: $('out-format').value,
    outRate: num('out-rate', 24000),
    frameMs: num('frame-ms', 20),
    instructions: $('instructions').value.trim(),
    demoTool: $('demo-tool').checked,
  };
}

function saveSettings() {
  const { apiKey, device, speaker, ...rest } = readSettings();
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
  holds: 0, // replies the gateway paused to judge the caller's speech over them (overlap.decision)
  holdsResumed: 0, // ... and let go on (a backchannel)
  retryInS: null, // seconds left before the next automatic retry (the countdown shown)
  assistantState: 'idle', // idle | listening | thinking | speaking | paused
  assistantLevel: 0, // the assistant meter, 0-100
  heardMs: 0, // how long reply audio came out of the page (the assistant meter above zero)
  transport: null, // of the connection in use: 'webrtc' | 'websocket'
  rtc: null, // a WebRTC call's own statistics: packets, loss, jitter buffer, round trip
};
const errors = [];
const recentEvents = [];
const assistantStates = [];
const announcements = [];

// ---------------------------------------------------------------------------
// What the running engine does (session.capabilities.engine), in one line

const ABILITIES = {
  embedded:
    'The built-in demo engine: it repeats what you said (“You said: …”) and answers questions about the time and the date; say “help” for more. It is not a chatbot.',
  echo: 'The echo engine: it plays each of your turns back to you, to try out your microphone, playback and barge-in. It does not understand words; a typed message gets your last spoken turn back.',
  'vllm-omni': 'A speech model served by vLLM-Omni: talk to it as to an assistant, it answers in speech with a transcript.',
  'vllm-omni-stream': 'A speech model served by vLLM-Omni, streaming: talk to it as to an assistant, it answers in speech with a transcript.',
  remote: 'A speech model on a pool of vLLM-Omni servers: talk to it as to an assistant, it answers in speech with a transcript.',
};

function abilitiesText(engine, functionCalling = false) {
  if (!engine) return '';
  const what = ABILITIES[engine] || `The “${engine}” engine answers each of your turns in speech.`;
  // The engine says so in session.created (capabilities.function_calling).
  const tools = functionCalling
    ? ' It can call functions the page offers (function calling): turn on Settings › Demo tool and ask what time it is in a city.'
    : '';
  return `What the assistant does: ${what}${tools}`;
}

// ---------------------------------------------------------------------------
// The event log: every event sent and received, audio payloads left out

const LOG_MAX = 500;
const AUDIO_EVENTS = new Set(['input_audio_buffer.append', 'response.output_audio.delta', 'response.audio.delta']);
/** {t, dir: 'in'|'out', type, count, audioBytes, body} — runs of one audio event share an entry. */
const eventLog = [];
let connectedAt = null; // performance.now() of the last Connect
let logDirty = false;

function elided(ev) {
  const json = JSON.stringify(ev, (key, value) => {
    if (typeof value === 'string' && (key === 'audio' || (key === 'delta' && AUDIO_EVENTS.has(ev.type)))) {
      return `<${Math.floor((value.length * 3) / 4)} bytes of audio>`;
    }
    return value;
  });
  return client.redact(json.length > 400 ? `${json.slice(0, 400)}…` : json);
}

function logEvent(dir, ev) {
  const t = connectedAt === null ? 0 : (performance.now() - connectedAt) / 1000;
  const type = String(ev?.type ?? '?');
  const audioBytes = AUDIO_EVENTS.has(type) ? Math.floor(String(ev.audio ?? ev.delta ?? '').length * 0.75) : 0;
  const last = eventLog[eventLog.length - 1];
  logDirty = true;
  if (audioBytes && last && last.type === type && last.dir === dir) {
    last.count += 1;
    last.audioBytes += audioBytes;
    return;
  }
  eventLog.push({ t, dir, type, count: 1, audioBytes, body: audioBytes ? '' : elided(ev) });
  if (eventLog.length > LOG_MAX) eventLog.splice(0, eventLog.length - LOG_MAX);
}

function renderLog() {
  if (!logDirty || !$('log-panel').open) return;
  logDirty = false;
  const list = $('log');
  const filter = $('log-filter').value.trim().toLowerCase();
  const shown = filter ? eventLog.filter((e) => e.type.toLowerCase().includes(filter)) : eventLog;
  const atBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 40;
  list.replaceChildren(
    ...shown.map((e) => {
      const li = document.createElement('li');
      li.className = `dir-${e.dir}`;
      li.dataset.type = e.type;
      const t = document.createElement('span');
      t.className = 't';
      t.textContent = `${e.t.toFixed(3)}`;
      const d = document.createElement('span');
      d.className = 'd';
      d.textContent = e.dir === 'out' ? '↑' : '↓';
      d.title = e.dir === 'out' ? 'sent' : 'received';
      const type = document.createElement('span');
      type.className = 'type';
      type.textContent = e.count > 1 ? `${e.type} ×${e.count}` : e.type;
      li.append(t, d, type);
      const text = e.audioBytes ? `${e.audioBytes} bytes of audio` : e.body;
      if (text) {
        const body = document.createElement('span');
        body.className = 'body';
        body.textContent = text;
        li.append(body);
      }
      return li;
    }),
  );
  $('log-count').textContent = filter ? `${shown.length} of ${eventLog.length}` : `${eventLog.length}`;
  if (atBottom) list.scrollTop = list.scrollHeight;
}

/** Per-session counters start from zero with every new session (not on resume). */
const PER_SESSION = {
  samplesPlayed: 0, bufferedMs: 0, underruns: 0, flushes: 0, truncatesSent: 0, acksSent: 0,
  responses: 0, responsesCancelled: 0, turns: 0, lastLatencyMs: null, medianLatencyMs: null,
  framesSent: 0, audioMsSent: 0, heartbeatsSent: 0, silentFramesSent: 0, toolCalls: 0, toolOutputsSent: 0,
  holds: 0, holdsResumed: 0, heardMs: 0, rtc: null,
};
Object.assign(stats, PER_SESSION);
// The playback worklet counts from its own start; these are its counts at the last reset.
const playbackBase = { samplesPlayed: 0, underruns: 0 };
let playbackLast = { samplesPlayed: 0, underruns: 0 };

let session = null; // what the gateway says the session is (see readSession)
let streaming = false; // mic frames go to the gateway (off while a session.update is in flight)
let muted = false;
let talking = false; // push-to-talk: the Talk button is pressed (the mic goes out only then)
let lastSentAt = 0; // performance.now() of the last audio frame sent (for the heartbeat)
let sessionsSeen = 0;
let appliedConnection = null; // {url, apiKey} the current connection was opened with
let uncommittedMs = 0; // audio sent since the last commit (push-to-talk)
let committedMs = null; // audio in the turn our last commit ended
let updateCount = 0;
let pendingUpdateId = null; // event_id of the session.update awaiting its answer
let activeResponseId = null;
const speechStartMs = new Map(); // caller item -> audio_start_ms (for the bubble's duration)
/**
 * responseId -> {itemId, rate, receivedSamples, audio, fenced, ended, finished, started, drained, done,
 * paused, ...}: started/drained come from the playback worklet (its first sample reached the output /
 * its last one did), done from response.done, fenced when the caller cut it off, paused while the
 * gateway holds it (overlap.decision). `playedMs` is what the worklet reported it played to the end,
 * `decisions` the gateway's overlap actions, `worklet` the worklet's paused / resumed reports.
 */
const responses = new Map();

const view = new ConversationView($('transcript'), $('empty-hint'));
const captureClock = new CaptureClock();
const jitter = new JitterEstimator();
const latency = new LatencyTracker((turn) => {
  stats.turns = latency.turns.length;
  stats.lastLatencyMs = turn.totalMs;
  stats.medianLatencyMs = latency.median();
  renderLatencyPanel();
});

function renderLatencyPanel() {
  renderLatency(
    { value: $('latency-value'), median: $('latency-median'), timeline: $('timeline'), note: $('stages-note') },
    latency.turns,
  );
}

const audio = new AudioIO({ onFrame, onPlayback, onMic: (track) => clients.webrtc.replaceMic(track) });
const connection = {
  url: () => readSettings().url,
  apiKey: () => readSettings().apiKey,
  onEvent,
  onState,
  onSession,
};
/** One client per transport; `client` is the one Connect last used (chosen again at every Connect). */
const clients = {
  websocket: new RealtimeClient(connection),
  webrtc: new WebRTCClient({
    ...connection,
    micTrack: () => audio.micTrack(),
    onTrack: (stream) => audio.playRemote(stream),
    onStats: onCallStats,
  }),
};
// Set again once the settings form is filled (the transport saved, or asked for in the address).
let client = clients.webrtc;
const overWebRTC = () => client === clients.webrtc;

// Every event the page sends goes through client.send: the event log sees them all.
for (const c of Object.values(clients)) {
  const sendEvent = c.send.bind(c);
  c.send = (event, ws) => {
    const ok = sendEvent(event, ws);
    if (ok) logEvent('out', event);
    return ok;
  };
}

window.__demo = {
  stats,
  /** The connection's transport, as the page shows it. */
  get transport() {
    return client.transport ?? 'websocket';
  },
  errors,
  events: recentEvents,
  log: eventLog,
  get sent() {
    return client.sent;
  },
  transcript: () => view.snapshot(),
  turns: () =>
    latency.turns.map(({ id, totalMs, parts, how, responseId, server }) => ({
      id, totalMs, parts, how, responseId, server: server ?? null,
    })),
  /** Every change of the assistant's state: {state, t} (t: performance.now()). */
  assistantStates,
  /** What the screen-reader status line said about the assistant, in order. */
  announcements,
  /** Each reply's audio as received and played, its status and its pauses (read-only copies). */
  replies: () =>
    [...responses.entries()].map(([responseId, r]) => ({
      responseId,
      itemId: r.itemId,
      receivedMs: (r.receivedSamples * 1000) / r.rate,
      playedMs: r.playedMs ?? null,
      status: r.status ?? null,
      paused: Boolean(r.paused),
      decisions: (r.decisions ?? []).map((d) => ({ ...d })),
      worklet: (r.worklet ?? []).map((w) => ({ ...w })),
    })),
  /** The client of the connection in use (WebSocket or WebRTC). */
  get client() {
    return client;
  },
  audio,
  get muted() {
    return muted;
  },
  get talking() {
    return talking;
  },
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
    // What the gateway runs: a gateway without semantic VAD may answer a request for it with server VAD.
    turnDetection: ain ? ain.turn_detection ?? null : s.turn_detection ?? null,
    voice: aout?.voice ?? s.voice,
    voices: s.capabilities?.voices || previous?.voices || [],
    engine: s.capabilities?.engine || previous?.engine,
    functionCalling: s.capabilities?.function_calling ?? previous?.functionCalling ?? false,
  };
}

function sendSessionUpdate() {
  const s = readSettings();
  const semantic = s.turn === 'semantic_vad';
  let turnDetection = null;
  if (semantic) {
    turnDetection = { type: 'semantic_vad', eagerness: s.eagerness, create_response: true, interrupt_response: true };
  } else if (s.turn !== 'none') {
    turnDetection = {
      type: 'server_vad',
      threshold: s.threshold,
      silence_duration_ms: s.silence,
      create_response: true,
      interrupt_response: true,
    };
  }
  // Frames already captured in the old format must not reach the gateway after
  // it switched: hold the mic until session.updated confirms the new format.
  streaming = false;
  updateCount += 1;
  pendingUpdateId = `evt_update_${updateCount}`;
  // Instructions go out once set, and again (empty) when they are cleared.
  const instructions = s.instructions || instructionsSent ? { instructions: s.instructions } : {};
  instructionsSent = Boolean(s.instructions);
  // The demo tool goes out while it is on; once it has been offered, every update says
  // `tools: []` while it is off (an update that was refused must not leave it offered).
  const tools = s.demoTool ? { tools: [DEMO_TOOL], tool_choice: 'auto' } : toolsOffered ? { tools: [] } : {};
  toolsOffered = toolsOffered || s.demoTool;
  // Every update replaces the session's `include`, so each one (Settings › Apply too) asks again.
  // The gateway holds a reply for the caller's speech over it under semantic VAD: ask to be told,
  // so playback pauses at the hold rather than playing on until the verdict.
  const include = askLatency ? { include: semantic ? [LATENCY_EVENT, OVERLAP_EVENT] : [LATENCY_EVENT] } : {};
  // A call's audio formats are its tracks': only a WebSocket session is told which to use.
  const wire = (format, rate) => (overWebRTC() ? {} : { format: { type: FORMATS[format].ga, rate } });
  client.send({
    type: 'session.update',
    event_id: pendingUpdateId,
    session: {
      type: 'realtime',
      ...instructions,
      ...tools,
      ...include,
      audio: {
        input: {
          ...wire(s.inFormat, s.inRate),
          turn_detection: turnDetection,
          transcription: { model: 'whisper-1' },
        },
        output: {
          ...wire(s.outFormat, s.outRate),
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

let pttMode = false; // the live session has no turn detection (push-to-talk)
/** The gateway's per-reply latency breakdown, a gateway extension asked for with session.include. */
const LATENCY_EVENT = 'turn.latency';
/** The gateway's hold / resume / cut of a reply the caller spoke over (vLLM-Omni's event). */
const OVERLAP_EVENT = 'overlap.decision';
let askLatency = true; // off once a gateway refused the include (another Realtime server)
let instructionsSent = false; // this session was given instructions
let toolsOffered = false; // this session was offered the demo tool

/** Point capture, playback and the UI at `session`, and let the mic stream. */
function applySession() {
  audio.configureCapture({ ...session.input, frameMs: readSettings().frameMs });
  audio.setOutputRate(session.output.rate);
  if (session.voices.length) fillVoices(session.voices, session.voice);
  const td = session.turnDetection;
  const ptt = td === null;
  if (ptt !== pttMode) {
    // The mode changed under a turn in progress: nothing will end it now.
    pttMode = ptt;
    setTalking(false);
    setSpeaking(false);
    view.settlePartials();
  }
  $('ptt').hidden = !ptt;
  $('ptt-hint').hidden = !ptt;
  const abilities = abilitiesText(session.engine, session.functionCalling);
  $('abilities').textContent = abilities;
  $('abilities').hidden = !abilities;
  const fmt = (f) => `${f.format} ${f.rate / 1000} kHz`;
  $('session-info').textContent = [
    session.engine && `engine ${session.engine}`,
    ...(overWebRTC() ? ['Opus on WebRTC tracks'] : [`in ${fmt(session.input)}`, `out ${fmt(session.output)}`]),
    ptt ? 'push-to-talk' : td.type === 'semantic_vad' ? `semantic VAD (${td.eagerness ?? 'auto'})` : `VAD ${td.silence_duration_ms ?? ''} ms`,
  ]
    .filter(Boolean)
    .join(' · ');
  streaming = true;
  syncMicTrack();
  updateControls();
}

function onSession({ resumed, event }) {
  stats.sessionId = client.sessionId;
  if (resumed) {
    stats.resumes = client.resumes;
    // A hold's verdict sent while the connection was down is lost: never stay paused waiting for it.
    for (const [id, r] of responses) if (r.paused) unpause(id, r);
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
  resetCounters();
  speechStartMs.clear();
  uncommittedMs = 0;
  committedMs = null;
  setSpeaking(false);
  view.settlePartials();
  session = readSession(event.session || {});
  instructionsSent = false;
  toolsOffered = false;
  resetToolCalls();
  // Offer the engine's voices before asking for one of them.
  if (session.voices.length) fillVoices(session.voices);
  sendSessionUpdate();
  updateAssistantState();
}

/** Every per-session counter and the latency panel back to zero (a new session). */
function resetCounters() {
  Object.assign(stats, PER_SESSION);
  Object.assign(playbackBase, playbackLast);
  latency.reset();
  latency.turns.length = 0;
  latency.count = 0;
  renderLatencyPanel();
  renderStats();
}

// ---------------------------------------------------------------------------
// Microphone -> gateway

function onFrame(frame) {
  // Muted, or push-to-talk without Talk pressed: the meter shows nothing goes out.
  const silent = muted || (pttMode && !talking);
  showLevel(silent ? 0 : frame.rms);
  // A call sends the microphone's own track (syncMicTrack): the frames only feed the meter.
  if (overWebRTC()) return;
  if (!streaming || !client.ready || !session) return;
  // A frame cut before a reconfiguration reached the worklet: drop it.
  if (frame.rate !== session.input.rate || frame.format !== session.input.format) return;
  // Push-to-talk streams only while talking (the heartbeat keeps the session alive).
  if (pttMode && !talking) return;
  let bytes = frame.bytes;
  if (muted) {
    // Silence, not nothing: the gateway's VAD ends a turn cut by the mute, and
    // the session sees activity (no idle timeout) for as long as it stays muted.
    bytes = encode(new Float32Array(frame.samples), frame.format);
    stats.silentFramesSent += 1;
  }
  client.send({ type: 'input_audio_buffer.append', audio: bytesToBase64(bytes) });
  lastSentAt = performance.now();
  const ms = (frame.samples * 1000) / frame.rate;
  captureClock.sent(ms, frame.endTime);
  uncommittedMs += ms;
  stats.framesSent += 1;
  stats.audioMsSent += ms;
}

/**
 * A call's microphone track carries the caller only while the page would stream: muted, or
 * push-to-talk without Talk pressed, it sends silence (a disabled track), as the WebSocket path
 * sends silent frames.
 */
function syncMicTrack() {
  const track = audio.micTrack();
  if (!track || !overWebRTC()) return;
  track.enabled = !muted && !(pttMode && !talking);
}

/** A WebRTC call's statistics (every second): what went out and what the browser buffers. */
function onCallStats(rtc) {
  stats.rtc = rtc;
  // Browsers send Opus in 20 ms packets.
  stats.framesSent = rtc.packetsSent;
  stats.audioMsSent = rtc.packetsSent * 20;
  if (rtc.jitterBufferMs !== null) stats.jitterTargetMs = rtc.jitterBufferMs;
}

/** dBFS mapped to 0-100 over a 60 dB range: speech sits in the upper half. */
function levelPercent(rms) {
  const db = 20 * Math.log10(Math.max(rms, 1e-6));
  return Math.round(Math.min(100, Math.max(0, ((db + 60) / 60) * 100)));
}

let levelPending = null;
function showLevel(rms) {
  const pct = levelPercent(rms);
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
// What the assistant is doing, and the level of its voice

const ASSISTANT_TEXT = {
  idle: 'not connected',
  listening: 'listening',
  thinking: 'thinking…',
  speaking: 'speaking',
  paused: 'paused, listening',
};
// A state is read out only once it has held this long: a quick reply goes from thinking to
// speaking in a blink, and the screen reader should say where things settled, not each step.
const ANNOUNCE_AFTER_MS = 700;
let assistantState = 'idle';
let announced = 'listening';
let announceTimer = null;

/**
 * From the replies' own progress, not from audio arriving: speaking is the page's playback
 * (first sample out until the last one played or the reply was cut off).
 */
function currentAssistantState() {
  if (!client.ready || !session) return 'idle';
  let thinking = false;
  for (const r of responses.values()) {
    if (r.fenced) continue; // cut off: nothing of it plays any more
    // Held by the gateway while it judges the caller's speech over it: it may go on.
    if (r.paused) return 'paused';
    // Played out but not yet done: more of the reply may still come, it has the floor.
    if ((r.started && !r.drained) || (r.drained && !r.done)) return 'speaking';
    // Asked for and still running, or its audio waits in the jitter buffer.
    if (!r.done || (r.audio && !r.started)) thinking = true;
  }
  return thinking ? 'thinking' : 'listening';
}

function updateAssistantState() {
  const state = currentAssistantState();
  stats.assistantState = state;
  if (state === assistantState) return;
  assistantState = state;
  assistantStates.push({ state, t: Math.round(performance.now()) });
  if (assistantStates.length > 400) assistantStates.splice(0, 100);
  const el = $('assistant-state');
  el.dataset.state = state;
  el.textContent = ASSISTANT_TEXT[state];
  clearTimeout(announceTimer);
  if (state === 'idle') {
    // The connection line speaks for connecting; the first "listening" needs no words of its own.
    announced = 'listening';
    $('assistant-announce').textContent = '';
    return;
  }
  announceTimer = setTimeout(() => {
    if (state === announced) return;
    announced = state;
    const text = `Assistant is ${ASSISTANT_TEXT[state].replace('…', '')}`;
    $('assistant-announce').textContent = text;
    announcements.push(text);
  }, ANNOUNCE_AFTER_MS);
}

let outLevelShown = -1;
let outMeterRunning = false;

let meterAt = null; // the last frame's time, to count how long reply audio came out (heardMs)

/** The assistant meter follows the played audio once per frame while the audio graph runs. */
function outputMeter(at) {
  const pct = audio.running ? levelPercent(audio.outputLevel()) : 0;
  stats.assistantLevel = pct;
  if (pct > 0 && meterAt !== null) stats.heardMs += Math.min(100, at - meterAt);
  meterAt = audio.running ? at : null;
  if (pct !== outLevelShown) {
    outLevelShown = pct;
    const meter = $('out-meter');
    meter.firstElementChild.style.width = `${pct}%`;
    meter.setAttribute('aria-valuenow', String(pct));
  }
  if (audio.running) requestAnimationFrame(outputMeter);
  else outMeterRunning = false;
}

function startOutputMeter() {
  if (outMeterRunning) return;
  outMeterRunning = true;
  requestAnimationFrame(outputMeter);
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
  logEvent('in', ev);
  recentEvents.push({ type: ev.type, seq: ev.server_event_seq, t: Math.round(performance.now()) });
  if (recentEvents.length > 400) recentEvents.splice(0, 100);
  const handler = HANDLERS[ev.type];
  if (handler) handler(ev);
  updateAssistantState();
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
  if (r && r.audio && !r.ended && !r.fenced && !overWebRTC()) {
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
  if (r) {
    r.done = true;
    r.status = status ?? null;
    // The gateway ends a hold before the reply ends; should it not have, nothing is left waiting.
    if (r.paused) unpause(id, r);
  }
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
  if (askLatency && pendingUpdateId && e.event_id === pendingUpdateId && /(^|\.)include\b/.test(e.param || '')) {
    // A Realtime server that does not offer the breakdown: the rest of the update still matters.
    console.info(client.redact(`the gateway does not offer ${LATENCY_EVENT} (${e.message}); updating without it`));
    // Handled here: a later close must not be explained with this refusal.
    client.lastError = null;
    askLatency = false;
    sendSessionUpdate();
    return;
  }
  errors.push(e);
  console.warn(client.redact(`gateway error ${e.code}: ${e.message}`));
  notice(`The gateway reported an error: ${quoteServer(e.message || e.code || 'error')} (${e.code || 'error'}).`);
  // Our session.update was refused: carry on with the session as it was.
  if (pendingUpdateId && e.event_id === pendingUpdateId) {
    pendingUpdateId = null;
    if (applyPending) {
      applyPending = false;
      settingsStatus(`Saved, but the gateway refused to apply it: ${quoteServer(e.message || e.code || 'error')}.`, 'error');
    }
    if (session && client.ready) applySession();
  }
}

function setSpeaking(on) {
  $('speaking').textContent = on && !muted && !(pttMode && !talking) ? 'speaking…' : '';
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
  } else if (item.type === 'function_call') {
    view.toolCall(item.id, { name: item.name, callId: item.call_id, args: item.arguments });
  }
}

// ---------------------------------------------------------------------------
// Function calls: the model calls, the page runs the function and answers

/** responseId -> [{itemId, callId, name, args}]: complete calls waiting for their reply's end. */
const pendingCalls = new Map();
const answeredCalls = new Set(); // call_ids the page sent an output for
let followUpWanted = false; // outputs were sent while another reply ran: ask for the reply after it

function resetToolCalls() {
  pendingCalls.clear();
  answeredCalls.clear();
  followUpWanted = false;
}

/** A call whose arguments are complete: it is run once its reply is over. */
function callComplete(responseId, { itemId, callId, name, args }) {
  if (!callId || answeredCalls.has(callId)) return;
  view.toolArgsDone(itemId, { name, callId, args });
  const calls = pendingCalls.get(responseId) ?? [];
  const known = calls.find((c) => c.callId === callId);
  if (known) Object.assign(known, { name: name || known.name, args: args ?? known.args });
  else {
    calls.push({ itemId, callId, name, args: args ?? '' });
    stats.toolCalls += 1;
  }
  pendingCalls.set(responseId, calls);
  if (pendingCalls.size > 16) pendingCalls.delete(pendingCalls.keys().next().value);
}

/**
 * The calls a finished reply leaves to answer. response.done's output names them too
 * (a server may send no per-call events). A reply that did not complete (cut off by
 * the caller, failed) leaves none: the caller has moved on.
 */
function callsToAnswer(ev, id) {
  const calls = pendingCalls.get(id) ?? [];
  pendingCalls.delete(id);
  if (ev.response?.status !== 'completed') {
    for (const c of calls) view.toolNotRun(c.itemId, 'not run: the reply was cut off');
    return [];
  }
  for (const item of ev.response?.output ?? []) {
    if (item?.type !== 'function_call' || item.status !== 'completed' || !item.call_id) continue;
    if (calls.some((c) => c.callId === item.call_id)) continue;
    view.toolCall(item.id, { name: item.name, callId: item.call_id });
    view.toolArgsDone(item.id, { name: item.name, callId: item.call_id, args: item.arguments ?? '' });
    calls.push({ itemId: item.id, callId: item.call_id, name: item.name, args: item.arguments ?? '' });
    stats.toolCalls += 1;
  }
  return calls.filter((c) => !answeredCalls.has(c.callId));
}

/** Run each call here, send its output, then ask for the reply that uses them. */
function answerCalls(calls) {
  let sent = 0;
  for (const call of calls) {
    answeredCalls.add(call.callId);
    const output = runTool(call.name, call.args);
    const ok = client.send({
      type: 'conversation.item.create',
      item: { type: 'function_call_output', call_id: call.callId, output },
    });
    if (!ok) {
      view.toolNotRun(call.itemId, 'not answered: the connection was lost');
      continue;
    }
    sent += 1;
    stats.toolOutputsSent += 1;
    view.toolResult(call.itemId, output);
  }
  if (!sent) return;
  // The gateway refuses a second reply while one runs: ask once that one is over.
  if (activeResponseId) followUpWanted = true;
  else askFollowUp();
}

function askFollowUp() {
  followUpWanted = false;
  client.send({ type: 'response.create' });
}

function onCallArgumentsDone(ev) {
  callComplete(ev.response_id, { itemId: ev.item_id, callId: ev.call_id, name: ev.name, args: ev.arguments });
}

function onOutputItemDone(ev) {
  const item = ev.item || {};
  if (item.type !== 'function_call' || !item.id) return;
  if (item.status === 'completed') {
    callComplete(ev.response_id, { itemId: item.id, callId: item.call_id, name: item.name, args: item.arguments });
  } else {
    view.toolNotRun(item.id, 'not run: the call was cut off');
  }
}

function onResponseDoneWithCalls(ev) {
  const id = ev.response_id || ev.response?.id;
  const calls = callsToAnswer(ev, id);
  // The caller's turn is answered by the reply that speaks the result: its latency runs on.
  if (calls.length) latency.handOver(id);
  onResponseDone(ev);
  if (calls.length) answerCalls(calls);
  else if (followUpWanted && !activeResponseId) askFollowUp();
}

const HANDLERS = {
  'session.updated': (ev) => {
    const ours = pendingUpdateId !== null;
    pendingUpdateId = null;
    notice('');
    adoptSession(ev.session || {});
    if (ours && applyPending) {
      applyPending = false;
      settingsStatus(`Saved and applied to the live session.${reconnectNote()}`);
    }
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
    // Semantic VAD's wait is its model's; the breakdown that follows says how long it was.
    const td = session?.turnDetection;
    const waitKnown = td?.type !== 'semantic_vad';
    const silence = waitKnown ? td?.silence_duration_ms ?? 0 : 0;
    const now = audio.now();
    const endMs = (ev.audio_end_ms ?? 0) - silence;
    if (ev.item_id) view.callerStopped(ev.item_id, endMs - (speechStartMs.get(ev.item_id) ?? endMs));
    // A call's audio left as a track the page did not count: the speech ended the silence before
    // the gateway said so (the uplink's own delay, a few ms nearby, is left out).
    const spokenEnd = overWebRTC() ? now - silence / 1000 : captureClock.timeOf(endMs);
    latency.turnEnded(spokenEnd ?? now, now, 'vad', { waitKnown });
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
  'conversation.item.truncated': (ev) => {
    view.interrupted(ev.item_id, ev.audio_end_ms);
    // The gateway now keeps only the words whose audio was heard: show those.
    client.send({ type: 'conversation.item.retrieve', item_id: ev.item_id });
  },
  'conversation.item.retrieved': (ev) => {
    const item = ev.item || {};
    if (item.role !== 'assistant' || !item.id) return;
    const part = (item.content || [])[0] || {};
    view.heard(item.id, part.transcript ?? part.text ?? '');
  },
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
  'output_audio_buffer.started': onTrackStarted,
  'output_audio_buffer.stopped': onTrackStopped,
  'output_audio_buffer.cleared': onTrackStopped,
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
  'response.function_call_arguments.delta': (ev) => view.toolArgsDelta(ev.item_id, ev.delta || ''),
  'response.function_call_arguments.done': onCallArgumentsDone,
  'response.output_item.done': onOutputItemDone,
  'response.done': onResponseDoneWithCalls,
  [OVERLAP_EVENT]: onOverlapDecision,
  [LATENCY_EVENT]: (ev) => {
    const turn = latency.serverBreakdown(ev.response_id, ev);
    if (!turn) return;
    // A semantic turn's figure moves by the wait the breakdown reports.
    if (turn === latency.turns.at(-1)) stats.lastLatencyMs = turn.totalMs;
    stats.medianLatencyMs = latency.median();
    renderLatencyPanel();
  },
  'session.closed': (ev) => notice(`The gateway closed the session${ev.reason ? `: ${quoteServer(ev.reason)}` : ''}.`),
  error: onError,
};

// ---------------------------------------------------------------------------
// A WebRTC call's reply track: the gateway plays it and says when it starts and stops

function onTrackStarted(ev) {
  const r = responseFor(ev.response_id);
  if (r.fenced) return;
  r.audio = true;
  r.started = true;
  const now = audio.now();
  latency.firstAudio(ev.response_id, now);
  // What the browser's jitter buffer holds before it plays what arrives.
  latency.playbackStarted(ev.response_id, now + (stats.rtc?.jitterBufferMs ?? 0) / 1000);
}

/** Played out (`stopped`), or cut at the gateway (`cleared`, which truncates the item itself). */
function onTrackStopped(ev) {
  const r = responses.get(ev.response_id);
  if (!r || r.finished) return;
  r.finished = true;
  r.drained = true;
  if (ev.type === 'output_audio_buffer.cleared') {
    r.fenced = true;
    stats.flushes += 1;
  }
}

// ---------------------------------------------------------------------------
// Held replies: the caller spoke over the assistant (overlap.decision)

/**
 * `pause`: the gateway holds the reply while it judges the caller's speech over it, so playback
 * pauses too (its buffered audio kept). `resume`: a backchannel, playback goes on from where it
 * paused. `barge_in`: an interruption; playback is cut as for speech_started, which follows.
 */
function onOverlapDecision(ev) {
  const id = ev.response_id;
  if (!id) return;
  const r = responseFor(id);
  r.decisions = r.decisions ?? [];
  // `playing`: the reply's audio was coming out of the speakers when the decision came.
  const playing = Boolean(r.started && !r.drained && !r.fenced);
  r.decisions.push({ action: ev.action, reason: ev.reason ?? null, playing, t: Math.round(performance.now()) });
  switch (ev.action) {
    case 'pause':
      if (r.fenced || r.paused) break;
      r.paused = true;
      stats.holds += 1;
      // A call's track is held by the gateway itself.
      if (!overWebRTC()) audio.pause(id);
      // The gateway heard the caller: show it, though no turn starts (yet).
      setSpeaking(true);
      break;
    case 'resume':
      if (!r.paused) break;
      unpause(id, r);
      stats.holdsResumed += 1;
      setSpeaking(false);
      if (r.itemId) view.resumed(r.itemId);
      break;
    case 'barge_in':
      r.paused = false;
      // A flush ends the worklet's pause as it drops the reply.
      void interruptPlayback('barge_in');
      break;
    default:
      break;
  }
}

function unpause(id, r) {
  r.paused = false;
  if (overWebRTC()) return;
  audio.resume(id);
  // The held audio comes in a burst after a gap that was the hold, not the network.
  jitter.restart(id);
}

// ---------------------------------------------------------------------------
// Playback reports and barge-in

function onPlayback(msg) {
  switch (msg.type) {
    case 'progress':
      playbackLast.samplesPlayed = msg.samplesPlayed;
      stats.samplesPlayed = msg.samplesPlayed - playbackBase.samplesPlayed;
      stats.playbackRate = msg.sampleRate;
      stats.bufferedMs = Math.round(msg.bufferedMs);
      break;
    case 'started': {
      latency.playbackStarted(msg.responseId, msg.time);
      const r = responses.get(msg.responseId);
      if (r) r.started = true;
      break;
    }
    case 'drained': {
      // The reply played to its end: tell the gateway what the caller heard.
      const r = responses.get(msg.responseId);
      if (!r || r.finished) break;
      r.finished = true;
      r.drained = true;
      r.playedMs = (msg.playedSamples * 1000) / msg.sampleRate;
      const played = Math.min(Math.floor(r.playedMs), receivedMs(r));
      if (client.send({ type: 'playback.ack', response_id: msg.responseId, item_id: msg.itemId, played_ms: played })) {
        stats.acksSent += 1;
      }
      break;
    }
    case 'paused':
    case 'resumed': {
      const r = responses.get(msg.responseId);
      if (r) {
        r.worklet = r.worklet ?? [];
        r.worklet.push({ type: msg.type, samplesPlayed: msg.samplesPlayed, bufferedSamples: msg.bufferedSamples, sampleRate: msg.sampleRate });
      }
      break;
    }
    case 'underrun':
      playbackLast.underruns = msg.underruns;
      stats.underruns = msg.underruns - playbackBase.underruns;
      break;
    default:
      break;
  }
  updateAssistantState();
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
  // Cut off is cut off: back to listening now, not when the worklet confirms.
  updateAssistantState();
  if (live.length === 0) return false;
  if (overWebRTC()) {
    // The gateway stops its track and truncates at what it played (output_audio_buffer.cleared).
    for (const [, r] of live) r.finished = true;
    stats.flushes += 1;
    return true;
  }
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
  connecting: (d) => (d.attempt ? 'Trying again…' : 'Connecting…'),
  resuming: () => 'Resuming session…',
  connected: (d) => (d.resumed ? 'Connected · resumed' : 'Connected'),
  reconnecting: (d) => (d.hadSession ? 'Reconnecting…' : 'Not connected'),
  closed: (d) => (d.refusal ? 'Refused by the gateway' : 'Closed by the gateway'),
  failed: (d) => (d.problem === 'lost' ? 'Connection lost' : 'Not connected'),
};

/** Server text, quoted and with the API key masked (the page never shows the key). */
function quoteServer(text) {
  return `“${client.redact(String(text).slice(0, 300))}”`;
}

/** The close code, its reason and the last `error` event, in the gateway's own words. */
function serverWords(d) {
  const said = d.error?.message ? `The gateway said ${quoteServer(d.error.message)}` : 'The gateway closed the connection';
  const reason = d.reason && d.reason !== d.error?.message ? `: ${client.redact(d.reason)}` : '';
  return `${said} (close code ${d.code}${reason}).`;
}

/** What a close by the gateway means for the user, and what to do about it. */
function closeAdvice(d) {
  const code = d.error?.code || d.reason;
  if (code === 'unauthorized' || code === 'invalid_api_key') {
    return 'The gateway refused the connection: check the API key (Settings › API key), then press Connect.';
  }
  if (code === 'session_limit' || (d.code === 1013 && code !== 'engine_unavailable')) {
    return 'The gateway is full, try again later.';
  }
  if (code === 'engine_unavailable') return 'The gateway’s speech engine is not ready, try again later.';
  const byCode = {
    1000: 'The gateway ended the session. Press Connect to start a new one.',
    1008: 'The gateway refused the connection.',
    1009: 'The gateway closed the connection because a message was too large.',
    4000: 'The session ended after a long time without any audio (idle timeout). Press Connect to start a new one.',
    4001: 'The session reached its maximum length. Press Connect to start a new one.',
    4002: 'The connection was too slow to keep up with the gateway. Press Connect to try again.',
    4003: 'The speech engine ended the session. Press Connect to start a new one.',
  };
  return byCode[d.code] || 'The gateway closed the connection.';
}

/**
 * A handshake the gateway refused before the upgrade (what GET /v1/auth/check answered): what to
 * do, by its error code, then the gateway's own message and the HTTP status. Never the key.
 */
function refusalText(r) {
  const seconds = (s) => `${s} second${s === 1 ? '' : 's'}`;
  const advice = {
    unauthorized: readSettings().apiKey.trim()
      ? 'The gateway refused the API key: check the API key (Settings › API key), then press Connect.'
      : 'The gateway needs an API key: enter it in Settings › API key, then press Connect.',
    forbidden: 'This API key is not allowed here (this kind of session, or this gateway’s engine): use another key, or ask whoever runs the gateway to allow it.',
    origin_not_allowed: `This page’s origin (${location.origin}) is not on the gateway’s list of allowed origins (auth.allowed_origins): open the page from an allowed origin, or ask whoever runs the gateway to add it.`,
    rate_limited: `Too many connection attempts from this address: wait ${r.retryAfterS != null ? seconds(r.retryAfterS) : 'a moment'}, then press Retry.`,
    session_limit: `The gateway is full, try again later (press Retry${r.retryAfterS != null ? ` in ${seconds(r.retryAfterS)} or more` : ' in a while'}).`,
    webrtc_unavailable: 'This gateway takes no WebRTC calls (it was installed without WebRTC): switch Settings › Transport to WebSocket, then press Connect.',
  }[r.code] || 'The gateway refused the connection.';
  const said = r.message ? `The gateway said ${quoteServer(r.message)}` : 'The gateway gave no reason';
  return `${advice} ${said} (HTTP ${r.status} ${client.redact(r.code)}).`;
}

const unreachable = (d) =>
  `Cannot reach the gateway at ${d.url || 'the Gateway URL'}: check the Gateway URL in Settings and that the gateway is running.`;

/** The status line's text (and kind) for a connection state; null: leave it as it is. */
function connectionStatus(state, d) {
  switch (state) {
    case 'idle':
    case 'connected':
      return { text: '' };
    case 'connecting':
    case 'resuming':
      return null;
    case 'reconnecting': {
      let lead;
      if (d.hadSession) {
        const what = d.resume ? 'resuming the session' : 'starting a new session';
        const why = d.reason ? `close code ${d.code}: ${client.redact(d.reason)}` : `close code ${d.code}`;
        lead = `Connection lost (${why}); ${what}.`;
      } else if (d.opened) {
        lead = `${serverWords(d)} No session was started.`;
      } else {
        lead = unreachable(d);
      }
      return { text: lead, kind: 'warn', retry: d };
    }
    case 'closed':
      if (d.refusal) return { text: refusalText(d.refusal), kind: 'error' };
      if (d.call) return { text: callEndedText(d), kind: 'error' };
      return { text: `${closeAdvice(d)} ${serverWords(d)}`, kind: 'error' };
    case 'failed':
      if (d.transport === 'webrtc') return { text: callFailedText(d), kind: 'error' };
      if (d.problem === 'invalid_url') {
        return { text: 'The Gateway URL is not a valid ws:// or wss:// URL: correct it in Settings, then press Connect.', kind: 'error' };
      }
      if (d.problem === 'insecure_url') {
        return { text: 'This page was loaded over https, so it can only connect to wss:// URLs: correct the Gateway URL in Settings.', kind: 'error' };
      }
      if (d.problem === 'lost') {
        return { text: `Connection lost, and the gateway could not be reached again (${d.attempts} attempts). Press Retry to start a new session.`, kind: 'error' };
      }
      return {
        text: d.opened ? `${serverWords(d)} No session was started; gave up after ${d.attempts} attempts.` : `${unreachable(d)} Gave up after ${d.attempts} attempts.`,
        kind: 'error',
      };
    default:
      return null;
  }
}

/** A WebRTC call the gateway ended: its last `error`, if any, says why. */
function callEndedText(d) {
  const said = d.error?.message ? ` The gateway said ${quoteServer(d.error.message)} (${client.redact(d.error.code || 'error')}).` : '';
  return `The gateway ended the call.${said} Press Connect to start a new one.`;
}

/** A WebRTC call that could not be made or broke, and what to do about it. */
function callFailedText(d) {
  const viaWebSocket = 'or switch Settings › Transport to WebSocket';
  switch (d.problem) {
    case 'webrtc_url':
      return `A WebRTC call goes to the Realtime URL (…/v1/realtime), not ${d.url}: correct the Gateway URL in Settings, ${viaWebSocket}.`;
    case 'unreachable':
      return `${unreachable(d)} (The call's offer could not be posted.)`;
    case 'bad_answer':
      return `The gateway's answer to the call could not be used (${client.redact(d.why ?? '')}): ${viaWebSocket}.`;
    case 'ice':
      return `The call's audio connection did not come up: a firewall may block UDP between this browser and the gateway (the gateway's webrtc settings list its addresses, STUN and TURN servers). Press Retry, ${viaWebSocket}.`;
    case 'lost':
    default:
      return 'The call was lost (its audio connection broke). Press Retry to start a new session.';
  }
}

let retryPlan = null; // {at, attempt, retries} while an automatic retry is scheduled

function onState(state, detail) {
  const d = detail || {};
  stats.state = state;
  stats.reconnects = client.reconnects;
  $('conn').dataset.state = state;
  $('conn-text').textContent = STATE_TEXT[state](d);
  if (state !== 'connected') streaming = false;
  // The "Press Connect" hint is for before the first connection only.
  if (state === 'connected') $('empty-hint').hidden = true;
  else if (state === 'idle' && view.empty) $('empty-hint').hidden = false;
  retryPlan = state === 'reconnecting' ? { at: d.retryAt, attempt: d.attempt, retries: d.retries } : null;
  const status = connectionStatus(state, d);
  if (status) notice(status.text, status.kind);
  if ((state === 'connecting' || state === 'resuming') && d.attempt) $('countdown').textContent = 'Trying again now…';
  renderCountdown();
  if (state === 'closed' || state === 'failed') void stopAudio();
  updateControls();
  updateAssistantState();
}

/** The retry countdown, in whole seconds, counting down to the next attempt. */
function renderCountdown() {
  const el = $('countdown');
  if (!retryPlan) {
    stats.retryInS = null;
    if (client.state !== 'connecting' && client.state !== 'resuming') el.textContent = '';
    return;
  }
  const seconds = Math.max(0, Math.ceil((retryPlan.at - performance.now()) / 1000));
  stats.retryInS = seconds;
  el.textContent = `Retrying in ${seconds} s (attempt ${retryPlan.attempt + 1} of ${retryPlan.retries + 1}).`;
}

function updateControls() {
  const live = client.state !== 'idle' && client.state !== 'closed' && client.state !== 'failed';
  const ready = client.ready && streaming;
  const button = $('connect');
  button.textContent = live ? 'Disconnect' : 'Connect';
  button.classList.toggle('connected', live);
  button.disabled = Boolean(insecureContext);
  const retry = $('retry');
  retry.hidden = !(client.state === 'reconnecting' || client.state === 'closed' || client.state === 'failed');
  retry.textContent = client.state === 'reconnecting' ? 'Retry now' : 'Retry';
  $('mute').disabled = !ready;
  $('talk').disabled = !ready;
  $('barge').disabled = !ready;
  $('commit').disabled = !ready;
  $('respond').disabled = !ready;
  $('text-input').disabled = !ready;
  $('send-text').disabled = !ready;
}

/** The status line next to Connect: what happened and what to do ('' hides it). */
function notice(text, kind = 'error') {
  $('notice-text').textContent = client.redact(text);
  $('notice').dataset.kind = kind;
  $('status-bar').hidden = !text;
  if (!text) $('countdown').textContent = '';
}

/** Why this page cannot use the microphone here, or null. Checked once, on load. */
function insecureContextProblem() {
  const port = location.port || (location.protocol === 'https:' ? '443' : '80');
  if (!window.isSecureContext) {
    const local = `http://localhost:${port}/`;
    return (
      `The browser allows the microphone only on secure pages, and ${location.origin} is not one. ` +
      `Open the demo over https (start the gateway with --ssl-certfile and --ssl-keyfile), ` +
      `as ${local} or http://127.0.0.1:${port}/ on the gateway's own machine, ` +
      `or through an SSH tunnel: run ssh -L ${port}:localhost:${port} ${location.hostname} here, then open ${local}.`
    );
  }
  if (!navigator.mediaDevices?.getUserMedia || typeof AudioWorkletNode === 'undefined') {
    return 'This browser offers no microphone access or no AudioWorklet: use a current Chrome, Edge, Firefox or Safari.';
  }
  return null;
}

const insecureContext = insecureContextProblem();

/** A getUserMedia / AudioContext failure, in words that say the fix. */
function microphoneProblem(err) {
  switch (err?.name) {
    case 'PageServerUnreachable':
      return `Cannot reach the gateway at ${err.origin}: the page could not load its audio code from it. Check that the gateway is running, then press Connect.`;
    case 'NotAllowedError':
    case 'SecurityError':
      return 'The browser blocked the microphone: allow the microphone for this page (the icon at the left of the address bar, or the site settings), then press Connect.';
    case 'NotFoundError':
      return 'No microphone found: connect one (or pick another in Settings), then press Connect.';
    case 'NotReadableError':
    case 'AbortError':
      return 'The microphone could not be opened: another application may be using it. Close it, then press Connect.';
    case 'OverconstrainedError':
      return 'The chosen microphone is not available any more: pick another in Settings, then press Connect.';
    default:
      return `The microphone or audio output could not be started (${err?.name || 'error'}: ${err?.message || err}).`;
  }
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
  await refreshSpeakers();
}

async function refreshSpeakers() {
  const select = $('speaker');
  $('speaker-field').hidden = !AudioIO.canPickSpeaker;
  if (!AudioIO.canPickSpeaker) return;
  const current = select.value;
  const speakers = await listSpeakers();
  select.replaceChildren(
    Object.assign(document.createElement('option'), { value: '', textContent: 'Default speaker' }),
    ...speakers
      .filter((d) => d.deviceId && d.deviceId !== 'default')
      .map((d, i) =>
        Object.assign(document.createElement('option'), { value: d.deviceId, textContent: d.label || `Speaker ${i + 1}` }),
      ),
  );
  if ([...select.options].some((o) => o.value === current)) select.value = current;
}

/** Which transport the page uses, next to the connection state (and for tests). */
function showTransport(transport) {
  stats.transport = transport;
  const badge = $('transport-badge');
  badge.textContent = TRANSPORT_NAMES[transport];
  badge.dataset.transport = transport;
  badge.title =
    transport === 'webrtc'
      ? 'WebRTC: Opus audio on media tracks, events on a data channel (Settings › Transport)'
      : 'WebSocket: PCM audio and events as JSON messages (Settings › Transport)';
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
    setTalking(false);
    view.settlePartials();
    await stopAudio();
    return;
  }
  if (insecureContext) return;
  saveSettings();
  notice('');
  const s = readSettings();
  client = clients[s.transport];
  showTransport(s.transport);
  try {
    // Started inside the click handler: browsers only let a user gesture start audio.
    await audio.start({
      deviceId: s.device,
      input: { format: s.inFormat, rate: s.inRate, frameMs: s.frameMs },
      output: { rate: s.outRate },
      targetMs: jitter.targetMs,
    });
  } catch (err) {
    notice(microphoneProblem(err));
    await stopAudio();
    return;
  }
  // A fresh playback worklet counts from zero.
  playbackLast = { samplesPlayed: 0, underruns: 0 };
  Object.assign(playbackBase, playbackLast);
  startOutputMeter();
  void refreshDevices();
  appliedConnection = { url: s.url, apiKey: s.apiKey, transport: s.transport };
  // Another gateway may offer what the last one did not.
  askLatency = true;
  connectedAt = performance.now();
  client.connect();
}

function commitTurn() {
  setTalking(false);
  if (client.send({ type: 'input_audio_buffer.commit' })) {
    committedMs = uncommittedMs;
    uncommittedMs = 0;
  }
}

function requestResponse() {
  setTalking(false);
  // "Respond" after talking without pressing Commit: commit the turn first.
  if (uncommittedMs > 100) commitTurn();
  const now = audio.now();
  // With push-to-talk the turn is over when the caller asks for the reply.
  latency.turnEnded(now, now, 'commit');
  client.send({ type: 'response.create' });
}

/** A typed message: a user item in the conversation, then a reply to it. */
let textCount = 0;
function sendText(text) {
  if (!client.ready || !text) return false;
  // A reply in progress would refuse a new one: cut it first, as a barge-in does.
  if (activeResponseId) bargeIn();
  textCount += 1;
  client.send({
    type: 'conversation.item.create',
    event_id: `evt_text_${textCount}`,
    item: { type: 'message', role: 'user', content: [{ type: 'input_text', text }] },
  });
  const now = audio.now();
  latency.turnEnded(now, now, 'text');
  client.send({ type: 'response.create' });
  return true;
}

// ---------------------------------------------------------------------------
// Transcript export and clear

function download(name, text, type) {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = Object.assign(document.createElement('a'), { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

function exportName(ext) {
  const stamp = new Date().toISOString().slice(0, 19).replace(/[-:]/g, '').replace('T', '-');
  return `conversation-${stamp}.${ext}`;
}

function exportTranscript(kind) {
  const items = view.snapshot();
  if (kind === 'json') {
    const doc = { exported_at: new Date().toISOString(), session_id: client.sessionId, engine: session?.engine ?? null, items };
    download(exportName('json'), `${JSON.stringify(doc, null, 2)}\n`, 'application/json');
    return;
  }
  const lines = items.flatMap((e) => {
    if (e.role === 'tool') {
      const note = e.interrupted ? ' [not run]' : e.output === null ? ' [no result]' : '';
      const call = `[${e.at}] Tool call: ${e.text}${note}`;
      return e.output === null ? [call] : [call, `[${e.at}] Tool result: ${e.output}`];
    }
    const who = e.role === 'user' ? 'You' : 'Assistant';
    const note = e.interrupted ? ' [interrupted]' : e.final ? '' : ' [unfinished]';
    return [`[${e.at}] ${who}: ${e.text}${note}`];
  });
  download(exportName('txt'), `${lines.join('\n')}\n`, 'text/plain');
}

function bargeIn() {
  if (overWebRTC()) {
    // OpenAI's way on a call: the gateway cancels the reply, stops its track and truncates the
    // item at what it played.
    client.send({ type: 'output_audio_buffer.clear' });
  } else {
    // barge_in fences the reply at the gateway; the truncate says what was heard.
    client.send({ type: 'barge_in' });
  }
  void interruptPlayback('user');
}

function renderStats() {
  const rate = stats.playbackRate || 48000;
  const playedS = overWebRTC() ? stats.heardMs / 1000 : stats.samplesPlayed / rate;
  $('st-played').textContent = `${playedS.toFixed(1)} s`;
  $('st-target').textContent = `${stats.jitterTargetMs} ms`;
  $('st-buffered').textContent = audio.running ? `${stats.bufferedMs} ms` : '—';
  $('st-underruns').textContent = String(stats.underruns);
  $('st-flushes').textContent = String(stats.flushes);
  $('st-responses').textContent = String(stats.responses);
}

/** The mute button keeps its label; aria-pressed says whether it is on. */
function setMuted(on) {
  muted = on;
  const button = $('mute');
  button.setAttribute('aria-pressed', String(muted));
  $('meter').classList.toggle('muted', muted);
  $('meter-label').textContent = muted ? 'Mic (muted)' : 'Mic';
  syncMicTrack();
  if (muted) {
    showLevel(0);
    setSpeaking(false);
    // Push-to-talk: muting ends the talking (the turn waits for Commit or Respond).
    setTalking(false);
  }
}

/** Push-to-talk: the microphone streams only while Talk is pressed. */
let talkingSince = null; // performance.now() when Talk was pressed (a call counts its own turn's audio)
function setTalking(on) {
  const was = talking;
  talking = Boolean(on) && pttMode && !muted;
  // A call's audio is the track, so the page counts what a turn holds by how long Talk was down.
  if (talking && !was) talkingSince = performance.now();
  if (!talking && was && overWebRTC() && talkingSince !== null) uncommittedMs += performance.now() - talkingSince;
  if (!talking) talkingSince = null;
  syncMicTrack();
  $('talk').setAttribute('aria-pressed', String(talking));
  if (!talking) {
    showLevel(0);
    if (pttMode) setSpeaking(false);
  }
}

/**
 * With no audio going out (push-to-talk not talking) the gateway would end an
 * idle session: a session.heartbeat counts as activity and keeps it open.
 */
function heartbeat() {
  // A call's track carries audio (or silence) all the time: that is activity enough.
  if (overWebRTC()) return;
  if (!client.ready || !session || performance.now() - lastSentAt < 1000) return;
  if (client.send({ type: 'session.heartbeat' })) {
    lastSentAt = performance.now();
    stats.heartbeatsSent += 1;
  }
}

let applyPending = false; // Apply sent a session.update whose answer is due

/** The line next to Apply: what became of the settings. */
function settingsStatus(text, kind = 'ok') {
  const el = $('settings-status');
  el.textContent = text;
  el.dataset.kind = kind;
}

/** URL and key are used when connecting: say so when they differ from the live connection's. */
function reconnectNote() {
  const s = readSettings();
  const a = appliedConnection;
  if (!a || (s.url === a.url && s.apiKey === a.apiKey && s.transport === a.transport)) return '';
  return ' The transport, Gateway URL and API key take effect on reconnect (Disconnect, then Connect).';
}

// ---------------------------------------------------------------------------
// Wiring

initSettingsForm();
client = clients[readSettings().transport];
$('connect').addEventListener('click', () => void toggleConnection());
$('retry').addEventListener('click', () => {
  if (client.state === 'reconnecting') client.retryNow();
  else void toggleConnection();
});
$('mute').addEventListener('click', () => setMuted(!muted));
$('talk').addEventListener('click', () => setTalking(!talking));
$('barge').addEventListener('click', bargeIn);
$('text-form').addEventListener('submit', (event) => {
  event.preventDefault();
  const input = $('text-input');
  if (sendText(input.value.trim())) input.value = '';
});
$('export-txt').addEventListener('click', () => exportTranscript('txt'));
$('export-json').addEventListener('click', () => exportTranscript('json'));
$('clear-transcript').addEventListener('click', () => {
  view.clear();
  if (client.state === 'idle') $('empty-hint').hidden = false;
});
$('volume').addEventListener('input', () => audio.setVolume(Number($('volume').value) / 100));
$('speaker').addEventListener('change', async () => {
  try {
    await audio.setSpeaker($('speaker').value);
  } catch (err) {
    notice(`Could not switch to that speaker (${err?.name || 'error'}).`);
  }
});
$('log-filter').addEventListener('input', () => {
  logDirty = true;
  renderLog();
});
$('log-panel').addEventListener('toggle', () => {
  logDirty = true;
  renderLog();
});
$('log-clear').addEventListener('click', () => {
  eventLog.length = 0;
  logDirty = true;
  renderLog();
});
setInterval(renderLog, 300);
void refreshSpeakers();
$('commit').addEventListener('click', commitTurn);
$('respond').addEventListener('click', requestResponse);
$('turn').addEventListener('change', syncVadFields);
$('in-format').addEventListener('change', () => fitRateToFormat('in', true));
$('out-format').addEventListener('change', () => fitRateToFormat('out', true));
$('device').addEventListener('change', async () => {
  try {
    await audio.setDevice($('device').value);
  } catch (err) {
    notice(`Could not switch to that microphone. ${microphoneProblem(err)}`);
  }
});
form.addEventListener('submit', (event) => {
  event.preventDefault();
  saveSettings();
  if (client.ready && session) {
    applyPending = true;
    settingsStatus('Saved; applying to the live session…');
    sendSessionUpdate();
  } else if (client.state === 'idle' || client.state === 'closed' || client.state === 'failed') {
    settingsStatus('Saved. Used when you connect.');
  } else {
    settingsStatus(`Saved. Applied once the session is ready.${reconnectNote()}`);
  }
});
// Editing again clears the last confirmation.
form.addEventListener('input', () => settingsStatus(''));
setInterval(heartbeat, 1000);
navigator.mediaDevices?.addEventListener?.('devicechange', () => void refreshDevices());
setInterval(renderStats, 250);
setInterval(renderCountdown, 200);
if (insecureContext) notice(insecureContext);
else {
  // A microphone already blocked for this site: say so before Connect fails.
  navigator.permissions
    ?.query({ name: 'microphone' })
    .then((p) => {
      if (p.state === 'denied' && client.state === 'idle') notice(microphoneProblem({ name: 'NotAllowedError' }));
    })
    .catch(() => {});
}
updateControls();
