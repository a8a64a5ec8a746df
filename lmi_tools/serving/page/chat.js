// The chat page of lmi serve: no build step, no dependencies, nothing loaded from elsewhere.
// Answers stream from /v1/chat/completions (server-sent events); Stop aborts the request, and the server
// cancels the sequence when the connection closes. Conversations live in this browser's localStorage.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE_KEY = "lmi-chat-conversations";
let conversations = JSON.parse(localStorage.getItem(STORE_KEY) || "[]");
let current = null;
let controller = null;
let models = {};

function save() {
  localStorage.setItem(STORE_KEY, JSON.stringify(conversations));
}

// --- Markdown: escape everything first, then fenced code, inline code, bold, italics, paragraphs ---------

function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function inline(html) {
  return html.replace(/`([^`]+)`/g, "<code>$1</code>")
    .replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|[^*])\*([^*\s][^*]*)\*/g, "$1<em>$2</em>");
}

function renderMarkdown(text) {
  // Odd parts are code: a fence still open while the answer streams renders as code already.
  return text.split("```").map((part, i) => {
    if (i % 2 === 1) {
      const newline = part.indexOf("\n");
      const code = newline >= 0 ? part.slice(newline + 1) : part;
      return `<pre><code>${escapeHtml(code)}</code></pre>`;
    }
    return escapeHtml(part).split(/\n{2,}/).filter((p) => p.trim())
      .map((p) => `<p>${inline(p).replace(/\n/g, "<br>")}</p>`).join("");
  }).join("");
}

// --- conversations -----------------------------------------------------------------------------------

function newConversation() {
  current = { id: Date.now(), title: "New chat", messages: [] };
  conversations.unshift(current);
  dropEmptyConversations();
  save();
  renderAll();
}

// Only the current conversation may be empty: "+ New chat" clicked twice, or a new chat left for another one,
// leaves nothing behind.
function dropEmptyConversations() {
  conversations = conversations.filter((conversation) => conversation.messages.length || conversation === current);
}

function renderSidebar() {
  const list = $("conversations");
  list.replaceChildren();
  for (const conversation of conversations) {
    const item = document.createElement("li");
    item.textContent = conversation.title;
    item.className = conversation === current ? "current" : "";
    item.onclick = () => {
      current = conversation;
      dropEmptyConversations();
      save();
      renderAll();
      $("sidebar").classList.remove("open");
    };
    list.append(item);
  }
}

function statsText(message) {
  if (message.ttft_ms === undefined) return message.stopped ? "stopped" : "";
  const parts = [`TTFT ${Math.round(message.ttft_ms)} ms`, `${message.tokens_per_s.toFixed(1)} tokens/s`,
    `${message.tokens} tokens`, message.model];
  return parts.join(" · ") + (message.stopped ? " · stopped" : "");
}

function renderMessage(message) {
  const view = document.createElement("div");
  view.className = `message ${message.error ? "error" : message.role}`;
  const body = document.createElement("div");
  body.className = "content";
  if (message.role === "assistant") body.innerHTML = renderMarkdown(message.content || "");
  else body.textContent = message.content;
  for (const call of message.tool_calls || []) {  // a tool call is shown as one, not as text
    const block = document.createElement("div");
    block.className = "tool-call";
    block.textContent = `tool call: ${call.function.name}(${call.function.arguments})`;
    body.append(block);
  }
  if (message.error) body.textContent = message.content ? `${message.content}\n\n${message.error}` : message.error;
  const stats = document.createElement("div");
  stats.className = "stats";
  stats.textContent = statsText(message);
  view.append(body, stats);
  return view;
}

function renderAll() {
  renderSidebar();
  const view = $("messages");
  view.replaceChildren(...current.messages.map(renderMessage));
  view.scrollTop = view.scrollHeight;
}

// --- the model menu ------------------------------------------------------------------------------------

async function refreshModels() {
  const response = await fetch("/ui/models");
  const listing = await response.json();
  const select = $("model");
  const chosen = select.value;
  models = Object.fromEntries(listing.models.map((m) => [m.name, m.status]));
  const label = (m) => (m.parent ? `${m.parent} + adapter ${m.name}` : m.name) + ` (${m.status})`;
  select.replaceChildren(...listing.models.map((m) => new Option(label(m), m.name)));
  const ready = listing.models.find((m) => m.status === "READY");
  select.value = chosen && chosen in models ? chosen : (ready || listing.models[0] || {}).name || "";
  showStatus();
}

function showStatus() {
  const status = models[$("model").value] || "UNLOADED";
  const label = { READY: "Available", PENDING: "Loading...", FAILED: "Failed", UNLOADED: "Not loaded" }[status];
  $("model-status").textContent = label;
  $("model-status").className = `status ${status}`;
  $("activate").disabled = status === "READY" || status === "PENDING";
}

async function activate() {
  const name = $("model").value;
  $("model-status").textContent = "Loading...";
  $("activate").disabled = true;
  const response = await fetch(`/ui/models/${encodeURIComponent(name)}/activate`, { method: "POST" });
  if (!response.ok) {
    const error = await response.json().catch(() => ({}));
    $("model-status").textContent = error.message || `HTTP ${response.status}`;
    return;
  }
  // Reloading a model into accelerator memory takes a while: follow its status until it settles.
  while (true) {
    await refreshModels();
    if (models[name] !== "PENDING") break;
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

// --- sending -------------------------------------------------------------------------------------------

async function* sseData(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  while (true) {
    const { done, value } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

function turn(message) {
  if (!message.tool_calls) return { role: message.role, content: message.content };
  return { role: message.role, content: message.content || null, tool_calls: message.tool_calls };
}

function requestBody(model) {
  const stop = $("stop").value.split("\n").filter((s) => s);
  const body = {
    model, stream: true, stream_options: { include_usage: true },
    messages: current.messages.filter((m) => !m.error && (m.content || m.tool_calls)).map(turn),
    max_tokens: Number($("max-tokens").value), temperature: Number($("temperature").value),
    top_p: Number($("top-p").value),
  };
  if (stop.length) body.stop = stop;
  if ($("json-mode").checked) body.response_format = { type: "json_object" };
  const tools = $("tools").value.trim();
  if (tools) {
    try {
      body.tools = JSON.parse(tools);
    } catch (error) {
      throw new Error(`Tools: not valid JSON (${error.message})`);
    }
    body.tool_choice = $("tool-choice").value;
  }
  return body;
}

function addToolCallDeltas(answer, deltas) {
  // OpenAI's stream: a call's id and name come first, its arguments in pieces after, all by index.
  answer.tool_calls = answer.tool_calls || [];
  for (const delta of deltas) {
    const call = answer.tool_calls[delta.index] ||
      (answer.tool_calls[delta.index] = { id: delta.id, type: "function", function: { name: "", arguments: "" } });
    if (delta.function && delta.function.name) call.function.name += delta.function.name;
    if (delta.function && delta.function.arguments) call.function.arguments += delta.function.arguments;
  }
}

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop-button").hidden = !busy;
}

async function send(text) {
  const model = $("model").value;
  current.messages.push({ role: "user", content: text });
  if (current.title === "New chat") current.title = text.slice(0, 40);
  let body;
  try {
    body = requestBody(model);
  } catch (error) {
    current.messages.push({ role: "assistant", content: "", error: error.message });
    renderAll();
    return;
  }
  const answer = { role: "assistant", content: "", model };
  current.messages.push(answer);
  renderAll();
  controller = new AbortController();
  setBusy(true);
  const began = performance.now();
  let first = null;
  let pieces = 0;
  let usage = null;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!response.ok) {
      const error = await response.json().catch(() => ({}));
      throw new Error((error.error && error.error.message) || error.message || `HTTP ${response.status}`);
    }
    for await (const data of sseData(response)) {
      if (data.error) throw new Error(data.error.message || String(data.error));
      if (data.usage) usage = data.usage;
      const change = data.choices && data.choices[0] && data.choices[0].delta;
      if (change && change.tool_calls) {
        if (first === null) first = performance.now();
        addToolCallDeltas(answer, change.tool_calls);
        $("messages").lastElementChild.replaceWith(renderMessage(answer));
        continue;
      }
      const delta = change && change.content;
      if (!delta) continue;
      if (first === null) first = performance.now();
      pieces += 1;
      answer.content += delta;
      $("messages").lastElementChild.querySelector(".content").innerHTML = renderMarkdown(answer.content);
      $("messages").scrollTop = $("messages").scrollHeight;
    }
  } catch (error) {
    if (error.name === "AbortError") answer.stopped = true;
    else answer.error = error.message;
  } finally {
    const ended = performance.now();
    if (first !== null) {
      answer.tokens = usage ? usage.completion_tokens : pieces;
      answer.ttft_ms = first - began;
      answer.tokens_per_s = answer.tokens / Math.max((ended - began) / 1000, 1e-3);
    }
    controller = null;
    setBusy(false);
    save();
    renderAll();
  }
}

// --- wiring --------------------------------------------------------------------------------------------

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || controller) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop-button").onclick = () => controller && controller.abort();
$("new-chat").onclick = newConversation;
$("toggle-sidebar").onclick = () => $("sidebar").classList.toggle("open");
$("model").onchange = showStatus;
$("activate").onclick = activate;

current = conversations[0];
if (current) renderAll(); else newConversation();
refreshModels().then(() => {
  if (Object.values(models).includes("PENDING")) activatePoll();
});

async function activatePoll() {
  while (Object.values(models).includes("PENDING")) {
    await new Promise((resolve) => setTimeout(resolve, 1000));
    await refreshModels();
  }
}
