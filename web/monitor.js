// The monitor view: polls GET /v1/monitor once a second, fills the cards, and plots throughput
// and queue depth over time. Values the server reports as null are shown as "n/a".
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  let tpsChart = null;
  let queueChart = null;
  let previous = null;
  let onModel = null;

  function bytes(n) {
    if (n === null || n === undefined) {
      return "n/a";
    }
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let v = n;
    let u = 0;
    while (v >= 1024 && u < units.length - 1) {
      v /= 1024;
      u++;
    }
    return v.toFixed(u ? 1 : 0) + " " + units[u];
  }

  function show(v) {
    return v === null || v === undefined ? "n/a" : String(v);
  }

  function fillList(id, rows) {
    const dl = $(id);
    dl.textContent = "";
    for (const [label, value] of rows) {
      const dt = document.createElement("dt");
      dt.textContent = label;
      const dd = document.createElement("dd");
      dd.textContent = value;
      if (value === "n/a") {
        dd.className = "na";
      }
      dl.append(dt, dd);
    }
  }

  function fillCards(m) {
    const model = m.model || {};
    fillList("mon-model", [
      ["Status", m.status + (m.message ? ": " + m.message : "")],
      ["Model", show(model.name)],
      ["Backend / adapter", show(model.backend)],
      ["Context", show(model.context_length)],
      ["Vocabulary", show(model.vocab_size)],
    ]);
    const mem = m.memory || {};
    fillList("mon-memory", [
      ["Dense weights", bytes(mem.dense_bytes)],
      ["KV cache", bytes(mem.kv_bytes)],
      ["Expert slots", bytes(mem.expert_slot_bytes)],
      ["Free", bytes(mem.free_bytes)],
    ]);
    const q = m.queue || {};
    const t = m.throughput || {};
    fillList("mon-queue", [
      ["Waiting", show(q.waiting)],
      ["Running", show(q.running)],
      ["Queue limit", show(q.capacity)],
      ["Prompt tokens", show(t.prompt_tokens_total)],
      ["Generated tokens", show(t.generated_tokens_total)],
      ["Cancelled", show(t.cancelled_generations_total)],
    ]);
    const cache = m.expert_cache || {};
    const ple = m.ple || {};
    const hit = typeof cache.hit_rate === "number" ? (cache.hit_rate * 100).toFixed(1) + " %" : "n/a";
    fillList("mon-tiers", [
      ["Expert-cache hit rate", hit],
      ["PLE rows read", show(ple.rows_read)],
      ["PLE bytes read", bytes(ple.bytes_read)],
    ]);
  }

  // Decode speed now: generated tokens since the last poll over the time between polls.
  function liveDecode(m) {
    const t = m.throughput || {};
    let rate = 0;
    if (previous && m.time_ms > previous.time_ms) {
      const tokens = t.generated_tokens_total - previous.tokens;
      rate = Math.max(0, (tokens * 1000) / (m.time_ms - previous.time_ms));
    }
    previous = { time_ms: m.time_ms, tokens: t.generated_tokens_total };
    return rate;
  }

  function plot(m) {
    const t = m.throughput || {};
    const q = m.queue || {};
    tpsChart.push(m.time_ms, [
      liveDecode(m),
      t.decode_tokens_per_second_last || null,
      t.prefill_tokens_per_second_last || null,
    ]);
    queueChart.push(m.time_ms, [q.waiting, q.running]);
  }

  async function poll() {
    try {
      const response = await window.Strata.api("/v1/monitor");
      if (response.ok) {
        const m = await response.json();
        fillCards(m);
        plot(m);
        if (onModel) {
          onModel(m);
        }
      }
    } catch (e) {
      // The server may be restarting; the next poll retries.
    }
  }

  function init(modelCallback) {
    onModel = modelCallback;
    const css = getComputedStyle(document.body);
    const color = (name, fallback) => css.getPropertyValue(name).trim() || fallback;
    tpsChart = new window.StrataChart.LineChart($("chart-tps"), [
      { name: "decode now", color: color("--c1", "#2f7de1") },
      { name: "decode (last request)", color: color("--c2", "#e1872f") },
      { name: "prefill (last request)", color: color("--c3", "#3aa655") },
    ]);
    queueChart = new window.StrataChart.LineChart($("chart-queue"), [
      { name: "waiting", color: color("--c2", "#e1872f") },
      { name: "running", color: color("--c1", "#2f7de1") },
    ]);
    window.addEventListener("resize", () => {
      tpsChart.draw();
      queueChart.draw();
    });
  }

  window.StrataMonitor = { init: init, poll: poll };
})();
