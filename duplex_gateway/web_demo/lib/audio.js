// The page's audio graph: one AudioContext for both directions.
//
// One context means one clock: capture timestamps and playback start times are
// both AudioContext seconds, so turn latency is a plain subtraction with no
// cross-clock mapping. The context runs at the device's native rate; both
// worklets convert to and from the session's wire rates themselves.
//
// Over WebRTC the reply arrives as a media track, already decoded and paced by
// the browser: it joins the same graph in place of the playback worklet, so the
// volume, the speaker picker and the assistant meter work the same either way.

const WORKLETS = ['capture-processor.js', 'playback-processor.js'];

/** The worklets could not be loaded from the server that served the page (a gateway since stopped). */
export class PageServerUnreachable extends Error {
  constructor(origin, cause) {
    super(`could not load the audio worklets from ${origin}`, { cause });
    this.name = 'PageServerUnreachable';
    this.origin = origin;
  }
}

export class AudioIO {
  /**
   * @param {object} handlers
   * @param {(frame: object) => void} handlers.onFrame    encoded mic frame ready
   * @param {(msg: object) => void}   handlers.onPlayback  playback worklet report
   * @param {(track: MediaStreamTrack) => void} [handlers.onMic]  another microphone was opened
   */
  constructor({ onFrame, onPlayback, onMic = () => {} }) {
    this.onFrame = onFrame;
    this.onPlayback = onPlayback;
    this.onMic = onMic;
    this.remote = null; // the reply track's source node (WebRTC)
    this.remoteSink = null; // the muted element that keeps the reply track flowing
    this.ctx = null;
    this.stream = null;
    this.source = null;
    this.capture = null;
    this.playback = null;
    this.pendingFlush = null;
    this.gain = null; // the volume control, between playback and the speakers
    this.analyser = null; // the assistant's level, taken before the volume control
    this.levelBuffer = null;
    this.volume = 1;
    this.sinkId = '';
  }

  get running() {
    return this.ctx !== null;
  }

  /** Must be called from a user gesture (autoplay policy): creates the context synchronously. */
  async start({ deviceId, input, output, targetMs }) {
    if (this.ctx) return;
    const ctx = new AudioContext({ latencyHint: 'interactive' });
    this.ctx = ctx;
    const base = new URL('../worklets/', import.meta.url);
    try {
      await Promise.all(WORKLETS.map((name) => ctx.audioWorklet.addModule(new URL(name, base))));
    } catch (err) {
      // Chrome reports a module it could not fetch as an AbortError, the name it also gives a
      // microphone held by another program: say which it was before the microphone is asked for.
      throw new PageServerUnreachable(base.origin, err);
    }
    // No outputs: the capture node is a sink, so Chrome pulls it without a path to the speakers.
    this.capture = new AudioWorkletNode(ctx, 'capture-processor', {
      numberOfInputs: 1,
      numberOfOutputs: 0,
      channelCount: 1,
      channelCountMode: 'explicit',
      processorOptions: input,
    });
    this.capture.port.onmessage = (event) => this.onFrame(event.data);
    // An exception inside a worklet silently stops that node; make it loud.
    this.capture.onprocessorerror = (event) => console.error('capture worklet failed', event);
    this.playback = new AudioWorkletNode(ctx, 'playback-processor', {
      numberOfInputs: 0,
      numberOfOutputs: 1,
      outputChannelCount: [1],
      processorOptions: { rate: output.rate, targetMs },
    });
    this.playback.port.onmessage = (event) => this.onPlaybackMessage(event.data);
    this.playback.onprocessorerror = (event) => console.error('playback worklet failed', event);
    this.gain = new GainNode(ctx, { gain: this.volume });
    // Before the gain: the meter shows the assistant talking even with the volume turned down.
    // In line rather than a side branch, so it is pulled however the browser schedules analysers.
    this.analyser = new AnalyserNode(ctx, { fftSize: 1024, smoothingTimeConstant: 0 });
    this.levelBuffer = new Float32Array(this.analyser.fftSize);
    this.playback.connect(this.analyser).connect(this.gain).connect(ctx.destination);
    if (this.sinkId) await this.applySink();
    await this.openMic(deviceId);
    if (ctx.state !== 'running') await ctx.resume();
  }

  async openMic(deviceId) {
    const audio = {
      // Ask for the browser's voice processing: without echo cancellation the
      // assistant's own voice from the speakers would barge in on itself.
      echoCancellation: true,
      noiseSuppression: true,
      autoGainControl: true,
      channelCount: 1,
    };
    if (deviceId) audio.deviceId = { exact: deviceId };
    const stream = await navigator.mediaDevices.getUserMedia({ audio });
    this.closeMic();
    this.stream = stream;
    this.source = this.ctx.createMediaStreamSource(stream);
    this.source.connect(this.capture);
    this.onMic(stream.getAudioTracks()[0]);
  }

  /** The microphone's track (what a WebRTC call sends), or null before start. */
  micTrack() {
    return this.stream?.getAudioTracks()[0] ?? null;
  }

  /**
   * Play a WebRTC call's reply track through the page's graph (meter, volume, speaker). Chrome
   * only pulls a remote track into Web Audio while a media element also plays it, so a muted
   * element holds it.
   */
  playRemote(stream) {
    if (!this.ctx) return;
    this.stopRemote();
    this.remoteSink = new Audio();
    this.remoteSink.muted = true;
    this.remoteSink.srcObject = stream;
    void this.remoteSink.play().catch(() => {});
    this.remote = this.ctx.createMediaStreamSource(stream);
    this.remote.connect(this.analyser);
  }

  stopRemote() {
    if (this.remote) this.remote.disconnect();
    if (this.remoteSink) this.remoteSink.srcObject = null;
    this.remote = null;
    this.remoteSink = null;
  }

  closeMic() {
    if (this.source) this.source.disconnect();
    if (this.stream) for (const track of this.stream.getTracks()) track.stop();
    this.source = null;
    this.stream = null;
  }

  /** The label of the microphone in use (for the device picker). */
  currentDeviceId() {
    const track = this.stream?.getAudioTracks()[0];
    return track?.getSettings().deviceId || '';
  }

  async setDevice(deviceId) {
    if (this.ctx) await this.openMic(deviceId);
  }

  /** Playback volume, 0..1 (kept for the next start too). */
  setVolume(value) {
    this.volume = Math.min(1, Math.max(0, Number(value) || 0));
    if (this.gain) this.gain.gain.setTargetAtTime(this.volume, this.ctx.currentTime, 0.01);
  }

  /** Whether this browser can send the page's audio to a chosen output device. */
  static get canPickSpeaker() {
    return typeof AudioContext !== 'undefined' && 'setSinkId' in AudioContext.prototype;
  }

  /** The output device ('' is the system default), now and for the next start. */
  async setSpeaker(sinkId) {
    this.sinkId = sinkId || '';
    if (this.ctx) await this.applySink();
  }

  async applySink() {
    if (!AudioIO.canPickSpeaker || !this.ctx) return;
    await this.ctx.setSinkId(this.sinkId);
  }

  configureCapture(input) {
    this.capture?.port.postMessage({ type: 'configure', ...input });
  }

  setOutputRate(rate) {
    this.playback?.port.postMessage({ type: 'format', rate });
  }

  setTarget(ms) {
    this.playback?.port.postMessage({ type: 'target', ms });
  }

  /** Queue reply audio (Float32 at the session's output rate) for one item. */
  push(itemId, responseId, samples) {
    this.playback?.port.postMessage({ type: 'push', itemId, responseId, samples }, [samples.buffer]);
  }

  /** Nothing more will arrive for this item: let it play out below the jitter target. */
  end(itemId) {
    this.playback?.port.postMessage({ type: 'end', itemId });
  }

  /**
   * Hold playback where it is (the gateway paused the reply to judge the caller's speech over it):
   * silence goes out, every queued sample stays. The worklet answers with a `paused` report.
   */
  pause(responseId) {
    this.playback?.port.postMessage({ type: 'pause', responseId });
  }

  /** Go on from the sample after the last one played before the pause (a `resumed` report). */
  resume(responseId) {
    this.playback?.port.postMessage({ type: 'resume', responseId });
  }

  /** Drop everything queued; resolves with what each item had actually played. */
  flush(reason) {
    if (!this.playback) return Promise.resolve({ items: [], droppedSamples: 0, sampleRate: 1 });
    // Flushes are answered in order; chain them so each caller gets its own answer.
    const previous = this.pendingFlush || Promise.resolve();
    const next = previous.then(
      () =>
        new Promise((resolve) => {
          this.flushResolve = resolve;
          this.playback.port.postMessage({ type: 'flush', reason });
        }),
    );
    this.pendingFlush = next.catch(() => {});
    return next;
  }

  onPlaybackMessage(msg) {
    if (msg.type === 'flushed' && this.flushResolve) {
      const resolve = this.flushResolve;
      this.flushResolve = null;
      resolve(msg);
    }
    this.onPlayback(msg);
  }

  /** RMS of the last ~20 ms of reply audio sent to the speakers (0 when nothing plays). */
  outputLevel() {
    if (!this.analyser) return 0;
    const buf = this.levelBuffer;
    this.analyser.getFloatTimeDomainData(buf);
    let sum = 0;
    for (let i = 0; i < buf.length; i++) sum += buf[i] * buf[i];
    return Math.sqrt(sum / buf.length);
  }

  /** AudioContext seconds now (the clock of every timestamp the worklets report). */
  now() {
    return this.ctx ? this.ctx.currentTime : performance.now() / 1000;
  }

  async stop() {
    this.closeMic();
    this.stopRemote();
    const ctx = this.ctx;
    this.ctx = null;
    this.capture = null;
    this.playback = null;
    this.gain = null;
    this.analyser = null;
    if (this.flushResolve) {
      this.flushResolve({ items: [], droppedSamples: 0, sampleRate: 1 });
      this.flushResolve = null;
    }
    this.pendingFlush = null;
    if (ctx) await ctx.close();
  }
}

/** Speakers for the picker (where the browser can route to them). */
export async function listSpeakers() {
  if (!navigator.mediaDevices?.enumerateDevices) return [];
  const devices = await navigator.mediaDevices.enumerateDevices();
  return devices.filter((d) => d.kind === 'audiooutput');
}

/** Microphones for the picker; labels are empty until the page has mic permission. */
export async function listMicrophones() {
  if (!navigator.mediaDevices?.enumerateDevices) return [];
  const devices = await navigator.mediaDevices.enumerateDevices();
  return devices.filter((d) => d.kind === 'audioinput');
}
