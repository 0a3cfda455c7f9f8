// The chat view: conversations kept in localStorage, streaming from /v1/chat/completions,
// reasoning in a collapsible block, tool calls rendered, a stop button that aborts the fetch
// (the server stops generating when the stream is dropped).
"use strict";

(function () {
  const STORE = "strata.conversations.v1";
  const SETTINGS = "strata.settings.v1";
  const FIELDS = ["temperature", "top_p", "top_k", "min_p", "max_tokens"];
  const $ = (id) => document.getElementById(id);

  let conversations = loadJson(STORE, []);
  let currentId = null;
  let controller = null;
  let renderPending = false;

  function loadJson(key, fallback) {
    try {
      const value = JSON.parse(localStorage.getItem(key) || "null");
      return value === null ? fallback : value;
    } catch (e) {
      return fallback;
    }
  }

  function saveJson(key, value) {
    try {
      localStorage.setItem(key, JSON.stringify(value));
    } catch (e) {
      console.warn("cannot save to localStorage", e);
    }
  }

  function current() {
    return conversations.find((c) => c.id === currentId) || null;
  }

  function newConversation() {
    const c = { id: "c" + Date.now().toString(36) + Math.random().toString(36).slice(2, 6),
      title: "New chat", created: Date.now(), messages: [] };
    conversations.unshift(c);
    currentId = c.id;
    return c;
  }

  // ----- rendering -----

  function renderList() {
    const ul = $("conversations");
    ul.textContent = "";
    for (const c of conversations) {
      const li = document.createElement("li");
      li.className = c.id === currentId ? "active" : "";
      li.dataset.id = c.id;
      const open = document.createElement("button");
      open.className = "conv-title";
      open.textContent = c.title;
      open.title = c.title;
      open.addEventListener("click", () => select(c.id));
      const del = document.createElement("button");
      del.className = "conv-delete";
      del.textContent = "×";
      del.title = "Delete this conversation";
      del.addEventListener("click", () => remove(c.id));
      li.append(open, del);
      ul.append(li);
    }
  }

  function messageElement(m) {
    const div = document.createElement("div");
    div.className = "msg " + m.role;
    const role = document.createElement("div");
    role.className = "msg-role";
    role.textContent = m.role === "user" ? "You" : "Assistant";
    div.append(role);
    if (m.reasoning) {
      const details = document.createElement("details");
      details.className = "reasoning";
      details.open = !!m.streaming;
      const summary = document.createElement("summary");
      summary.textContent = m.streaming && !m.content ? "Thinking…" : "Reasoning";
      const body = document.createElement("div");
      body.className = "reasoning-body";
      body.textContent = m.reasoning;
      details.append(summary, body);
      div.append(details);
    }
    const content = document.createElement("div");
    content.className = "msg-content";
    if (m.role === "user") {
      content.textContent = m.content;
    } else {
      content.innerHTML = window.strataMarkdown.render(m.content || "");
    }
    div.append(content);
    for (const call of m.tool_calls || []) {
      div.append(toolCallElement(call));
    }
    if (m.role === "assistant") {
      const meta = document.createElement("div");
      meta.className = "msg-meta";
      meta.textContent = statusText(m);
      div.append(meta);
    }
    return div;
  }

  function toolCallElement(call) {
    const box = document.createElement("div");
    box.className = "tool-call";
    const name = document.createElement("div");
    name.className = "tool-name";
    name.textContent = "Tool call: " + (call.name || "?");
    const args = document.createElement("pre");
    args.textContent = prettyJson(call.arguments || "");
    box.append(name, args);
    return box;
  }

  function prettyJson(text) {
    try {
      return JSON.stringify(JSON.parse(text), null, 2);
    } catch (e) {
      return text;
    }
  }

  function statusText(m) {
    if (m.streaming) {
      return "generating…";
    }
    if (m.error) {
      return "error: " + m.error;
    }
    if (m.stopped) {
      return "stopped";
    }
    return m.finish ? "finished (" + m.finish + ")" : "";
  }

  function renderMessages() {
    const box = $("messages");
    const c = current();
    const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
    box.textContent = "";
    if (!c || c.messages.length === 0) {
      const empty = document.createElement("div");
      empty.className = "empty";
      empty.textContent = "Send a message to start.";
      box.append(empty);
      return;
    }
    for (const m of c.messages) {
      box.append(messageElement(m));
    }
    if (atBottom) {
      box.scrollTop = box.scrollHeight;
    }
  }

  // Re-render at most once a frame while tokens stream in.
  function scheduleRender() {
    if (renderPending) {
      return;
    }
    renderPending = true;
    requestAnimationFrame(() => {
      renderPending = false;
      renderMessages();
    });
  }

  function setBusy(busy) {
    $("send").hidden = busy;
    $("stop").hidden = !busy;
    $("input").disabled = false;
  }

  // ----- conversation actions -----

  function select(id) {
    if (controller) {
      return;
    }
    currentId = id;
    renderList();
    renderMessages();
  }

  function remove(id) {
    if (controller && id === currentId) {
      return;
    }
    conversations = conversations.filter((c) => c.id !== id);
    if (currentId === id) {
      currentId = conversations.length ? conversations[0].id : null;
    }
    saveJson(STORE, conversations);
    renderList();
    renderMessages();
  }

  // ----- settings -----

  function readSettings() {
    const out = {};
    for (const f of FIELDS) {
      const v = $("set-" + f).value.trim();
      if (v !== "" && !Number.isNaN(Number(v))) {
        out[f] = Number(v);
      }
    }
    const system = $("set-system").value.trim();
    if (system) {
      out.system = system;
    }
    return out;
  }

  function restoreSettings() {
    const saved = loadJson(SETTINGS, {});
    for (const f of FIELDS) {
      if (saved[f] !== undefined) {
        $("set-" + f).value = saved[f];
      }
    }
    $("set-system").value = saved.system || "";
    for (const id of FIELDS.map((f) => "set-" + f).concat(["set-system"])) {
      $(id).addEventListener("change", () => saveJson(SETTINGS, readSettings()));
    }
  }

  // Show the model's defaults as the placeholders of the empty fields.
  function showDefaults(defaults, contextLength) {
    for (const f of FIELDS) {
      const input = $("set-" + f);
      if (f === "max_tokens") {
        input.placeholder = contextLength ? "up to " + contextLength : "";
      } else if (defaults && defaults[f] !== undefined && defaults[f] !== null) {
        input.placeholder = String(Math.round(defaults[f] * 1000) / 1000);
      }
    }
  }

  // ----- streaming -----

  function requestBody(c, settings) {
    const messages = [];
    if (settings.system) {
      messages.push({ role: "system", content: settings.system });
    }
    for (const m of c.messages) {
      if (m.streaming) {
        continue;
      }
      messages.push({ role: m.role, content: m.content || "" });
    }
    const body = { messages: messages, stream: true };
    for (const f of FIELDS) {
      if (settings[f] !== undefined) {
        body[f] = settings[f];
      }
    }
    return body;
  }

  function applyDelta(m, delta) {
    if (typeof delta.content === "string") {
      m.content += delta.content;
    }
    if (typeof delta.reasoning_content === "string") {
      m.reasoning = (m.reasoning || "") + delta.reasoning_content;
    }
    for (const t of delta.tool_calls || []) {
      m.tool_calls = m.tool_calls || [];
      const i = typeof t.index === "number" ? t.index : m.tool_calls.length;
      const call = m.tool_calls[i] || (m.tool_calls[i] = { name: "", arguments: "" });
      if (t.function && t.function.name) {
        call.name = t.function.name;
      }
      if (t.function && typeof t.function.arguments === "string") {
        call.arguments += t.function.arguments;
      }
    }
  }

  // Reads an SSE body, calling onChunk with each parsed `data:` JSON until [DONE].
  async function readSse(response, onChunk) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) {
        return;
      }
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = block.split("\n")
          .filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).trim())
          .join("\n");
        if (data === "[DONE]") {
          return;
        }
        if (data) {
          onChunk(JSON.parse(data));
        }
      }
    }
  }

  async function errorMessage(response) {
    try {
      const body = await response.json();
      return (body.error && body.error.message) || response.statusText;
    } catch (e) {
      return response.status + " " + response.statusText;
    }
  }

  async function send(text) {
    const c = current() || newConversation();
    if (c.messages.length === 0) {
      c.title = text.replace(/\s+/g, " ").slice(0, 40);
    }
    c.messages.push({ role: "user", content: text });
    const reply = { role: "assistant", content: "", streaming: true };
    const body = requestBody(c, readSettings());
    c.messages.push(reply);
    saveJson(STORE, conversations);
    renderList();
    renderMessages();
    controller = new AbortController();
    setBusy(true);
    try {
      const response = await window.Strata.api("/v1/chat/completions", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
        signal: controller.signal,
      });
      if (!response.ok) {
        throw new Error(await errorMessage(response));
      }
      await readSse(response, (chunk) => {
        if (chunk.error) {
          throw new Error(chunk.error.message || "the server reported an error");
        }
        const choice = (chunk.choices || [])[0];
        if (choice) {
          applyDelta(reply, choice.delta || {});
          if (choice.finish_reason) {
            reply.finish = choice.finish_reason;
          }
        }
        scheduleRender();
      });
    } catch (e) {
      if (e.name === "AbortError") {
        reply.stopped = true;
      } else {
        reply.error = e.message || String(e);
      }
    } finally {
      reply.streaming = false;
      controller = null;
      setBusy(false);
      saveJson(STORE, conversations);
      renderMessages();
    }
  }

  function stop() {
    if (controller) {
      controller.abort();
    }
  }

  function init() {
    if (!Array.isArray(conversations)) {
      conversations = [];
    }
    // A page closed mid-stream leaves a reply marked streaming: it ended there.
    for (const c of conversations) {
      for (const m of c.messages || []) {
        if (m.streaming) {
          m.streaming = false;
          m.stopped = true;
        }
      }
    }
    currentId = conversations.length ? conversations[0].id : null;
    restoreSettings();
    $("new-chat").addEventListener("click", () => {
      if (!controller) {
        newConversation();
        renderList();
        renderMessages();
        $("input").focus();
      }
    });
    $("composer").addEventListener("submit", (e) => {
      e.preventDefault();
      const text = $("input").value.trim();
      if (text && !controller) {
        $("input").value = "";
        send(text);
      }
    });
    $("input").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey) {
        e.preventDefault();
        $("composer").requestSubmit();
      }
    });
    $("stop").addEventListener("click", stop);
    renderList();
    renderMessages();
  }

  window.StrataChat = { init: init, showDefaults: showDefaults };
})();
