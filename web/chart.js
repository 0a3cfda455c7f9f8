// A small time-series line chart drawn on a <canvas>: a few named series, the last `capacity`
// samples, an auto-scaled y axis with grid lines, and a legend with each series' latest value.
// The canvas carries data-samples (samples drawn) and data-last (latest values) for tests.
"use strict";

(function () {
  function niceMax(value) {
    if (!(value > 0)) {
      return 1;
    }
    const magnitude = Math.pow(10, Math.floor(Math.log10(value)));
    const steps = [1, 2, 2.5, 5, 10];
    for (const s of steps) {
      if (value <= s * magnitude) {
        return s * magnitude;
      }
    }
    return 10 * magnitude;
  }

  function formatValue(v) {
    if (v === null || v === undefined || Number.isNaN(v)) {
      return "n/a";
    }
    if (Number.isInteger(v) || Math.abs(v) >= 100) {
      return v.toFixed(0);
    }
    return v.toFixed(1);
  }

  class LineChart {
    constructor(canvas, series, capacity) {
      this.canvas = canvas;
      this.series = series; // [{ name, color }]
      this.capacity = capacity || 120;
      this.samples = []; // [{ t, values: [number|null] }]
    }

    push(t, values) {
      this.samples.push({ t: t, values: values });
      if (this.samples.length > this.capacity) {
        this.samples.shift();
      }
      this.canvas.dataset.samples = String(this.samples.length);
      this.canvas.dataset.last = JSON.stringify(values);
      this.draw();
    }

    resize() {
      const ratio = window.devicePixelRatio || 1;
      const width = this.canvas.clientWidth || this.canvas.width;
      const height = this.canvas.clientHeight || this.canvas.height;
      if (this.canvas.width !== Math.round(width * ratio)) {
        this.canvas.width = Math.round(width * ratio);
        this.canvas.height = Math.round(height * ratio);
      }
      const ctx = this.canvas.getContext("2d");
      ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
      return { ctx: ctx, width: width, height: height };
    }

    draw() {
      const { ctx, width, height } = this.resize();
      const pad = { left: 52, right: 12, top: 28, bottom: 22 };
      const plotW = width - pad.left - pad.right;
      const plotH = height - pad.top - pad.bottom;
      ctx.clearRect(0, 0, width, height);
      let max = 0;
      for (const s of this.samples) {
        for (const v of s.values) {
          if (v !== null && v > max) {
            max = v;
          }
        }
      }
      max = niceMax(max);
      this.drawGrid(ctx, pad, plotW, plotH, max);
      this.drawLines(ctx, pad, plotW, plotH, max);
      this.drawLegend(ctx, pad);
    }

    drawGrid(ctx, pad, plotW, plotH, max) {
      const style = getComputedStyle(document.body);
      ctx.strokeStyle = style.getPropertyValue("--grid") || "#ccc";
      ctx.fillStyle = style.getPropertyValue("--muted") || "#888";
      ctx.font = "11px system-ui, sans-serif";
      ctx.lineWidth = 1;
      ctx.textAlign = "right";
      ctx.textBaseline = "middle";
      for (let i = 0; i <= 4; i++) {
        const y = pad.top + plotH - (plotH * i) / 4;
        ctx.beginPath();
        ctx.moveTo(pad.left, Math.round(y) + 0.5);
        ctx.lineTo(pad.left + plotW, Math.round(y) + 0.5);
        ctx.stroke();
        ctx.fillText(formatValue((max * i) / 4), pad.left - 6, y);
      }
      ctx.textAlign = "left";
      ctx.textBaseline = "top";
      const seconds = this.samples.length > 1
        ? Math.round((this.samples[this.samples.length - 1].t - this.samples[0].t) / 1000)
        : 0;
      ctx.fillText("−" + seconds + " s", pad.left, pad.top + plotH + 6);
      ctx.textAlign = "right";
      ctx.fillText("now", pad.left + plotW, pad.top + plotH + 6);
    }

    drawLines(ctx, pad, plotW, plotH, max) {
      const n = this.samples.length;
      // The newest sample sits at the right edge; older ones scroll left.
      const x = (i) => pad.left + (plotW * (this.capacity - n + i)) / (this.capacity - 1);
      this.series.forEach((series, k) => {
        ctx.strokeStyle = series.color;
        ctx.lineWidth = 2;
        ctx.beginPath();
        let drawing = false;
        this.samples.forEach((s, i) => {
          const v = s.values[k];
          if (v === null || v === undefined) {
            drawing = false;
            return;
          }
          const px = x(i);
          const py = pad.top + plotH - (plotH * v) / max;
          if (drawing) {
            ctx.lineTo(px, py);
          } else {
            ctx.moveTo(px, py);
            drawing = true;
          }
        });
        ctx.stroke();
      });
    }

    drawLegend(ctx, pad) {
      const last = this.samples.length ? this.samples[this.samples.length - 1].values : [];
      ctx.font = "12px system-ui, sans-serif";
      ctx.textAlign = "left";
      ctx.textBaseline = "middle";
      let x = pad.left;
      this.series.forEach((series, k) => {
        ctx.fillStyle = series.color;
        ctx.fillRect(x, 8, 12, 4);
        const label = series.name + ": " + formatValue(last[k]);
        ctx.fillStyle = getComputedStyle(document.body).getPropertyValue("--fg") || "#222";
        ctx.fillText(label, x + 16, 10);
        x += ctx.measureText(label).width + 36;
      });
    }
  }

  window.StrataChart = { LineChart: LineChart, formatValue: formatValue };
})();
