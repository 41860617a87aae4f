// specedge's chat page: streams answers from /v1/chat/completions of the server that serves it,
// rendering them as Markdown with highlighted code (markdown.js, highlight.js) and colouring each
// character by where its token came from (drafted and accepted by the target, or the target's own),
// with the decoding's figures as they come. Conversations and settings are kept in this browser's
// localStorage (a list: new, switch, delete); nothing leaves this server. No dependencies.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE = { chats: "specedge.chats", current: "specedge.current", settings: "specedge.settings" };
const TITLE_CHARS = 48;
const state = {
  model: null, defaults: {}, busy: false, abort: null, key: sessionStorage.getItem("specedge-key") || "",
  chats: [], current: null, settings: { temperature: "", top_p: "", max_tokens: "", system: "", show_draft: true },
};

function headers() {
  const h = { "Content-Type": "application/json" };
  if (state.key) h.Authorization = `Bearer ${state.key}`;
  return h;
}

function say(text) { $("status").textContent = text; }

// --- storage -------------------------------------------------------------------------------------

function load() {
  try {
    const chats = JSON.parse(localStorage.getItem(STORE.chats) || "[]");
    state.chats = Array.isArray(chats) ? chats.filter((c) => c && c.id && Array.isArray(c.messages)) : [];
    Object.assign(state.settings, JSON.parse(localStorage.getItem(STORE.settings) || "{}"));
  } catch (e) {
    state.chats = [];  // unreadable: start afresh (the stored value stays until a save replaces it)
  }
  const current = localStorage.getItem(STORE.current);
  state.current = state.chats.find((c) => c.id === current) || null;
}

function persist() {
  try {
    localStorage.setItem(STORE.chats, JSON.stringify(state.chats.filter((c) => c.messages.length)));
    if (state.current) localStorage.setItem(STORE.current, state.current.id);
    else localStorage.removeItem(STORE.current);
    localStorage.setItem(STORE.settings, JSON.stringify(state.settings));
  } catch (e) {
    say("this browser's storage is full: delete old conversations to keep new ones");
  }
}

function newChat() {
  const chat = { id: `${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`, title: "New chat",
                 created: Date.now(), updated: Date.now(), messages: [] };
  state.chats.unshift(chat);
  return chat;
}

// --- conversation list ---------------------------------------------------------------------------

function showList() {
  const list = $("chat-list");
  list.replaceChildren();
  for (const chat of state.chats.filter((c) => c.messages.length || c === state.current)) {
    const li = document.createElement("li");
    if (chat === state.current) li.className = "current";
    const open = document.createElement("button");
    open.type = "button";
    open.className = "open";
    open.textContent = chat.title;
    open.title = chat.title;
    open.addEventListener("click", () => switchTo(chat));
    const del = document.createElement("button");
    del.type = "button";
    del.className = "delete";
    del.textContent = "×";
    del.title = "Delete this conversation";
    del.setAttribute("aria-label", `Delete ${chat.title}`);
    del.addEventListener("click", () => {  // the first click arms it, the second deletes
      if (!del.classList.contains("armed")) {
        del.classList.add("armed");
        del.textContent = "Delete?";
        setTimeout(() => { del.classList.remove("armed"); del.textContent = "×"; }, 4000);
        return;
      }
      remove(chat);
    });
    li.append(open, del);
    list.appendChild(li);
  }
}

function stopAnswer() { if (state.abort) state.abort.abort(); }

function switchTo(chat) {
  if (chat === state.current) return;
  stopAnswer();
  state.current = chat;
  persist();
  showList();
  showChat();
}

function remove(chat) {
  if (chat === state.current) stopAnswer();
  state.chats = state.chats.filter((c) => c !== chat);
  if (chat === state.current) state.current = state.chats[0] || null;
  persist();
  showList();
  showChat();
}

// --- messages ------------------------------------------------------------------------------------

function follow() { $("log").scrollTop = $("log").scrollHeight; }

function messageNode(role) {
  const div = document.createElement("div");
  div.className = `message ${role}`;
  $("log").appendChild(div);
  return div;
}

// An answer in its node: the reasoning (dimmed, as written), then the Markdown.
function drawAnswer(node, message) {
  const parts = [];
  if (message.reasoning) {
    const thought = document.createElement("div");
    thought.className = "reasoning";
    thought.textContent = message.reasoning;
    parts.push(thought);
  }
  const body = document.createElement("div");
  body.className = "markdown";
  window.SpecedgeMarkdown.render(message.content || "", body, message.origins, state.settings.show_draft);
  parts.push(body);
  node.replaceChildren(...parts);
}

function showMessage(message) {
  const node = messageNode(message.role);
  if (message.role === "assistant") drawAnswer(node, message);
  else node.textContent = message.content;
  return node;
}

function showChat() {
  $("log").replaceChildren();
  for (const message of state.current ? state.current.messages : []) showMessage(message);
  const last = state.current && state.current.messages[state.current.messages.length - 1];
  say(last && last.status ? last.status : "");
  follow();
}

// --- settings ------------------------------------------------------------------------------------

const FIELDS = { temperature: "temperature", "top-p": "top_p", "max-tokens": "max_tokens", system: "system" };

function showSettings() {
  for (const [id, key] of Object.entries(FIELDS)) $(id).value = state.settings[key] || "";
  $("show-draft").checked = state.settings.show_draft !== false;
}

function showDefaults() {  // the server's defaults (the model's own where it has them), as placeholders
  const d = state.defaults;
  if (d.temperature !== undefined) $("temperature").placeholder = `default ${d.temperature}`;
  if (d.top_p !== undefined) $("top-p").placeholder = `default ${d.top_p}`;
  $("max-tokens").placeholder = "server default";
}

// The request's sampling fields: those set here (numbers), the rest left to the model's defaults.
function sampling() {
  const body = {};
  const number = (key, parse) => {
    const value = String(state.settings[key] || "").trim();
    if (value !== "" && Number.isFinite(parse(value))) body[key] = parse(value);
  };
  number("temperature", parseFloat);
  number("top_p", parseFloat);
  number("max_tokens", (v) => parseInt(v, 10));
  return body;
}

// --- the server ----------------------------------------------------------------------------------

function figure(id, value) { $(id).textContent = value; }

function showFigures(f) {
  if (f.tps !== undefined) figure("tps", f.tps.toFixed(1));
  if (f.acceptance !== undefined) figure("acc", `${Math.round(100 * f.acceptance)}%`);
  if (f.perPass !== undefined) figure("tpp", f.perPass.toFixed(2));
  if (f.bytes !== undefined) figure("bpt", f.bytes >= 1e6 ? `${(f.bytes / 1e6).toFixed(0)} MB` : `${f.bytes} B`);
}

function needKey(message) {
  $("key-row").hidden = false;
  $("key").focus();
  say(message);
}

async function errorOf(response) {
  try {
    const body = await response.json();
    return (body.error && body.error.message) || `HTTP ${response.status}`;
  } catch (e) {
    return `HTTP ${response.status}`;
  }
}

// Waits while the server loads its models (/health answers 503 "loading"), then names the model
// and the device from /v1/models.
async function connect() {
  for (;;) {
    try {
      const health = await fetch("/health");
      if (health.ok) break;
      const body = await health.json().catch(() => ({}));
      say(body.status === "loading" ? "loading the model…" : `the server answers ${health.status}`);
    } catch (e) {
      say("the server does not answer; retrying…");
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
  const models = await fetch("/v1/models", { headers: headers() });
  if (models.status === 401) return needKey("this server asks for an API key");
  if (!models.ok) return say(await errorOf(models));
  const card = (await models.json()).data[0];
  const info = card.specedge || {};
  state.model = card.id;
  state.defaults = info.sampling_defaults || {};
  showDefaults();
  $("model").textContent = `${card.id} · target ${info.target}` +
    (info.draft ? ` · draft ${info.draft}` : "") + ` · drafter ${info.drafter}`;
  $("device").textContent = info.device || "";
  $("prompt").disabled = false;
  $("send").disabled = false;
  if (!state.current || !state.current.messages.length) say("");
  $("prompt").focus();
}

// One server-sent event's JSON (or null for [DONE]).
function* events(buffer) {
  for (const block of buffer) {
    for (const line of block.split("\n")) {
      if (line.startsWith("data: ")) yield line.slice(6) === "[DONE]" ? null : JSON.parse(line.slice(6));
    }
  }
}

function begin() {
  state.busy = true;
  $("send").disabled = true;
  $("stop").disabled = false;
  figure("tps", "–"); figure("acc", "–"); figure("tpp", "–"); figure("bpt", "–");
}

function end() {
  state.busy = false;
  state.abort = null;
  $("send").disabled = !state.model;
  $("stop").disabled = true;
  $("prompt").focus();
}

async function send(text) {
  const chat = state.current || (state.current = newChat());
  if (!chat.messages.length) chat.title = text.replace(/\s+/g, " ").trim().slice(0, TITLE_CHARS);
  chat.messages.push({ role: "user", content: text });
  chat.updated = Date.now();
  state.chats = [chat, ...state.chats.filter((c) => c !== chat)];
  persist();
  showList();
  showMessage(chat.messages[chat.messages.length - 1]);
  const answer = { role: "assistant", content: "", origins: [] };
  const node = messageNode("assistant");
  follow();
  begin();
  state.abort = new AbortController();
  const system = (state.settings.system || "").trim();
  const messages = [...(system ? [{ role: "system", content: system }] : []),
                    ...chat.messages.map((m) => ({ role: m.role, content: m.content }))];
  const body = { model: state.model, messages, stream: true, specedge: { show_draft: true }, ...sampling() };
  let tokens = 0, first = 0, drawn = false;
  const redraw = () => {
    if (drawn) return;
    drawn = true;
    requestAnimationFrame(() => { drawn = false; drawAnswer(node, answer); follow(); });
  };
  try {
    const response = await fetch("/v1/chat/completions",
      { method: "POST", headers: headers(), body: JSON.stringify(body), signal: state.abort.signal });
    if (response.status === 401) {
      chat.messages.pop();
      persist();
      node.remove();
      $("log").lastChild.remove();
      $("prompt").value = text;
      return needKey("this server asks for an API key: enter it and send again");
    }
    if (!response.ok) throw new Error(await errorOf(response));
    say("decoding…");
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let pending = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      pending += decoder.decode(value, { stream: true });
      const blocks = pending.split("\n\n");
      pending = blocks.pop();
      for (const event of events(blocks)) {
        if (event === null) continue;
        if (event.error) throw new Error(event.error.message);
        const choice = event.choices && event.choices[0];
        const delta = (choice && choice.delta) || {};
        const origin = event.specedge || {};
        if (delta.reasoning_content) answer.reasoning = (answer.reasoning || "") + delta.reasoning_content;
        if (delta.content) {
          answer.content += delta.content;
          const drafted = origin.drafted ? 1 : 0;
          const runs = answer.origins;
          if (runs.length && runs[runs.length - 1][1] === drafted) runs[runs.length - 1][0] = answer.content.length;
          else runs.push([answer.content.length, drafted]);
        }
        if (delta.content || delta.reasoning_content) {
          redraw();
          tokens += origin.tokens || 0;
          const now = performance.now();
          if (!first) first = now;
          showFigures({ tps: now > first ? (1000 * (tokens - 1)) / (now - first) : undefined,
                        acceptance: origin.acceptance_rate, perPass: origin.tokens_per_target_pass });
        }
        if (choice && choice.finish_reason && event.specedge) {
          const s = event.specedge;
          showFigures({ tps: s.tokens_per_s, acceptance: s.acceptance_rate, perPass: s.tokens_per_target_pass,
                        bytes: s.bytes_per_token });
          answer.status = `${s.stop_reason === "eos" ? "done" : `stopped: ${s.stop_reason}`} · ${tokens} tokens` +
            ` · ${s.drafted} drafted, ${s.accepted} accepted · ${s.target_calls} target passes`;
          say(answer.status);
        }
      }
    }
    drawAnswer(node, answer);
    chat.messages.push(answer);
  } catch (e) {
    if (e.name === "AbortError") {
      answer.status = "stopped";
      drawAnswer(node, answer);
      chat.messages.push(answer);
      if (chat === state.current) say("stopped");
    } else {
      node.remove();
      const error = messageNode("error");
      error.textContent = e.message;
      if (chat.messages[chat.messages.length - 1].role === "user") chat.messages.pop();
      if (chat === state.current && !$("prompt").value) $("prompt").value = text;
      say("");
    }
  } finally {
    chat.updated = Date.now();
    persist();
    showList();
    end();
  }
}

// --- copying code --------------------------------------------------------------------------------

async function copy(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch (e) {  // no clipboard API here (an http page on another host than localhost): the old way
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "offscreen";
    document.body.appendChild(area);
    area.select();
    const done = document.execCommand("copy");
    area.remove();
    return done;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  load();
  showSettings();
  showList();
  showChat();
  $("key").value = state.key;
  $("key").addEventListener("change", () => {
    state.key = $("key").value.trim();
    sessionStorage.setItem("specedge-key", state.key);
    if (!state.model) connect();
    else say("");
  });
  $("ask").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || state.busy || !state.model) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("ask").requestSubmit();
    }
  });
  $("stop").addEventListener("click", stopAnswer);
  $("new-chat").addEventListener("click", () => {
    stopAnswer();
    state.current = null;
    persist();
    showList();
    showChat();
    $("prompt").focus();
  });
  for (const [id, key] of Object.entries(FIELDS)) {
    $(id).addEventListener("input", () => { state.settings[key] = $(id).value; persist(); });
  }
  $("show-draft").addEventListener("change", () => {
    state.settings.show_draft = $("show-draft").checked;
    persist();
    showChat();
  });
  $("log").addEventListener("click", async (e) => {
    const button = e.target.closest("button.copy");
    if (!button) return;
    const code = button.closest(".code").querySelector("code");
    const copied = await copy(code.dataset.code);
    button.textContent = copied ? "Copied" : "Copy failed";
    setTimeout(() => { button.textContent = "Copy"; }, 1500);
  });
  window.addEventListener("storage", (e) => {  // another tab of this page changed the conversations
    if (e.key !== STORE.chats || state.busy) return;
    const id = state.current && state.current.id;
    load();
    state.current = state.chats.find((c) => c.id === id) || state.current;
    showList();
    showChat();
  });
  connect();
});
