// Start-up: waits for the model (/health), asks for the API key when the server wants one (kept
// in sessionStorage), switches tabs, and starts the chat and the monitor.
"use strict";

(function () {
  const KEY = "strata.apiKey";
  const $ = (id) => document.getElementById(id);
  let modelShown = false;
  let pendingKey = null;

  // fetch() with the API key, if one was given. A 401 asks for the key again.
  async function api(path, options) {
    const opts = Object.assign({}, options || {});
    const headers = new Headers(opts.headers || {});
    const key = sessionStorage.getItem(KEY);
    if (key) {
      headers.set("Authorization", "Bearer " + key);
    }
    opts.headers = headers;
    const response = await fetch(path, opts);
    if (response.status === 401) {
      askForKey(!!key);
    }
    return response;
  }

  function askForKey(refused) {
    const dialog = $("key-dialog");
    $("key-error").hidden = !refused;
    if (!dialog.open) {
      dialog.showModal();
      $("key-input").focus();
    }
    if (!pendingKey) {
      pendingKey = new Promise((resolve) => {
        dialog.addEventListener("close", () => {
          pendingKey = null;
          resolve();
        }, { once: true });
      });
    }
    return pendingKey;
  }

  async function submitKey(event) {
    event.preventDefault();
    const key = $("key-input").value.trim();
    if (!key) {
      return;
    }
    const response = await fetch("/v1/monitor", { headers: { Authorization: "Bearer " + key } });
    if (response.status === 401) {
      $("key-error").hidden = false;
      return;
    }
    sessionStorage.setItem(KEY, key);
    $("key-input").value = "";
    $("key-dialog").close();
    window.StrataMonitor.poll();
  }

  function switchTo(view) {
    for (const tab of document.querySelectorAll(".tab")) {
      tab.classList.toggle("active", tab.dataset.view === view);
    }
    $("view-chat").hidden = view !== "chat";
    $("view-monitor").hidden = view !== "monitor";
    if (view === "monitor") {
      window.dispatchEvent(new Event("resize"));
    }
  }

  // Called with each /v1/monitor answer: the model name and the sampling defaults.
  function showModel(m) {
    if (!m.model || modelShown) {
      return;
    }
    modelShown = true;
    $("model-name").textContent = m.model.name + " · " + m.model.backend;
    $("demo-banner").hidden = document.body.dataset.demo !== "true";
    window.StrataChat.showDefaults(m.defaults, m.model.context_length);
  }

  // Polls /health until the model is ready, showing the load bar meanwhile.
  async function waitForModel() {
    for (;;) {
      let health = null;
      try {
        const response = await fetch("/health");
        health = await response.json();
      } catch (e) {
        health = { status: "error", message: "the server does not answer" };
      }
      if (health.status === "ok") {
        $("load-panel").hidden = true;
        return health;
      }
      $("load-panel").hidden = false;
      $("load-panel").classList.toggle("failed", health.status !== "loading");
      $("load-text").textContent = health.status === "loading"
        ? "Loading the model… (the terminal running strata shows the progress)"
        : "The model is not available: " + (health.message || health.status);
      await new Promise((r) => setTimeout(r, 700));
    }
  }

  async function start() {
    window.Strata = { api: api };
    for (const tab of document.querySelectorAll(".tab")) {
      tab.addEventListener("click", () => switchTo(tab.dataset.view));
    }
    $("key-form").addEventListener("submit", submitKey);
    window.StrataChat.init();
    window.StrataMonitor.init(showModel);
    const health = await waitForModel();
    if (health.api_key_required && !sessionStorage.getItem(KEY)) {
      await askForKey(false);
    }
    window.StrataMonitor.poll();
    setInterval(() => {
      if (!health.api_key_required || sessionStorage.getItem(KEY)) {
        window.StrataMonitor.poll();
      }
    }, 1000);
  }

  start();
})();
