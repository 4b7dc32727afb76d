// Wire audio formats of the Realtime protocol <-> Float32 samples in [-1, 1].
//
// Shared by the capture worklet (encode) and the page (decode). Every format
// is little-endian mono; DataView makes the byte order explicit instead of
// trusting the platform's typed-array endianness.

/** Format names as the gateway's session object spells them (GA `type`, beta name). */
export const FORMATS = {
  pcm16: { ga: 'audio/pcm', bytes: 2, label: 'PCM 16-bit' },
  pcm_f32le: { ga: 'audio/pcm_f32le', bytes: 4, label: 'PCM float32' },
  g711_ulaw: { ga: 'audio/pcmu', bytes: 1, label: 'G.711 µ-law' },
  g711_alaw: { ga: 'audio/pcma', bytes: 1, label: 'G.711 A-law' },
};

/** The beta name of a GA `format` object ({type, rate}) or of a beta string. */
export function formatName(format) {
  const type = typeof format === 'string' ? format : format?.type;
  for (const [name, f] of Object.entries(FORMATS)) {
    if (type === name || type === f.ga) return name;
  }
  return 'pcm16';
}

// ---- G.711 (ITU-T reference algorithms) ----

const ULAW_SEGMENT_ENDS = [0x3f, 0x7f, 0xff, 0x1ff, 0x3ff, 0x7ff, 0xfff, 0x1fff];

function linearToUlaw(sample) {
  // g711.c's linear2ulaw: 14-bit magnitude, bias 33 (bit-exact with the gateway's tables).
  let pcm = Math.max(-32768, Math.min(32767, Math.trunc(sample * 32767))) >> 2;
  const mask = pcm < 0 ? 0x7f : 0xff;
  pcm = Math.min(Math.abs(pcm), 8159) + 33;
  let seg = 0;
  while (seg < 8 && pcm > ULAW_SEGMENT_ENDS[seg]) seg++;
  if (seg >= 8) return 0x7f ^ mask;
  return (((seg << 4) | ((pcm >> (seg + 1)) & 0x0f)) ^ mask) & 0xff;
}

function ulawToLinear(code) {
  const u = ~code & 0xff;
  const t = (((u & 0x0f) << 3) + 0x84) << ((u >> 4) & 0x07);
  return (u & 0x80 ? 0x84 - t : t - 0x84) / 32768;
}

function linearToAlaw(sample) {
  let pcm = Math.max(-32768, Math.min(32767, Math.trunc(sample * 32767))) >> 3; // 13-bit
  const sign = pcm >= 0 ? 0x80 : 0;
  if (!sign) pcm = -pcm - 1;
  pcm = Math.min(pcm, 0xfff);
  let seg = 0;
  if (pcm >= 32) seg = Math.min(7, Math.floor(Math.log2(pcm)) - 4);
  const mantissa = (seg === 0 ? pcm >> 1 : pcm >> seg) & 0x0f;
  return (sign | (seg << 4) | mantissa) ^ 0x55;
}

function alawToLinear(code) {
  const a = code ^ 0x55;
  const seg = (a >> 4) & 0x07;
  const mant = a & 0x0f;
  const mag = seg === 0 ? (mant << 4) + 8 : ((mant << 4) + 0x108) << (seg - 1);
  return (a & 0x80 ? mag : -mag) / 32768;
}

/** Float samples -> wire bytes (a fresh ArrayBuffer, transferable). */
export function encode(samples, name) {
  const n = samples.length;
  switch (name) {
    case 'pcm_f32le': {
      const view = new DataView(new ArrayBuffer(n * 4));
      for (let i = 0; i < n; i++) view.setFloat32(i * 4, samples[i], true);
      return view.buffer;
    }
    case 'g711_ulaw': {
      const out = new Uint8Array(n);
      for (let i = 0; i < n; i++) out[i] = linearToUlaw(samples[i]);
      return out.buffer;
    }
    case 'g711_alaw': {
      const out = new Uint8Array(n);
      for (let i = 0; i < n; i++) out[i] = linearToAlaw(samples[i]);
      return out.buffer;
    }
    default: {
      const view = new DataView(new ArrayBuffer(n * 2));
      for (let i = 0; i < n; i++) {
        const s = Math.max(-1, Math.min(1, samples[i]));
        view.setInt16(i * 2, Math.round(s < 0 ? s * 32768 : s * 32767), true);
      }
      return view.buffer;
    }
  }
}

/** Wire bytes (Uint8Array) -> Float32Array. A trailing partial sample is ignored. */
export function decode(bytes, name) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  switch (name) {
    case 'pcm_f32le': {
      const out = new Float32Array(Math.floor(bytes.length / 4));
      for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(i * 4, true);
      return out;
    }
    case 'g711_ulaw':
      return Float32Array.from(bytes, ulawToLinear);
    case 'g711_alaw':
      return Float32Array.from(bytes, alawToLinear);
    default: {
      const out = new Float32Array(Math.floor(bytes.length / 2));
      for (let i = 0; i < out.length; i++) out[i] = view.getInt16(i * 2, true) / 32768;
      return out;
    }
  }
}

// ---- base64 (the Realtime protocol carries audio as base64 text) ----

export function bytesToBase64(buffer) {
  const bytes = buffer instanceof Uint8Array ? buffer : new Uint8Array(buffer);
  // String.fromCharCode on big arrays overflows the call stack; go in slices.
  let binary = '';
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

export function base64ToBytes(text) {
  const binary = atob(text);
  const out = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) out[i] = binary.charCodeAt(i);
  return out;
}
