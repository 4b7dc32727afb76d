// Streaming band-limited resampler (windowed sinc, polyphase table, linear
// interpolation between phases), shared by the capture and playback worklets.
//
// Why not linear interpolation: going from a 48 kHz microphone down to 16 or
// 24 kHz without a low-pass filter folds everything above the new Nyquist
// back into the speech band, which is exactly the hiss that hurts VAD and ASR.
// Why keep state: audio arrives in 128-sample render quanta (capture) or in
// network chunks (playback); a resampler that restarts per block clicks at
// every block edge. This one keeps the filter history and an exact rational
// read position, so a stream resampled in pieces equals the stream resampled
// whole, and the position never drifts however long the call lasts.

const ZERO_CROSSINGS = 16; // filter half-length, in zero crossings of the sinc
const PHASES = 256; // sub-sample positions tabulated (interpolated between)
const KAISER_BETA = 8.0; // ≈ 80 dB stop-band attenuation
const PASSBAND = 0.92; // cutoff as a fraction of the lower Nyquist frequency

function besselI0(x) {
  // Power series; converges fast for the beta used here.
  let sum = 1;
  let term = 1;
  const q = (x * x) / 4;
  for (let k = 1; k < 50; k++) {
    term *= q / (k * k);
    sum += term;
    if (term < sum * 1e-12) break;
  }
  return sum;
}

/** Build the filter table once per (rate pair); index [phase * taps + j]. */
function buildTable(scale, halfWidth) {
  const taps = 2 * halfWidth;
  const table = new Float32Array((PHASES + 1) * taps);
  const cutoff = scale * PASSBAND;
  const i0beta = besselI0(KAISER_BETA);
  for (let p = 0; p <= PHASES; p++) {
    const frac = p / PHASES;
    let sum = 0;
    for (let j = 0; j < taps; j++) {
      // Distance (in input samples) from the output instant to input tap j.
      const x = j - halfWidth + 1 - frac;
      const arg = Math.PI * cutoff * x;
      const sinc = x === 0 ? 1 : Math.sin(arg) / arg;
      const r = x / halfWidth;
      const win = Math.abs(r) >= 1 ? 0 : besselI0(KAISER_BETA * Math.sqrt(1 - r * r)) / i0beta;
      const v = sinc * win;
      table[p * taps + j] = v;
      sum += v;
    }
    // Unity gain at DC for every phase, so steady tones do not wobble.
    for (let j = 0; j < taps; j++) table[p * taps + j] /= sum;
  }
  return table;
}

export class StreamResampler {
  /**
   * @param {number} inRate  input sample rate (Hz, integral)
   * @param {number} outRate output sample rate (Hz, integral)
   */
  constructor(inRate, outRate) {
    this.inRate = Math.round(inRate);
    this.outRate = Math.round(outRate);
    this.passthrough = this.inRate === this.outRate;
    const scale = Math.min(1, this.outRate / this.inRate);
    // Downsampling stretches the filter so its cutoff sits below the output Nyquist.
    this.halfWidth = Math.ceil(ZERO_CROSSINGS / scale);
    this.taps = 2 * this.halfWidth;
    this.table = this.passthrough ? null : buildTable(scale, this.halfWidth);
    // Read position = intPos + fracNum / outRate input samples (exact rational).
    this.step = Math.floor(this.inRate / this.outRate);
    this.stepFrac = this.inRate % this.outRate;
    this.reset();
  }

  reset() {
    this.buf = new Float32Array(4096);
    // History of zeros so the first output can look halfWidth samples back.
    this.len = this.halfWidth;
    this.intPos = this.halfWidth;
    this.fracNum = 0;
  }

  /** Resample one block; returns a NEW Float32Array (possibly empty). */
  process(input) {
    if (this.passthrough) return Float32Array.from(input);
    this.append(input);
    return this.produce(this.len);
  }

  /**
   * Emit what is left (the filter's look-ahead) as if the input ended here,
   * then reset. Used when a reply ends so its last few milliseconds play.
   */
  flush() {
    if (this.passthrough) return new Float32Array(0);
    const end = this.len; // outputs past the last real input would be padding
    this.append(new Float32Array(this.halfWidth + 1));
    const out = this.produce(this.len, end);
    this.reset();
    return out;
  }

  append(input) {
    if (this.len + input.length > this.buf.length) {
      const grown = new Float32Array(Math.max(this.buf.length * 2, this.len + input.length));
      grown.set(this.buf.subarray(0, this.len));
      this.buf = grown;
    }
    this.buf.set(input, this.len);
    this.len += input.length;
  }

  produce(available, limit = Infinity) {
    const { halfWidth, taps, table, buf, outRate } = this;
    // Upper bound of outputs this call can produce, to size the result once.
    const room = Math.max(0, Math.ceil(((available - halfWidth - this.intPos) * outRate) / this.inRate) + 2);
    const out = new Float32Array(room);
    let n = 0;
    while (this.intPos + halfWidth < available && this.intPos < limit && n < room) {
      const phasePos = (this.fracNum / outRate) * PHASES;
      const p = Math.floor(phasePos);
      const a = phasePos - p;
      const row0 = p * taps;
      const row1 = row0 + taps;
      const base = this.intPos - halfWidth + 1;
      let acc = 0;
      for (let j = 0; j < taps; j++) {
        const h = table[row0 + j] + a * (table[row1 + j] - table[row0 + j]);
        acc += buf[base + j] * h;
      }
      out[n++] = acc;
      this.intPos += this.step;
      this.fracNum += this.stepFrac;
      if (this.fracNum >= outRate) {
        this.fracNum -= outRate;
        this.intPos += 1;
      }
    }
    // Drop input no future output can reach, keeping the filter's history.
    const drop = this.intPos - halfWidth + 1;
    if (drop > 0 && drop <= this.len) {
      buf.copyWithin(0, drop, this.len);
      this.len -= drop;
      this.intPos -= drop;
    }
    return n === out.length ? out : out.slice(0, n);
  }
}
