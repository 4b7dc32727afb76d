// Per-turn latency: from the end of the caller's speech to the first reply
// sample handed to the audio output, all on the AudioContext clock.
//
// The gateway's `input_audio_buffer.speech_stopped.audio_end_ms` says where in
// the input stream the turn ended; like OpenAI's, it includes the
// `silence_duration_ms` the VAD waited for, so the caller actually stopped
// talking at `audio_end_ms - silence_duration_ms`. `CaptureClock` maps that
// stream position back to the moment the capture worklet recorded it, so the
// figure includes everything the caller experiences: the VAD's wait, the
// network both ways, recognition, the reply's synthesis and our jitter buffer.
// With push-to-talk (turn detection off) the turn ends when "Commit" is pressed.
// Semantic VAD waits as long as its turn model says, so the page cannot know
// the silence from the session: the turn's end is placed at `audio_end_ms` and
// moved back by the wait the gateway reports in `turn.latency` (its
// `turn_detection` and `turn_model` stages) when that arrives.
//
// A gateway that supports it also reports its own side of each reply
// (`turn.latency`: turn detection, the engine's stages, the rest). That is kept
// next to the page's figure, not mixed into it: the page's figure is what the
// caller lives through, the gateway's says where the server's share went.

export class CaptureClock {
  constructor() {
    this.reset();
  }

  reset() {
    this.sentMs = 0; // input audio sent in this session, in ms of audio
    this.marks = []; // {endMs, time}: stream position -> capture time
  }

  /** A frame of `ms` audio whose last sample was captured at `time` was sent. */
  sent(ms, time) {
    this.sentMs += ms;
    this.marks.push({ endMs: this.sentMs, time });
    if (this.marks.length > 3000) this.marks.splice(0, 1000); // a minute of 20 ms frames
  }

  /** Capture time of stream position `ms`, or null if we no longer know it. */
  timeOf(ms) {
    const marks = this.marks;
    if (marks.length === 0 || ms < marks[0].endMs - 1000) return null;
    let lo = 0;
    let hi = marks.length - 1;
    if (ms >= marks[hi].endMs) return marks[hi].time - (marks[hi].endMs - ms) / 1000;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (marks[mid].endMs < ms) lo = mid + 1;
      else hi = mid;
    }
    return marks[lo].time - (marks[lo].endMs - ms) / 1000;
  }
}

/** Turns and their timings; calls `onTurn(turn)` whenever one completes. */
export class LatencyTracker {
  constructor(onTurn) {
    this.onTurn = onTurn;
    this.turns = []; // completed, newest last
    this.open = []; // turns waiting for their reply audio
    this.byResponse = new Map();
    // Breakdowns that came before the page matched their reply to a turn.
    this.unclaimed = new Map();
    this.count = 0;
  }

  /**
   * The caller's turn ended at `speechEnd`; the client learned it at `now` (seconds).
   * `waitKnown` false: `speechEnd` still includes the end-of-turn wait, which the
   * gateway's breakdown will say.
   */
  turnEnded(speechEnd, now, how, { waitKnown = true } = {}) {
    this.open.push({ id: ++this.count, speechEnd, endedAt: now, how, waitKnown });
    // A turn that never got an answer must not steal the next turn's reply.
    while (this.open.length > 4) this.open.shift();
  }

  responseCreated(responseId, now) {
    const turn = this.open.find((t) => !t.responseId && now - t.endedAt < 60);
    if (!turn) return;
    turn.responseId = responseId;
    this.byResponse.set(responseId, turn);
    const server = this.unclaimed.get(responseId);
    if (server) {
      this.unclaimed.delete(responseId);
      adopt(turn, server);
    }
  }

  /**
   * The gateway's own account of a reply's latency (the `turn.latency`
   * extension event): `{totalMs, stages: [{name, ms}]}`. Returns the turn if it
   * has already completed (its row needs redrawing), else null.
   */
  serverBreakdown(responseId, event) {
    const stages = (Array.isArray(event.stages) ? event.stages : [])
      .filter((s) => s && typeof s.name === 'string' && Number.isFinite(Number(s.ms)))
      .map((s) => ({ name: s.name, ms: Math.max(0, Number(s.ms)) }));
    if (!responseId || stages.length === 0) return null;
    const total = Number(event.total_ms);
    const server = { totalMs: Number.isFinite(total) ? total : stages.reduce((sum, s) => sum + s.ms, 0), stages };
    const open = this.byResponse.get(responseId);
    if (open) {
      adopt(open, server);
      return null;
    }
    const done = this.turns.find((t) => t.responseId === responseId);
    if (done) {
      adopt(done, server);
      if (done.playedAt !== undefined) measure(done);
      return done;
    }
    this.unclaimed.set(responseId, server);
    while (this.unclaimed.size > 8) this.unclaimed.delete(this.unclaimed.keys().next().value);
    return null;
  }

  firstAudio(responseId, now) {
    const turn = this.byResponse.get(responseId);
    if (turn && turn.firstAudioAt === undefined) turn.firstAudioAt = now;
  }

  /** The first sample of `responseId`'s audio reached the output at `time`. */
  playbackStarted(responseId, time) {
    const turn = this.byResponse.get(responseId);
    if (!turn || turn.playedAt !== undefined) return null;
    turn.playedAt = time;
    this.byResponse.delete(responseId);
    this.open = this.open.filter((t) => t !== turn);
    measure(turn);
    this.turns.push(turn);
    if (this.turns.length > 50) this.turns.shift();
    this.onTurn(turn);
    return turn;
  }

  /**
   * `responseId` only called a function: the reply that speaks its result answers
   * the same turn, so the turn waits for the next reply (the time the function
   * took is part of what the caller waits).
   */
  handOver(responseId) {
    const turn = this.byResponse.get(responseId);
    if (!turn || turn.playedAt !== undefined) return;
    this.byResponse.delete(responseId);
    delete turn.responseId;
    delete turn.server;
    delete turn.firstAudioAt;
  }

  /** A reply that was cancelled before any audio played has no latency to show. */
  responseEnded(responseId) {
    const turn = this.byResponse.get(responseId);
    if (turn && turn.playedAt === undefined) {
      this.byResponse.delete(responseId);
      this.open = this.open.filter((t) => t !== turn);
    }
  }

  median() {
    if (this.turns.length === 0) return null;
    const sorted = this.turns.map((t) => t.totalMs).sort((a, b) => a - b);
    return sorted[Math.floor(sorted.length / 2)];
  }

  reset() {
    this.open = [];
    this.byResponse.clear();
    this.unclaimed.clear();
  }
}

/** Keep the gateway's breakdown; a turn whose wait was unknown moves back by the wait it reports. */
function adopt(turn, server) {
  turn.server = server;
  if (turn.waitKnown !== false) return;
  const waited = server.stages
    .filter((s) => s.name === 'turn_detection' || s.name === 'turn_model')
    .reduce((sum, s) => sum + s.ms, 0);
  turn.speechEnd -= waited / 1000;
  turn.waitKnown = true;
}

/** The turn's total and where it went: waiting for end-of-turn, the gateway + engine, our buffer. */
function measure(turn) {
  const time = turn.playedAt;
  const arrival = turn.firstAudioAt ?? time;
  turn.totalMs = Math.max(0, Math.round((time - turn.speechEnd) * 1000));
  turn.parts = {
    endpointMs: Math.max(0, Math.round((turn.endedAt - turn.speechEnd) * 1000)),
    serverMs: Math.max(0, Math.round((arrival - turn.endedAt) * 1000)),
    bufferMs: Math.max(0, Math.round((time - arrival) * 1000)),
  };
}
