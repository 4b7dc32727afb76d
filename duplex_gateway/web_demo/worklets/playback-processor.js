// Reply audio -> speakers, with a jitter buffer and an exact count of what played.
//
// Why a worklet: the only place that knows which sample reached the audio
// device is the render callback. Barge-in needs that number (the gateway cuts
// the assistant's transcript at `audio_end_ms`), so this processor counts, per
// conversation item, the samples it actually rendered, and reports it at once
// when the page flushes it.
//
// Why a jitter buffer: reply audio arrives in bursts over TCP. Starting
// playback at the first chunk would underrun at the first late chunk and
// stutter. We wait until `target` ms are queued (the page sizes the target
// from observed arrival gaps) or the item's audio is complete, and fall back
// to buffering if the queue runs dry mid-reply (counted as an underrun).
//
// Why pause: a gateway that holds a reply while it judges the caller's speech
// over it (`overlap.decision` `pause`) may resume it (a backchannel). Paused,
// the processor renders silence and keeps every queued sample where it was, so
// a resume goes on from the very next sample: nothing lost, nothing repeated.
// A flush (barge-in) ends a pause.

import { StreamResampler } from '../lib/resampler.js';

const PROGRESS_EVERY_S = 0.1;

class PlaybackProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = options.processorOptions || {};
    this.streamRate = opts.rate || 24000;
    this.resampler = new StreamResampler(this.streamRate, sampleRate);
    this.targetSamples = Math.round(((opts.targetMs || 120) * sampleRate) / 1000);
    this.queue = []; // segments {samples, offset, item}
    this.buffered = 0; // samples queued, at the context rate
    this.items = new Map(); // itemId -> {itemId, responseId, played, pending, ended, started}
    this.playing = false;
    this.paused = false;
    this.samplesPlayed = 0;
    this.underruns = 0;
    this.lastProgress = 0;
    this.port.onmessage = (event) => this.onMessage(event.data);
  }

  item(itemId, responseId) {
    let item = this.items.get(itemId);
    if (!item) {
      item = { itemId, responseId, played: 0, pending: 0, ended: false, started: false };
      this.items.set(itemId, item);
    }
    return item;
  }

  enqueue(item, samples) {
    if (samples.length === 0) return;
    this.queue.push({ samples, offset: 0, item });
    this.buffered += samples.length;
    item.pending += samples.length;
  }

  onMessage(msg) {
    switch (msg.type) {
      case 'format':
        if (msg.rate !== this.streamRate) {
          this.streamRate = msg.rate;
          this.resampler = new StreamResampler(this.streamRate, sampleRate);
        }
        break;
      case 'target':
        this.targetSamples = Math.round((msg.ms * sampleRate) / 1000);
        break;
      case 'push': {
        const item = this.item(msg.itemId, msg.responseId);
        if (item.ended) break; // late audio for an item we already closed
        this.enqueue(item, this.resampler.process(msg.samples));
        break;
      }
      case 'end': {
        const item = this.items.get(msg.itemId);
        if (!item || item.ended) break;
        // The resampler holds a few ms of look-ahead; push it out so the reply's last syllable plays.
        this.enqueue(item, this.resampler.flush());
        item.ended = true;
        if (item.pending === 0) this.finish(item, 'drained');
        break;
      }
      case 'flush':
        this.flush(msg.reason);
        break;
      case 'pause':
        if (!this.paused) {
          this.paused = true;
          this.report('paused', msg.responseId);
        }
        break;
      case 'resume':
        if (this.paused) {
          this.paused = false;
          this.report('resumed', msg.responseId);
        }
        break;
      default:
        break;
    }
  }

  /** A pause or resume took effect: what had played by then, and what waits (context-rate samples). */
  report(type, responseId) {
    this.port.postMessage({
      type,
      responseId,
      samplesPlayed: this.samplesPlayed,
      bufferedSamples: this.buffered,
      time: currentTime,
      sampleRate,
    });
  }

  /** Report an item's final count and forget it. */
  finish(item, how) {
    this.items.delete(item.itemId);
    this.port.postMessage({
      type: how,
      itemId: item.itemId,
      responseId: item.responseId,
      playedSamples: item.played,
      sampleRate,
    });
  }

  flush(reason) {
    const items = [...this.items.values()].map((item) => ({
      itemId: item.itemId,
      responseId: item.responseId,
      playedSamples: item.played,
      started: item.started,
    }));
    const dropped = this.buffered;
    this.queue = [];
    this.buffered = 0;
    this.items.clear();
    this.playing = false;
    // Cut off is cut off: the next reply must not wait for a resume that will never come.
    this.paused = false;
    this.resampler.reset();
    this.port.postMessage({ type: 'flushed', reason, items, droppedSamples: dropped, sampleRate });
  }

  process(inputs, outputs) {
    const output = outputs[0];
    const out = output[0];
    const frames = out.length;
    if (!this.paused && !this.playing && this.queue.length > 0) {
      const last = this.queue[this.queue.length - 1].item;
      // Start once the cushion is there, or when nothing more is coming for this item.
      if (this.buffered >= this.targetSamples || last.ended) this.playing = true;
    }
    let written = 0;
    while (this.playing && !this.paused && written < frames) {
      const seg = this.queue[0];
      if (!seg) {
        // Ran dry mid-reply: rebuffer rather than play a stuttering trickle.
        this.playing = false;
        this.underruns++;
        this.port.postMessage({ type: 'underrun', underruns: this.underruns });
        break;
      }
      const item = seg.item;
      if (!item.started) {
        item.started = true;
        this.port.postMessage({
          type: 'started',
          itemId: item.itemId,
          responseId: item.responseId,
          time: currentTime + written / sampleRate,
        });
      }
      const n = Math.min(frames - written, seg.samples.length - seg.offset);
      out.set(seg.samples.subarray(seg.offset, seg.offset + n), written);
      seg.offset += n;
      written += n;
      item.played += n;
      item.pending -= n;
      this.buffered -= n;
      this.samplesPlayed += n;
      if (seg.offset === seg.samples.length) {
        this.queue.shift();
        if (item.ended && item.pending === 0) {
          this.finish(item, 'drained');
          // A finished reply ends the run; the next one buffers afresh.
          if (this.queue.length === 0) this.playing = false;
        }
      }
    }
    if (written < frames) out.fill(0, written);
    for (let c = 1; c < output.length; c++) output[c].set(out);

    if (currentTime - this.lastProgress >= PROGRESS_EVERY_S) {
      this.lastProgress = currentTime;
      this.port.postMessage({
        type: 'progress',
        samplesPlayed: this.samplesPlayed,
        bufferedMs: (this.buffered * 1000) / sampleRate,
        playing: this.playing,
        paused: this.paused,
        sampleRate,
      });
    }
    return true;
  }
}

registerProcessor('playback-processor', PlaybackProcessor);
