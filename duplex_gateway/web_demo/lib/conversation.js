// The conversation as the caller sees it: one bubble per conversation item.
//
// Caller bubbles show partial transcripts while the caller talks (greyed,
// replaced as the recognizer revises itself) and the final transcript once the
// turn is over. Assistant bubbles grow with the reply's transcript deltas and
// are marked when a barge-in cut them short. A function call the model makes is
// a row of its own (name, arguments, then the page's result). Server text only
// ever goes in via textContent, never innerHTML.

export class ConversationView {
  constructor(list, emptyHint) {
    this.list = list;
    this.emptyHint = emptyHint;
    this.entries = new Map();
  }

  ensure(itemId, role) {
    let entry = this.entries.get(itemId);
    if (entry) return entry;
    const li = document.createElement('li');
    li.className = `msg ${role === 'user' ? 'user' : 'assistant'}`;
    li.dataset.itemId = itemId;
    li.setAttribute('aria-busy', 'true');
    const who = document.createElement('span');
    who.className = 'who';
    who.textContent = role === 'user' ? 'You' : 'Assistant';
    const text = document.createElement('p');
    text.className = 'text';
    const meta = document.createElement('span');
    meta.className = 'meta';
    li.append(who, text, meta);
    entry = { li, text, meta, role, value: '', final: false, at: new Date().toISOString() };
    this.entries.set(itemId, entry);
    this.append(li);
    return entry;
  }

  append(node) {
    const nearBottom = this.list.scrollHeight - this.list.scrollTop - this.list.clientHeight < 80;
    this.list.append(node);
    if (this.emptyHint) this.emptyHint.hidden = true;
    if (nearBottom) this.list.scrollTop = this.list.scrollHeight;
  }

  render(entry) {
    entry.text.textContent = entry.value;
    entry.li.classList.toggle('partial', !entry.final);
    // Screen readers announce the bubble once it is final, not every partial hypothesis.
    entry.li.setAttribute('aria-busy', String(!entry.final));
    const nearBottom = this.list.scrollHeight - this.list.scrollTop - this.list.clientHeight < 80;
    if (nearBottom) this.list.scrollTop = this.list.scrollHeight;
  }

  /**
   * A function call the model made: its own row, "🔧 name(arguments)", with the
   * arguments growing as they stream in and the page's result under it once sent.
   * The "Tool call" label says what it is; the emoji is decoration only.
   */
  toolCall(itemId, { name, callId, args } = {}) {
    let entry = this.entries.get(itemId);
    if (!entry) {
      const li = document.createElement('li');
      li.className = 'msg tool partial';
      li.dataset.itemId = itemId;
      li.setAttribute('aria-busy', 'true');
      const who = document.createElement('span');
      who.className = 'who';
      who.textContent = 'Tool call';
      const text = document.createElement('p');
      text.className = 'text call';
      const icon = document.createElement('span');
      icon.className = 'icon';
      icon.setAttribute('aria-hidden', 'true');
      icon.textContent = '🔧';
      const code = document.createElement('code');
      text.append(icon, code);
      const result = document.createElement('p');
      result.className = 'result';
      result.hidden = true;
      const label = document.createElement('span');
      label.className = 'label';
      label.textContent = 'Result: ';
      const output = document.createElement('code');
      result.append(label, output);
      const meta = document.createElement('span');
      meta.className = 'meta';
      li.append(who, text, result, meta);
      entry = {
        li, text, code, result, output, meta, role: 'tool', value: '', final: false, at: new Date().toISOString(),
        name: '', callId: null, args: '', out: null,
      };
      this.entries.set(itemId, entry);
      this.append(li);
    }
    if (name) entry.name = name;
    if (callId) entry.callId = callId;
    if (typeof args === 'string' && args && !entry.args) entry.args = args;
    this.renderCall(entry);
    return entry;
  }

  renderCall(entry) {
    entry.value = `${entry.name || 'function'}(${entry.args})`;
    entry.code.textContent = entry.value;
    entry.li.classList.toggle('partial', !entry.final);
    entry.li.setAttribute('aria-busy', String(!entry.final));
    if (entry.out !== null) {
      entry.output.textContent = entry.out;
      entry.result.hidden = false;
    }
    const nearBottom = this.list.scrollHeight - this.list.scrollTop - this.list.clientHeight < 80;
    if (nearBottom) this.list.scrollTop = this.list.scrollHeight;
  }

  /** A piece of the call's JSON arguments (response.function_call_arguments.delta). */
  toolArgsDelta(itemId, delta) {
    const entry = this.toolCall(itemId);
    if (entry.final || !delta) return;
    entry.args += delta;
    this.renderCall(entry);
  }

  /** The call's whole arguments: they replace what the deltas built. */
  toolArgsDone(itemId, { name, callId, args } = {}) {
    const entry = this.toolCall(itemId, { name, callId });
    if (typeof args === 'string') entry.args = args;
    entry.final = true;
    entry.meta.textContent = 'running…';
    this.renderCall(entry);
  }

  /** What the page sent back as the function's output. */
  toolResult(itemId, output) {
    const entry = this.entries.get(itemId);
    if (!entry || entry.role !== 'tool') return;
    entry.final = true;
    entry.out = output;
    entry.meta.textContent = '';
    this.renderCall(entry);
  }

  /** The call was not run (its reply was cancelled before the call was complete). */
  toolNotRun(itemId, why) {
    const entry = this.entries.get(itemId);
    if (!entry || entry.role !== 'tool' || entry.out !== null) return;
    entry.final = true;
    entry.li.classList.add('interrupted');
    entry.meta.textContent = why;
    this.renderCall(entry);
  }

  /** The caller started a turn: an empty bubble that shows we are listening. */
  callerSpeaking(itemId) {
    const entry = this.ensure(itemId, 'user');
    if (!entry.final && !entry.value) entry.li.classList.add('listening', 'partial');
  }

  /**
   * A piece of the caller's partial transcript, appended as the Realtime
   * protocol defines deltas. The final transcript replaces it all, since a
   * recognizer may still correct words it had settled on.
   */
  callerPartial(itemId, delta) {
    const entry = this.ensure(itemId, 'user');
    if (entry.final || !delta) return;
    entry.li.classList.remove('listening');
    entry.value += delta;
    this.render(entry);
  }

  /**
   * The turn ended. Until a transcript arrives (some engines never send one)
   * the bubble says how long the caller spoke instead of "listening…".
   */
  callerStopped(itemId, spokenMs, what = 'speech') {
    const entry = this.entries.get(itemId);
    if (!entry || entry.final) return;
    entry.li.classList.remove('listening');
    if (!entry.value && spokenMs > 0) entry.meta.textContent = `${(spokenMs / 1000).toFixed(1)} s of ${what}`;
  }

  callerFinal(itemId, transcript) {
    const entry = this.ensure(itemId, 'user');
    entry.li.classList.remove('listening');
    entry.final = true;
    entry.value = (transcript || '').trim();
    entry.meta.textContent = entry.value ? '' : 'nothing recognised';
    this.render(entry);
  }

  assistantDelta(itemId, delta) {
    const entry = this.ensure(itemId, 'assistant');
    if (entry.heard !== undefined) return; // cut off: only what was heard stays
    entry.value += delta;
    this.render(entry);
  }

  assistantDone(itemId, text) {
    const entry = this.ensure(itemId, 'assistant');
    if (entry.heard !== undefined) return; // the gateway's kept transcript decides (see heard())
    if (typeof text === 'string' && text) entry.value = text;
    entry.final = true;
    this.render(entry);
  }

  /**
   * The caller said something short over this reply ("mm-hm") and the gateway, after holding
   * the reply to judge it, let it go on: a mark on the bubble, counted if it happens again.
   */
  resumed(itemId) {
    const entry = this.entries.get(itemId);
    if (!entry || entry.role !== 'assistant' || entry.li.classList.contains('interrupted')) return;
    entry.resumes = (entry.resumes ?? 0) + 1;
    entry.li.classList.add('resumed');
    entry.meta.textContent =
      entry.resumes === 1 ? 'paused for your backchannel, resumed' : `paused for your backchannels, resumed ×${entry.resumes}`;
  }

  /** The caller heard only `ms` of this reply. */
  interrupted(itemId, ms) {
    const entry = this.entries.get(itemId);
    if (!entry) return;
    entry.final = true;
    entry.heardMs = ms;
    entry.li.classList.add('interrupted');
    entry.meta.textContent = `interrupted after ${(ms / 1000).toFixed(1)} s`;
    this.render(entry);
  }

  /**
   * The words of a cut-off reply the caller actually heard, as the gateway kept
   * them after conversation.item.truncated: they replace the full text.
   */
  heard(itemId, transcript) {
    const entry = this.entries.get(itemId);
    if (!entry || !entry.li.classList.contains('interrupted')) return;
    entry.heard = (transcript || '').trim();
    entry.value = entry.heard;
    entry.final = true;
    const after = `interrupted after ${((entry.heardMs ?? 0) / 1000).toFixed(1)} s`;
    entry.meta.textContent = entry.value ? after : `${after}, before any words were heard`;
    this.render(entry);
  }

  /**
   * A turn that will get no more events (mode switch, disconnect): an empty
   * "listening…" bubble goes, one with partial words stays, marked as cut off.
   */
  settlePartials() {
    for (const [itemId, entry] of [...this.entries]) {
      if (entry.role !== 'user' || entry.final) continue;
      if (!entry.value) {
        entry.li.remove();
        this.entries.delete(itemId);
        continue;
      }
      entry.final = true;
      entry.li.classList.remove('listening');
      entry.meta.textContent = 'turn cut off';
      this.render(entry);
    }
  }

  get empty() {
    return this.entries.size === 0 && !this.list.querySelector('.divider');
  }

  divider(label) {
    const li = document.createElement('li');
    li.className = 'divider';
    li.setAttribute('role', 'separator');
    li.textContent = label;
    this.append(li);
  }

  /** Remove every bubble and divider (the session's conversation is not touched). */
  clear() {
    this.entries.clear();
    this.list.replaceChildren();
  }

  /** Plain data for tests, debugging and the export; a tool call adds what it was called with and returned. */
  snapshot() {
    return [...this.entries.entries()].map(([itemId, e]) => ({
      itemId,
      role: e.role,
      text: e.value,
      final: e.final,
      interrupted: e.li.classList.contains('interrupted'),
      ...(e.role === 'assistant' ? { resumes: e.resumes ?? 0 } : {}),
      at: e.at,
      ...(e.role === 'tool' ? { name: e.name, call_id: e.callId, arguments: e.args, output: e.out } : {}),
    }));
  }
}
