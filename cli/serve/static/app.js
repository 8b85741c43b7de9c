// The chat page of `infer serve`: conversations in localStorage, replies streamed from
// /v1/chat/completions (Server-Sent Events read from fetch, so Stop is an AbortController: the server
// sees the disconnect and frees the sequence), edit-and-resend, regenerate, the sampler settings the
// server accepts, a JSON schema for structured output, and TTFT and tokens/s under each reply.
// Model text is rendered by markdown.js, which builds DOM nodes and never parses HTML.
"use strict";

(() => {
  const STORE = "infer.webui.v1";
  const NUMBERS = ["temperature", "top_p", "top_k", "min_p", "max_tokens", "seed"];
  const INTEGERS = new Set(["top_k", "max_tokens", "seed"]);
  const $ = (id) => document.getElementById(id);
  const md = window.inferMarkdown;

  const ui = {
    messages: $("messages"),
    prompt: $("prompt"),
    composer: $("composer"),
    send: $("send"),
    stop: $("stop"),
    status: $("status"),
    conversations: $("conversations"),
    settings: $("settings"),
    settingsError: $("settings-error"),
    system: $("system"),
    schema: $("json_schema"),
    apiKey: $("api_key"),
    sidebar: $("sidebar"),
  };

  // -- stored state -------------------------------------------------------------------------------
  function load() {
    try {
      const stored = JSON.parse(localStorage.getItem(STORE) || "null");
      if (stored && Array.isArray(stored.conversations)) return { settings: {}, ...stored };
    } catch {
      // a damaged store starts afresh rather than breaking the page
    }
    return { conversations: [], current: null, settings: {} };
  }

  const state = load();
  let active = null; // the reply being streamed: { controller, conversation, message }

  function save() {
    try {
      localStorage.setItem(STORE, JSON.stringify(state));
    } catch (error) {
      announce(`Could not save the conversation: ${error.message}`);
    }
  }

  function newConversation() {
    const conversation = {
      id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 7)}`,
      title: "New chat",
      system: state.settings.last_system || "",
      messages: [],
      updated: Date.now(),
    };
    state.conversations.unshift(conversation);
    state.current = conversation.id;
    save();
    return conversation;
  }

  function current() {
    return state.conversations.find((c) => c.id === state.current) || newConversation();
  }

  function announce(text) {
    ui.status.textContent = text;
  }

  // -- the request ----------------------------------------------------------------------------------
  function headers() {
    const out = { "Content-Type": "application/json" };
    if (state.settings.api_key) out.Authorization = `Bearer ${state.settings.api_key}`;
    return out;
  }

  function parsedSchema() {
    const text = (state.settings.json_schema || "").trim();
    if (!text) return null;
    const schema = JSON.parse(text); // the caller shows a SyntaxError next to the box
    if (typeof schema !== "object" || schema === null || Array.isArray(schema)) {
      throw new SyntaxError("the JSON schema must be an object");
    }
    return schema;
  }

  function requestBody(conversation) {
    const messages = [];
    if (conversation.system.trim()) messages.push({ role: "system", content: conversation.system });
    for (const m of conversation.messages) {
      if ((m.role === "user" || m.role === "assistant") && m.content) {
        messages.push({ role: m.role, content: m.content });
      }
    }
    const body = { messages, stream: true, stream_options: { include_usage: true } };
    for (const name of NUMBERS) {
      const raw = state.settings[name];
      if (raw === undefined || raw === null || raw === "") continue;
      const value = Number(raw);
      if (!Number.isFinite(value) || (INTEGERS.has(name) && !Number.isInteger(value))) {
        throw new SyntaxError(`${name} must be a${INTEGERS.has(name) ? "n integer" : " number"}`);
      }
      body[name] = value;
    }
    const schema = parsedSchema();
    if (schema) body.response_format = { type: "json_schema", json_schema: { name: "schema", schema } };
    return body;
  }

  /** Each `data:` payload of an SSE stream, as it arrives. */
  async function* events(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
      for (let cut = buffer.indexOf("\n\n"); cut >= 0; cut = buffer.indexOf("\n\n")) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const data = block
          .split("\n")
          .filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(5).trimStart())
          .join("\n");
        if (data) yield data;
      }
    }
  }

  async function errorMessage(response) {
    try {
      const body = await response.json();
      return body?.error?.message || `HTTP ${response.status}`;
    } catch {
      return `HTTP ${response.status} ${response.statusText}`;
    }
  }

  async function generate(conversation) {
    let body;
    try {
      body = requestBody(conversation);
      ui.settingsError.textContent = "";
    } catch (error) {
      ui.settingsError.textContent = error.message;
      openSettings(true);
      return;
    }
    const message = { role: "assistant", content: "", stats: null };
    conversation.messages.push(message);
    conversation.updated = Date.now();
    const controller = new AbortController();
    active = { controller, conversation, message };
    setBusy(true);
    renderAll();
    const started = performance.now();
    let first = null;
    let chunks = 0;
    let usage = null;
    let finish = null;
    try {
      const response = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: headers(),
        body: JSON.stringify(body),
        signal: controller.signal,
      });
      if (!response.ok) throw new Error(await errorMessage(response));
      for await (const data of events(response)) {
        if (data === "[DONE]") break;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message || "the server reported an error");
        if (chunk.usage) usage = chunk.usage;
        const choice = chunk.choices?.[0];
        if (!choice) continue;
        const piece = choice.delta?.content;
        if (piece) {
          if (first === null) first = performance.now();
          chunks += 1;
          message.content += piece;
          scheduleRender(message);
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    } catch (error) {
      if (error.name === "AbortError") {
        message.stopped = true;
      } else {
        conversation.messages.push({ role: "error", content: error.message });
      }
    } finally {
      const ended = performance.now();
      const tokens = usage?.completion_tokens ?? chunks;
      message.stats = {
        ttft_ms: first === null ? null : first - started,
        tokens,
        tokens_per_s:
          first !== null && tokens > 1 && ended > first ? ((tokens - 1) * 1000) / (ended - first) : null,
        finish: message.stopped ? "stopped" : finish,
      };
      if (!message.content && !message.stopped && conversation.messages.at(-1) !== message) {
        conversation.messages.splice(conversation.messages.indexOf(message), 1); // only the error stays
      }
      active = null;
      save();
      setBusy(false);
      renderAll();
      announce(message.stopped ? "Reply stopped" : "Reply finished");
    }
  }

  function stop() {
    if (active) active.controller.abort();
  }

  /** Start a reply to `text`; false (and the reason beside the settings) when the settings are bad. */
  function send(text) {
    if (active || !text.trim()) return false;
    const conversation = current();
    try {
      requestBody(conversation); // refuse bad settings before the message joins the conversation
    } catch (error) {
      ui.settingsError.textContent = error.message;
      openSettings(true);
      return false;
    }
    conversation.messages.push({ role: "user", content: text });
    if (conversation.title === "New chat") conversation.title = text.trim().slice(0, 48);
    save();
    generate(conversation);
    return true;
  }

  // -- rendering --------------------------------------------------------------------------------------
  let pending = null;
  function scheduleRender(message) {
    if (pending) return;
    pending = requestAnimationFrame(() => {
      pending = null;
      const node = ui.messages.querySelector(".msg.streaming .content");
      if (node) {
        const stick = nearBottom();
        node.replaceChildren(md.render(message.content));
        if (stick) ui.messages.scrollTop = ui.messages.scrollHeight;
      }
    });
  }

  function nearBottom() {
    const m = ui.messages;
    return m.scrollHeight - m.scrollTop - m.clientHeight < 80;
  }

  function button(label, onClick, aria) {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = label;
    if (aria) b.setAttribute("aria-label", aria);
    b.addEventListener("click", onClick);
    return b;
  }

  function statsText(stats) {
    if (!stats) return "";
    const parts = [];
    if (stats.ttft_ms !== null) parts.push(`TTFT ${Math.round(stats.ttft_ms)} ms`);
    if (stats.tokens_per_s !== null) parts.push(`${stats.tokens_per_s.toFixed(1)} tok/s`);
    parts.push(`${stats.tokens} token${stats.tokens === 1 ? "" : "s"}`);
    if (stats.finish) parts.push(stats.finish);
    return parts.join(" · ");
  }

  function messageNode(conversation, message, index) {
    const node = document.createElement("article");
    node.className = `msg ${message.role}`;
    node.dataset.role = message.role;
    if (active && active.message === message) node.classList.add("streaming");
    const who = document.createElement("h2");
    who.className = "who";
    who.textContent = { user: "You", assistant: "Assistant", error: "Error" }[message.role] || message.role;
    const content = document.createElement("div");
    content.className = "content";
    if (message.role === "assistant") content.append(md.render(message.content));
    else content.textContent = message.content;
    node.append(who, content);
    const meta = document.createElement("div");
    meta.className = "meta";
    const stats = document.createElement("span");
    stats.className = "stats";
    stats.textContent = statsText(message.stats);
    meta.append(stats);
    if (!active) {
      if (message.role === "user") {
        meta.append(button("Edit", () => startEdit(node, conversation, index), "Edit and resend"));
      }
      if (message.role === "assistant") {
        meta.append(
          button("Regenerate", () => {
            conversation.messages.splice(index);
            generate(conversation);
          }),
          button("Copy", () => navigator.clipboard?.writeText(message.content), "Copy the reply"),
        );
      }
      if (message.role === "error" && index === conversation.messages.length - 1) {
        meta.append(
          button("Retry", () => {
            conversation.messages.splice(index);
            generate(conversation);
          }),
        );
      }
    }
    node.append(meta);
    return node;
  }

  function startEdit(node, conversation, index) {
    const area = document.createElement("textarea");
    area.className = "edit";
    area.value = conversation.messages[index].content;
    area.setAttribute("aria-label", "Edit the message");
    area.rows = Math.min(12, Math.max(2, area.value.split("\n").length));
    const resend = () => {
      if (!area.value.trim()) return;
      conversation.messages.splice(index);
      conversation.messages.push({ role: "user", content: area.value });
      save();
      generate(conversation);
    };
    area.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        resend();
      } else if (event.key === "Escape") {
        event.stopPropagation();
        renderAll();
      }
    });
    const actions = document.createElement("div");
    actions.className = "meta";
    actions.append(button("Send", resend, "Send the edited message"), button("Cancel", renderAll));
    node.querySelector(".content").replaceChildren(area);
    node.querySelector(".meta").replaceWith(actions);
    area.focus();
  }

  function renderMessages() {
    const conversation = current();
    const stick = nearBottom() || active;
    ui.messages.replaceChildren(...conversation.messages.map((m, i) => messageNode(conversation, m, i)));
    if (!conversation.messages.length) {
      const empty = document.createElement("p");
      empty.className = "empty";
      empty.textContent = "Say something to start.";
      ui.messages.append(empty);
    }
    if (stick) ui.messages.scrollTop = ui.messages.scrollHeight;
  }

  function renderConversations() {
    ui.conversations.replaceChildren(
      ...state.conversations.map((conversation) => {
        const item = document.createElement("li");
        const open = button(conversation.title || "New chat", () => {
          if (active) return;
          state.current = conversation.id;
          save();
          openSidebar(false);
          renderAll();
          ui.prompt.focus();
        });
        open.className = "open";
        if (conversation.id === state.current) open.setAttribute("aria-current", "true");
        const remove = button("×", () => {
          if (active && active.conversation === conversation) return;
          state.conversations = state.conversations.filter((c) => c !== conversation);
          if (state.current === conversation.id) state.current = state.conversations[0]?.id ?? null;
          save();
          renderAll();
        }, `Delete the conversation ${conversation.title}`);
        remove.className = "delete";
        item.append(open, remove);
        return item;
      }),
    );
  }

  function renderSettings() {
    const conversation = current();
    ui.system.value = conversation.system;
    for (const name of NUMBERS) $(name).value = state.settings[name] ?? "";
    ui.schema.value = state.settings.json_schema || "";
    ui.apiKey.value = state.settings.api_key || "";
  }

  function renderAll() {
    renderConversations();
    renderMessages();
    renderSettings();
  }

  function setBusy(busy) {
    ui.send.hidden = busy;
    ui.stop.hidden = !busy;
    document.body.classList.toggle("busy", busy);
  }

  function openSettings(open) {
    ui.settings.hidden = !open;
    $("toggle-settings").setAttribute("aria-expanded", String(open));
  }

  function openSidebar(open) {
    ui.sidebar.classList.toggle("open", open);
    $("toggle-sidebar").setAttribute("aria-expanded", String(open));
    if (open) $("new-chat").focus();
  }

  // -- wiring ---------------------------------------------------------------------------------------
  ui.composer.addEventListener("submit", (event) => {
    event.preventDefault();
    if (send(ui.prompt.value)) ui.prompt.value = "";
  });
  ui.prompt.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      ui.composer.requestSubmit();
    }
  });
  ui.stop.addEventListener("click", stop);
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape") return;
    if (active) {
      event.preventDefault();
      stop();
      ui.prompt.focus();
    } else if (ui.sidebar.classList.contains("open")) {
      openSidebar(false);
      $("toggle-sidebar").focus();
    }
  });
  $("new-chat").addEventListener("click", () => {
    if (active) return;
    newConversation();
    openSidebar(false);
    renderAll();
    ui.prompt.focus();
  });
  ui.settings.addEventListener("submit", (event) => event.preventDefault()); // Enter in a field
  $("toggle-settings").addEventListener("click", () => openSettings(ui.settings.hidden));
  $("toggle-sidebar").addEventListener("click", () => openSidebar(!ui.sidebar.classList.contains("open")));
  ui.system.addEventListener("input", () => {
    current().system = ui.system.value;
    state.settings.last_system = ui.system.value;
    save();
  });
  for (const name of NUMBERS) {
    $(name).addEventListener("input", (event) => {
      state.settings[name] = event.target.value;
      save();
    });
  }
  ui.schema.addEventListener("input", () => {
    state.settings.json_schema = ui.schema.value;
    save();
    try {
      parsedSchema();
      ui.settingsError.textContent = "";
    } catch (error) {
      ui.settingsError.textContent = `JSON schema: ${error.message}`;
    }
  });
  ui.apiKey.addEventListener("input", () => {
    state.settings.api_key = ui.apiKey.value;
    save();
    showModel();
  });

  async function showModel() {
    try {
      const response = await fetch("/v1/models", { headers: headers() });
      if (response.status === 401) {
        $("model-name").textContent = "(API key needed: see settings)";
        return;
      }
      const body = await response.json();
      $("model-name").textContent = body.data?.[0]?.id || "";
    } catch {
      $("model-name").textContent = "(server unreachable)";
    }
  }

  // A half-streamed reply from before a reload is kept as it was, marked stopped.
  for (const conversation of state.conversations) {
    for (const message of conversation.messages) {
      if (message.role === "assistant" && !message.stats) {
        message.stats = { ttft_ms: null, tokens_per_s: null, tokens: 0, finish: "stopped" };
      }
    }
  }
  setBusy(false);
  renderAll();
  showModel();
  ui.prompt.focus();
})();
