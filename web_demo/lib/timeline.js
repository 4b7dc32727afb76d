// The latency panel: the last turn's figure, the median, and a bar per turn
// split into where the time went (see LatencyTracker for the definitions).

const SEGMENTS = [
  ['endpointMs', 'seg-endpoint', 'end-of-turn wait'],
  ['serverMs', 'seg-server', 'gateway + engine'],
  ['bufferMs', 'seg-buffer', 'jitter buffer'],
];
const SHOWN = 8;

export function renderLatency({ value, median, timeline }, turns) {
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
      const parts = SEGMENTS.map(([key, , label]) => `${label} ${turn.parts[key]} ms`).join(', ');
      row.setAttribute('aria-label', `Turn ${turn.id}: ${turn.totalMs} ms (${parts})`);
      row.title = `${{ commit: 'push-to-talk', text: 'typed' }[turn.how] || 'server VAD'} turn — ${parts}`;
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
      return row;
    }),
  );
}
