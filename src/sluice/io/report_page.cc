// The page of `sluice report` (io/run_report.h): HTML, CSS and the script that draws every panel
// as inline SVG from the embedded data (<script type="application/json" id="report-data">).
// Nothing is loaded from the network: no external script, style, font or image; the favicon is a
// data: URL so that a browser does not ask for /favicon.ico.
//
// The markers @TITLE@ (twice) and @DATA@ are replaced by RenderReportHtml. Elements the browser
// test (tests/report/report_browser_test.py) counts: one <g class="gantt-row"> per stage of the
// trace, one <circle class="loss-point"> per logged step.
#include <string_view>

namespace sluice {

std::string_view ReportPageTemplate() {
  return R"page(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>@TITLE@</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; color: #222; background: #f6f6f3; margin: 0; }
  main { max-width: 1080px; margin: 0 auto; padding: 16px 24px 48px; }
  h1 { font-size: 22px; margin: 12px 0 4px; }
  h2 { font-size: 16px; margin: 0 0 6px; }
  section { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 14px 18px;
            margin: 14px 0; }
  p.note { color: #666; margin: 4px 0 8px; }
  svg { display: block; }
  svg text { font: 11px system-ui, sans-serif; fill: #444; }
  .axis line { stroke: #999; }
  .axis line.grid { stroke: #e8e8e8; }
  .legend span { display: inline-block; margin-right: 16px; }
  .legend i { display: inline-block; width: 12px; height: 12px; margin-right: 5px;
              vertical-align: -1px; border-radius: 2px; }
  table { border-collapse: collapse; }
  td { padding: 2px 14px 2px 0; vertical-align: top; }
  td:first-child { color: #666; }
  .figures span { margin-right: 22px; }
  .figures b { font-size: 16px; }
</style>
</head>
<body>
<main>
<h1>@TITLE@</h1>
<p class="note" id="headline"></p>
<section id="loss-panel"><h2>Loss</h2>
  <p class="note">Training loss at every logged step, validation loss at every evaluation, and the
  learning rate (right axis).</p><div class="legend" id="loss-legend"></div><div id="loss"></div></section>
<section id="throughput-panel"><h2>Throughput</h2>
  <p class="note" id="throughput-note">Tokens (or examples) per second of every step.</p>
  <div class="legend" id="throughput-legend"></div><div id="throughput"></div></section>
<section id="memory-panel"><h2>Peak memory per stage</h2>
  <p class="note" id="memory-note"></p><div class="legend" id="memory-legend"></div>
  <div id="memory"></div></section>
<section id="gantt-panel"><h2>The last step, per stage</h2>
  <p class="note" id="gantt-note"></p><div class="legend" id="gantt-legend"></div>
  <div id="gantt"></div></section>
<section id="allocated-panel"><h2>Allocated bytes during the last step</h2>
  <p class="note" id="allocated-note"></p><div class="legend" id="allocated-legend"></div>
  <div id="allocated"></div></section>
<section id="config-panel"><h2>Configuration</h2><table id="config"></table></section>
</main>
<script type="application/json" id="report-data">@DATA@</script>
<script>
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const SVG = "http://www.w3.org/2000/svg";
  const KIND_COLOURS = { F: "#4e79a7", B: "#f28e2b", W: "#59a14f", OPT: "#b07aa1",
                         SEND: "#9c755f", RECV: "#d4cbc4", ALLREDUCE: "#e15759",
                         other: "#76b7b2" };
  const STAGE_COLOURS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2",
                         "#edc948", "#ff9da7", "#9c755f", "#bab0ac"];
  const WIDTH = 1000;

  function node(tag, attrs, parent, text) {
    const n = document.createElementNS(SVG, tag);
    for (const k in attrs) n.setAttribute(k, attrs[k]);
    if (text !== undefined) n.textContent = text;
    if (parent) parent.appendChild(n);
    return n;
  }
  function tip(n, text) { node("title", {}, n, text); return n; }
  function bytes(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let u = 0;
    while (Math.abs(n) >= 1024 && u < units.length - 1) { n /= 1024; u++; }
    return (u === 0 ? n.toFixed(0) : n.toFixed(n < 10 ? 2 : 1)) + " " + units[u];
  }
  function num(v) {
    if (v === 0) return "0";
    const a = Math.abs(v);
    if (a >= 1e4 || a < 1e-3) return v.toExponential(1);
    return String(Number(v.toPrecision(3)));
  }
  function ticks(lo, hi, count) {
    if (!(hi > lo)) return [lo];
    const raw = (hi - lo) / count, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw);
    const out = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(t);
    return out;
  }
  function extent(values) {
    const v = values.filter(x => x !== null && isFinite(x));
    if (v.length === 0) return [0, 1];
    let lo = Math.min(...v), hi = Math.max(...v);
    if (lo === hi) { lo -= Math.abs(lo) * 0.1 || 1; hi += Math.abs(hi) * 0.1 || 1; }
    return [lo, hi];
  }
  function legend(id, items) {
    const el = document.getElementById(id);
    for (const [label, colour, dashed] of items) {
      const s = document.createElement("span");
      const i = document.createElement("i");
      i.style.background = dashed ? "repeating-linear-gradient(90deg," + colour + " 0 3px,#fff 3px 5px)"
                                  : colour;
      s.appendChild(i);
      s.appendChild(document.createTextNode(label));
      el.appendChild(s);
    }
  }

  // A chart frame: x and y scales, grid, ticks and labels; y2 adds a right axis.
  function frame(parent, o) {
    const m = { left: 90, right: o.y2 ? 70 : 20, top: 10, bottom: 38 };
    const h = o.height || 280;
    const svg = node("svg", { width: WIDTH, height: h, viewBox: "0 0 " + WIDTH + " " + h,
                              class: o.cls || "" }, parent);
    const iw = WIDTH - m.left - m.right, ih = h - m.top - m.bottom;
    const sx = v => m.left + (o.x[1] > o.x[0] ? (v - o.x[0]) / (o.x[1] - o.x[0]) : 0.5) * iw;
    const scale = d => v => m.top + ih - (v - d[0]) / (d[1] - d[0]) * ih;
    const sy = scale(o.y), sy2 = o.y2 ? scale(o.y2) : null;
    const axis = node("g", { class: "axis" }, svg);
    // A bytes axis ticks at round numbers of its unit (KiB, MiB, ...), not of bytes.
    const unit = o.yfmt === bytes ? Math.pow(1024, Math.max(0, Math.floor(Math.log(o.y[1]) / Math.log(1024)))) : 1;
    for (const t of ticks(o.y[0] / unit, o.y[1] / unit, 5).map(v => v * unit)) {
      node("line", { class: "grid", x1: m.left, x2: m.left + iw, y1: sy(t), y2: sy(t) }, axis);
      node("text", { x: m.left - 6, y: sy(t) + 4, "text-anchor": "end" }, axis, (o.yfmt || num)(t));
    }
    if (o.y2) {
      for (const t of ticks(o.y2[0], o.y2[1], 5)) {
        node("text", { x: m.left + iw + 6, y: sy2(t) + 4 }, axis, num(t));
      }
      node("text", { x: WIDTH - 4, y: m.top + ih / 2, "text-anchor": "middle",
                     transform: "rotate(90 " + (WIDTH - 12) + " " + (m.top + ih / 2) + ")" },
           axis, o.y2label);
    }
    if (!o.noxticks) {
      for (const t of ticks(o.x[0], o.x[1], 8)) {
        node("line", { x1: sx(t), x2: sx(t), y1: m.top + ih, y2: m.top + ih + 4 }, axis);
        node("text", { x: sx(t), y: m.top + ih + 16, "text-anchor": "middle" }, axis, num(t));
      }
    }
    node("line", { x1: m.left, x2: m.left + iw, y1: m.top + ih, y2: m.top + ih }, axis);
    node("line", { x1: m.left, x2: m.left, y1: m.top, y2: m.top + ih }, axis);
    node("text", { x: m.left + iw / 2, y: h - 4, "text-anchor": "middle" }, axis, o.xlabel);
    node("text", { x: 14, y: m.top + ih / 2, "text-anchor": "middle",
                   transform: "rotate(-90 14 " + (m.top + ih / 2) + ")" }, axis, o.ylabel);
    return { svg, sx, sy, sy2, m, iw, ih };
  }
  function polyline(f, g, xs, ys, sy, attrs) {
    const pts = [];
    for (let i = 0; i < xs.length; i++) {
      if (ys[i] !== null && isFinite(ys[i])) pts.push(f.sx(xs[i]).toFixed(1) + "," + sy(ys[i]).toFixed(1));
    }
    return node("polyline", Object.assign({ points: pts.join(" "), fill: "none" }, attrs), g);
  }

  const steps = data.steps, evals = data.evals;
  const last = steps.step.length - 1;
  document.getElementById("headline").textContent =
      steps.step.length + " logged steps, final loss " + num(steps.loss[last]) +
      (evals.step.length ? ", last validation loss " + num(evals.val_loss[evals.step.length - 1]) : "") +
      (data.complete ? "" : " (no summary line: the run had not finished)");

  // Loss, validation loss and the learning rate.
  (function () {
    const xs = steps.step.concat(evals.step);
    const f = frame(document.getElementById("loss"), {
      x: extent(xs), y: extent(steps.loss.concat(evals.val_loss)), y2: extent(steps.lr),
      xlabel: "step", ylabel: "loss", y2label: "learning rate", cls: "loss-chart" });
    const g = node("g", {}, f.svg);
    polyline(f, g, steps.step, steps.lr, f.sy2, { stroke: "#aaa", "stroke-dasharray": "4 3",
                                                  class: "lr-line" });
    polyline(f, g, steps.step, steps.loss, f.sy, { stroke: "#4e79a7", "stroke-width": 1.2,
                                                   class: "loss-line" });
    for (let i = 0; i < steps.step.length; i++) {
      tip(node("circle", { class: "loss-point", cx: f.sx(steps.step[i]), cy: f.sy(steps.loss[i]),
                           r: steps.step.length > 300 ? 1.2 : 2.5, fill: "#4e79a7" }, g),
          "step " + steps.step[i] + ": loss " + steps.loss[i].toFixed(4) + ", lr " + num(steps.lr[i]));
    }
    polyline(f, g, evals.step, evals.val_loss, f.sy, { stroke: "#e15759", "stroke-width": 1.5 });
    for (let i = 0; i < evals.step.length; i++) {
      const acc = evals.accuracy[i] !== null ? ", accuracy " + (100 * evals.accuracy[i]).toFixed(1) + "%" : "";
      tip(node("circle", { class: "val-point", cx: f.sx(evals.step[i]), cy: f.sy(evals.val_loss[i]),
                           r: 4, fill: "#e15759" }, g),
          "step " + evals.step[i] + ": validation loss " + evals.val_loss[i].toFixed(4) + acc);
    }
    legend("loss-legend", [["training loss", "#4e79a7"], ["validation loss", "#e15759"],
                           ["learning rate", "#999", true]]);
  })();

  // Throughput: tokens or examples per second.
  (function () {
    const f = frame(document.getElementById("throughput"), {
      x: extent(steps.step), y: [0, extent(steps.per_s)[1]], xlabel: "step",
      ylabel: data.unit + "/s", height: 220 });
    polyline(f, f.svg, steps.step, steps.per_s, f.sy, { stroke: "#b5dcae", class: "tps-line" });
    // The mean of the last 20 steps at every step: the trend through the noise of a shared machine.
    const window = 20, mean = [];
    let sum = 0;
    steps.per_s.forEach((v, i) => {
      sum += v - (i >= window ? steps.per_s[i - window] : 0);
      mean.push(sum / Math.min(i + 1, window));
    });
    polyline(f, f.svg, steps.step, mean, f.sy, { stroke: "#2f7d32", "stroke-width": 1.6 });
    legend("throughput-legend", [[data.unit + "/s of the step", "#b5dcae"],
                                 ["mean of the last " + window + " steps", "#2f7d32"]]);
    if (data.per_s !== undefined) {
      document.getElementById("throughput-note").textContent =
          data.unit[0].toUpperCase() + data.unit.slice(1) + " per second of every step; over the whole run " +
          num(data.per_s) + " " + data.unit + "/s.";
    }
  })();

  // Peak memory per stage beside the liveness bound and the plan's prediction.
  (function () {
    const series = [["peak allocated", "peak_allocated_bytes", "#4e79a7"],
                    ["peak reserved", "peak_reserved_bytes", "#a0cbe8"],
                    ["liveness bound", "liveness_bound_bytes", "#59a14f"],
                    ["predicted (sluice plan)", "predicted_peak_allocated_bytes", "#f28e2b"]]
        .filter(s => data.stages.some(st => st[s[1]] !== undefined));
    const missing = ["liveness_bound_bytes", "predicted_peak_allocated_bytes"]
        .filter(k => !data.stages.some(st => st[k] !== undefined));
    document.getElementById("memory-note").textContent =
        "Largest bytes held at once by each stage over the run (allocated: tensors; reserved: " +
        "what the allocator kept from the system)." +
        (missing.length ? " Not in this run's metrics: " +
         missing.map(k => k === "liveness_bound_bytes" ? "the liveness bound"
                                                       : "a sluice plan prediction").join(", ") + "." : "");
    legend("memory-legend", series.map(s => [s[0], s[2]]));
    const max = Math.max(...data.stages.flatMap(st => series.map(s => st[s[1]] || 0)), 1);
    const f = frame(document.getElementById("memory"), {
      x: [0, data.stages.length], y: [0, max * 1.05], xlabel: "stage", ylabel: "bytes",
      yfmt: bytes, noxticks: true, height: 260 });
    const slot = f.iw / data.stages.length, bar = Math.min(40, slot * 0.8 / series.length);
    data.stages.forEach((st, i) => {
      const g = node("g", { class: "memory-stage", "data-stage": st.stage }, f.svg);
      const x0 = f.m.left + slot * i + (slot - bar * series.length) / 2;
      series.forEach((s, k) => {
        if (st[s[1]] === undefined) return;
        const y = f.sy(st[s[1]]);
        tip(node("rect", { class: "mem-bar", x: x0 + k * bar, y: y, width: bar - 2,
                           height: f.m.top + f.ih - y, fill: s[2] }, g),
            "stage " + st.stage + " " + s[0] + ": " + bytes(st[s[1]]));
      });
      node("text", { x: f.m.left + slot * (i + 0.5), y: f.m.top + f.ih + 16,
                     "text-anchor": "middle" }, g,
           "stage " + st.stage + (st.replica !== undefined ? " (replica " + st.replica + ")" : ""));
    });
  })();

  // The last step's schedule (Gantt chart) and allocated bytes, from the trace.
  const trace = data.trace;
  if (!trace) {
    for (const id of ["gantt-note", "allocated-note"]) {
      document.getElementById(id).textContent =
          "No trace: run sluice train with --trace FILE and pass it to sluice report --trace.";
    }
  } else {
    const t0 = trace.begin_us, ms = us => (us - t0) / 1000;
    (function () {
      document.getElementById("gantt-note").textContent =
          "One row per stage: computations above (F forward, B backward for inputs, W backward " +
          "for weights, OPT optimizer), communication below (sends, waits for receives, " +
          "all-reduces). The bubble is the share of this step a stage does not compute.";
      const kinds = Object.keys(KIND_COLOURS).filter(
          k => trace.stages.some(s => s.spans.some(sp => sp.kind === k)));
      legend("gantt-legend", kinds.map(k => [k, KIND_COLOURS[k]]));
      const lanes = trace.stages.map(s => Math.max(1, ...s.spans.map(sp => sp.lane + 1)));
      const laneH = 18, rowGap = 10;
      const height = lanes.reduce((a, n) => a + n * laneH + rowGap, 0);
      const f = frame(document.getElementById("gantt"), {
        x: [0, ms(trace.end_us)], y: [0, 1], xlabel: "milliseconds from the step's start",
        ylabel: "", height: height + 48, yfmt: () => "" });
      let y = f.m.top + 4;
      trace.stages.forEach((s, i) => {
        const g = node("g", { class: "gantt-row", "data-stage": s.name }, f.svg);
        node("text", { x: f.m.left - 6, y: y + laneH - 5, "text-anchor": "end" }, g, s.name);
        node("text", { x: f.m.left - 6, y: y + laneH + 8, "text-anchor": "end",
                       class: "bubble" }, g, "bubble " + (100 * s.bubble).toFixed(0) + "%");
        for (const sp of s.spans) {
          const x = f.sx(ms(sp.begin_us)), w = Math.max(0.5, f.sx(ms(sp.begin_us + sp.dur_us)) - x);
          tip(node("rect", { class: "span span-" + sp.kind, x: x, y: y + sp.lane * laneH,
                             width: w, height: laneH - 3, fill: KIND_COLOURS[sp.kind] }, g),
              s.name + ": " + sp.name + ", " + (sp.dur_us / 1000).toFixed(3) + " ms at " +
              ms(sp.begin_us).toFixed(3) + " ms");
        }
        y += lanes[i] * laneH + rowGap;
      });
    })();
    (function () {
      const withMemory = trace.stages.filter(s => s.memory.length > 0);
      if (withMemory.length === 0) {
        document.getElementById("allocated-note").textContent = "The trace holds no allocated-bytes samples.";
        return;
      }
      document.getElementById("allocated-note").textContent =
          "Bytes of tensors each stage holds during the last step (sampled as the step runs).";
      legend("allocated-legend", withMemory.map((s, i) => [s.name, STAGE_COLOURS[i % STAGE_COLOURS.length]]));
      const f = frame(document.getElementById("allocated"), {
        x: [0, ms(trace.end_us)], y: [0, Math.max(...withMemory.flatMap(s => s.memory.map(p => p[1])), 1) * 1.05],
        xlabel: "milliseconds from the step's start", ylabel: "allocated", yfmt: bytes });
      withMemory.forEach((s, i) => {
        // A step function: the value holds until the next sample.
        const xs = [], ys = [];
        s.memory.forEach((p, k) => {
          if (k > 0) { xs.push(ms(p[0])); ys.push(s.memory[k - 1][1]); }
          xs.push(ms(p[0])); ys.push(p[1]);
        });
        xs.push(ms(trace.end_us)); ys.push(s.memory[s.memory.length - 1][1]);
        polyline(f, node("g", { class: "allocated-stage" }, f.svg), xs, ys, f.sy,
                 { stroke: STAGE_COLOURS[i % STAGE_COLOURS.length], "stroke-width": 1.3 });
      });
    })();
  }

  // Configuration.
  const table = document.getElementById("config");
  if (data.config.length === 0) {
    table.insertRow().insertCell().textContent = "No summary line in the metrics.";
  }
  for (const [k, v] of data.config) {
    const row = table.insertRow();
    row.insertCell().textContent = k;
    row.insertCell().textContent = v;
  }
})();
</script>
</body>
</html>
)page";
}

}  // namespace sluice
