// The latency panel: the last turn's figure, the median, and a bar per turn
// split into where the time went (see LatencyTracker for the definitions),
// with the gateway's own breakdown of its share under the bar when it sent one.

const SEGMENTS = [
  ['endpointMs', 'seg-endpoint', 'end-of-turn wait'],
  ['serverMs', 'seg-server', 'gateway + engine'],
  ['bufferMs', 'seg-buffer', 'jitter buffer'],
];
const SHOWN = 8;

/** The gateway's stage names (turn.latency), as the panel words them. */
const STAGE_LABELS = {
  turn_detection: 'turn end',
  recognition: 'recognition',
  reply: 'reply',
  speech: 'speech',
  engine: 'engine',
  other: 'other',
};

export const stageLabel = (name) => STAGE_LABELS[name] || String(name).replace(/[_.]+/g, ' ');

const ms = (value) => `${Math.round(value)} ms`;

/** Whole milliseconds; a cached or trivial stage that took a fraction of one is not "0". */
export const stageMs = (value) => (value > 0 && value < 0.5 ? '<1' : String(Math.round(value)));

/** "turn end 500 ms, recognition 120 ms, …" */
export function describeStages(server) {
  return server.stages
    .map((s) => `${stageLabel(s.name)} ${stageMs(s.ms) === '<1' ? 'under 1' : stageMs(s.ms)} ms`)
    .join(', ');
}

function stagesLine(server) {
  const line = document.createElement('span');
  line.className = 'stages';
  const head = document.createElement('span');
  head.className = 'stages-head';
  head.textContent = `gateway ${ms(server.totalMs)}:`;
  line.append(head);
  for (const stage of server.stages) {
    const chip = document.createElement('span');
    chip.className = 'stage';
    chip.dataset.stage = stage.name;
    const label = document.createElement('span');
    label.className = 'stage-name';
    label.textContent = stageLabel(stage.name);
    const value = document.createElement('span');
    value.className = 'stage-ms';
    value.textContent = stageMs(stage.ms);
    chip.append(label, ' ', value);
    line.append(chip);
  }
  return line;
}

export function renderLatency({ value, median, timeline, note }, turns) {
  const last = turns[turns.length - 1];
  value.textContent = last ? String(last.totalMs) : '—';
  const mid = turns.length ? [...turns].map((t) => t.totalMs).sort((a, b) => a - b)[turns.length >> 1] : null;
  median.textContent = mid === null ? '—' : `${mid} ms`;

  const recent = turns.slice(-SHOWN);
  // A shared scale so bars compare across turns; at least 1 s so small ones don't look huge.
  const scale = Math.max(1000, ...recent.map((t) => t.totalMs));
  timeline.replaceChildren(
    ...recent.map((turn) => {
      const row = document.createElement('li');
      row.className = 'turn';
      row.dataset.responseId = turn.responseId || '';
      const parts = SEGMENTS.map(([key, , label]) => `${label} ${turn.parts[key]} ms`).join(', ');
      const server = turn.server ? `; gateway's breakdown ${ms(turn.server.totalMs)}: ${describeStages(turn.server)}` : '';
      row.setAttribute('aria-label', `Turn ${turn.id}: ${turn.totalMs} ms (${parts})${server}`);
      row.title = `${{ commit: 'push-to-talk', text: 'typed' }[turn.how] || 'server VAD'} turn — ${parts}${server}`;
      const label = document.createElement('span');
      label.className = 'turn-id';
      label.textContent = `#${turn.id}`;
      const bar = document.createElement('span');
      bar.className = 'bar';
      for (const [key, cls] of SEGMENTS) {
        const seg = document.createElement('span');
        seg.className = `seg ${cls}`;
        seg.style.width = `${(100 * turn.parts[key]) / scale}%`;
        bar.append(seg);
      }
      const total = document.createElement('span');
      total.className = 'turn-ms';
      total.textContent = `${turn.totalMs} ms`;
      row.append(label, bar, total);
      if (turn.server) row.append(stagesLine(turn.server));
      return row;
    }),
  );
  // Explained only once there is something to explain (an older gateway sends no breakdown).
  if (note) note.hidden = !recent.some((t) => t.server);
}
