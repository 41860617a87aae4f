// specedge's chat page: streams answers from /v1/chat/completions of the server that serves it,
// colouring each piece of text by where its tokens came from (drafted and accepted by the target,
// or the target's own) and showing the decoding's figures as they come. No dependencies.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { model: null, history: [], busy: false, abort: null, key: sessionStorage.getItem("specedge-key") || "" };

function headers() {
  const h = { "Content-Type": "application/json" };
  if (state.key) h.Authorization = `Bearer ${state.key}`;
  return h;
}

function say(text) { $("status").textContent = text; }

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = `message ${role}`;
  if (text) div.textContent = text;
  $("log").appendChild(div);
  follow();
  return div;
}

function follow() { $("log").scrollTop = $("log").scrollHeight; }

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
  $("model").textContent = `${card.id} · target ${info.target}` +
    (info.draft ? ` · draft ${info.draft}` : "") + ` · drafter ${info.drafter}`;
  $("device").textContent = info.device || "";
  $("prompt").disabled = false;
  $("send").disabled = false;
  say("");
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
  $("send").disabled = false;
  $("stop").disabled = true;
  $("prompt").focus();
}

async function send(text) {
  state.history.push({ role: "user", content: text });
  addMessage("user", text);
  const answer = addMessage("assistant", "");
  begin();
  state.abort = new AbortController();
  const body = { model: state.model, messages: state.history, stream: true, specedge: { show_draft: true } };
  let reply = "", tokens = 0, first = 0;
  try {
    const response = await fetch("/v1/chat/completions",
      { method: "POST", headers: headers(), body: JSON.stringify(body), signal: state.abort.signal });
    if (response.status === 401) {
      state.history.pop();
      answer.remove();
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
        const thought = delta.reasoning_content;  // a thinking model's reasoning: shown dimmed
        const piece = thought || delta.content;
        if (piece) {
          const span = document.createElement("span");
          span.className = thought ? "reasoning" : event.specedge && event.specedge.drafted ? "drafted" : "own";
          span.textContent = piece;
          answer.appendChild(span);
          follow();
          if (!thought) reply += piece;
          const origin = event.specedge || {};
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
          say(`${s.stop_reason === "eos" ? "done" : `stopped: ${s.stop_reason}`} · ${tokens} tokens` +
              ` · ${s.drafted} drafted, ${s.accepted} accepted · ${s.target_calls} target passes`);
        }
      }
    }
    state.history.push({ role: "assistant", content: reply });
  } catch (e) {
    if (e.name === "AbortError") {
      say("stopped");
      state.history.push({ role: "assistant", content: reply });
    } else {
      addMessage("error", e.message);
      state.history.pop();
      say("");
    }
  } finally {
    end();
  }
}

document.addEventListener("DOMContentLoaded", () => {
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
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      $("ask").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => state.abort && state.abort.abort());
  $("clear").addEventListener("click", () => {
    if (state.abort) state.abort.abort();
    state.history = [];
    $("log").textContent = "";
    say("");
  });
  connect();
});
