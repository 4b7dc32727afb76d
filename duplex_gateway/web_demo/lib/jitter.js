// Sizes the playback jitter buffer from how reply audio actually arrives.
//
// A fixed buffer is either too small on a bursty link (stutter) or too large
// on a smooth one (latency for nothing). We record the gaps between
// consecutive audio deltas of the same reply and aim for their 95th
// percentile: enough cushion to ride out all but the rarest late chunk,
// clamped to 40-300 ms so one pathological stall cannot make every later
// reply slow to start.

export class JitterEstimator {
  constructor({ minMs = 40, maxMs = 300, initialMs = 120, window = 64 } = {}) {
    this.minMs = minMs;
    this.maxMs = maxMs;
    this.window = window;
    this.gaps = [];
    this.targetMs = initialMs;
    this.lastKey = null;
    this.lastAt = 0;
  }

  /**
   * The next chunk of reply `key` comes after a wait that is not the network's (the gateway held
   * the reply while the caller spoke over it): that gap does not count.
   */
  restart(key) {
    if (key === this.lastKey) this.lastKey = null;
  }

  /** An audio chunk of reply `key` arrived at `nowMs`; returns the (maybe new) target. */
  arrival(key, nowMs) {
    // The gap before a reply's first chunk is think time, not network jitter.
    if (key === this.lastKey) {
      this.gaps.push(nowMs - this.lastAt);
      if (this.gaps.length > this.window) this.gaps.shift();
      if (this.gaps.length >= 4) {
        const sorted = [...this.gaps].sort((a, b) => a - b);
        const p95 = sorted[Math.min(sorted.length - 1, Math.ceil(0.95 * sorted.length) - 1)];
        this.targetMs = Math.round(Math.min(this.maxMs, Math.max(this.minMs, p95)));
      }
    }
    this.lastKey = key;
    this.lastAt = nowMs;
    return this.targetMs;
  }
}
