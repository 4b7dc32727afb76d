// Microphone -> wire frames, on the audio rendering thread.
//
// Runs in the AudioWorkletGlobalScope so capture never stalls behind the page's
// main thread (layout, garbage collection, WebSocket handling): a late
// ScriptProcessor callback drops audio, a late worklet message only arrives late.
// It resamples from the AudioContext rate to the session's input rate with a
// stateful band-limited filter, cuts the result into fixed frames (20-40 ms:
// small enough for a quick VAD decision, big enough to keep the event count
// sane), encodes them in the session's wire format and hands the bytes over
// (transferred, not copied) together with the capture-clock time of the
// frame's last sample, which the page uses to measure turn latency.

import { StreamResampler } from '../lib/resampler.js';
import { encode } from '../lib/codecs.js';

class CaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.configure(options.processorOptions || {});
    this.port.onmessage = (event) => {
      if (event.data?.type === 'configure') this.configure(event.data);
    };
  }

  configure({ rate = 24000, format = 'pcm16', frameMs = 20 }) {
    this.rate = rate;
    this.format = format;
    this.frameSamples = Math.max(1, Math.round((rate * frameMs) / 1000));
    this.frame = new Float32Array(this.frameSamples);
    this.fill = 0;
    // `sampleRate` is the AudioContext rate (a global of this scope).
    this.resampler = new StreamResampler(sampleRate, rate);
    this.peak = 0;
    this.sumSquares = 0;
    this.levelCount = 0;
  }

  process(inputs) {
    const channels = inputs[0];
    if (!channels || channels.length === 0) return true; // no source connected yet
    // Down-mix: a "stereo" microphone is usually the same signal twice.
    let mono = channels[0];
    if (channels.length > 1) {
      mono = new Float32Array(channels[0].length);
      for (const ch of channels) for (let i = 0; i < mono.length; i++) mono[i] += ch[i] / channels.length;
    }
    for (let i = 0; i < mono.length; i++) {
      const s = mono[i];
      const a = s < 0 ? -s : s;
      if (a > this.peak) this.peak = a;
      this.sumSquares += s * s;
    }
    this.levelCount += mono.length;

    const out = this.resampler.process(mono);
    // Time (AudioContext clock) just after the last input sample of this block.
    const blockEnd = currentTime + mono.length / sampleRate;
    let offset = 0;
    while (offset < out.length) {
      const take = Math.min(out.length - offset, this.frameSamples - this.fill);
      this.frame.set(out.subarray(offset, offset + take), this.fill);
      this.fill += take;
      offset += take;
      if (this.fill === this.frameSamples) {
        const bytes = encode(this.frame, this.format);
        const rms = Math.sqrt(this.sumSquares / Math.max(1, this.levelCount));
        this.port.postMessage(
          {
            type: 'frame',
            bytes,
            samples: this.frameSamples,
            rate: this.rate,
            format: this.format,
            // Output samples still pending in this block were captured slightly
            // earlier than blockEnd; at <= 1 block (2.7 ms) the error is noise.
            endTime: blockEnd,
            rms,
            peak: this.peak,
          },
          [bytes],
        );
        this.fill = 0;
        this.peak = 0;
        this.sumSquares = 0;
        this.levelCount = 0;
      }
    }
    return true;
  }
}

registerProcessor('capture-processor', CaptureProcessor);
