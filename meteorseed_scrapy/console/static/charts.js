// MeteorSeed console charts: small SVG line charts drawn by hand (no library, nothing fetched).
// Colours are SVG presentation attributes, not style attributes: the page's CSP forbids inline
// styles. Labels are text nodes, so a site id can never become markup.
"use strict";

const MeteorCharts = (() => {
  const SVG = "http://www.w3.org/2000/svg";
  const W = 360, H = 140, LEFT = 46, RIGHT = 10, TOP = 10, BOTTOM = 22;
  const PALETTE = ["#2f5bd3", "#e8590c", "#0ca678", "#ae3ec9", "#f59f00", "#1098ad",
    "#d6336c", "#5c940d"];

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // 1, 2, 5 x 10^k at or above ``value``: round axis maxima.
  function niceMax(value) {
    if (!(value > 0)) return 1;
    const step = 10 ** Math.floor(Math.log10(value));
    for (const m of [1, 2, 5, 10]) if (m * step >= value) return m * step;
    return 10 * step;
  }

  function label(value, unit) {
    if (value === null || value === undefined) return "–";
    if (unit === "%") return `${(value * 100).toFixed(value < 0.1 && value > 0 ? 1 : 0)} %`;
    const abs = Math.abs(value);
    const text = abs >= 1e6 ? `${(value / 1e6).toFixed(1)}M` : abs >= 1e4
      ? `${(value / 1e3).toFixed(0)}k` : Number.isInteger(value) ? String(value)
        : value.toFixed(abs < 10 ? 2 : 0);
    return unit ? `${text} ${unit}` : text;
  }

  function ago(seconds) {
    if (seconds < 90) return `−${Math.round(seconds)} s`;
    return `−${Math.round(seconds / 60)} min`;
  }

  // series: [{name, values: [number|null per sample]}]; times: epoch seconds per sample.
  // A gap (a null, or samples further apart than 3 intervals) breaks the line.
  function line(id, title, times, series, opts) {
    const unit = (opts && opts.unit) || "";
    const interval = (opts && opts.interval) || 10;
    const figure = document.createElement("figure");
    figure.className = "chart";
    figure.id = id;
    const last = (values) => {
      for (let i = values.length - 1; i >= 0; i -= 1) if (values[i] !== null) return values[i];
      return null;
    };
    const caption = document.createElement("figcaption");
    caption.textContent = series.length === 1
      ? `${title}: ${label(last(series[0].values), unit)}` : title;
    figure.append(caption);
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img",
      "aria-label": title, class: "chart-svg" });
    figure.append(root);
    const t1 = times.length ? times[times.length - 1] : 0;
    const t0 = times.length ? Math.max(times[0], t1 - 3600) : 0;
    const span = Math.max(t1 - t0, interval);
    let top = 0;
    for (const s of series) for (const v of s.values) if (v !== null && v > top) top = v;
    const ymax = unit === "%" ? Math.min(1, niceMax(top || 0.01)) : niceMax(top);
    const x = (t) => LEFT + ((t - (t1 - span)) / span) * (W - LEFT - RIGHT);
    const y = (v) => TOP + (1 - v / ymax) * (H - TOP - BOTTOM);
    for (const v of [0, ymax / 2, ymax]) {
      root.append(svg("line", { x1: LEFT, x2: W - RIGHT, y1: y(v), y2: y(v), stroke: "#e4e7ee",
        "stroke-width": 1 }));
      root.append(svg("text", { x: LEFT - 4, y: y(v) + 4, "text-anchor": "end",
        "font-size": 10, fill: "#667085" }, label(v, unit === "%" ? "%" : "")));
    }
    root.append(svg("text", { x: LEFT, y: H - 6, "font-size": 10, fill: "#667085" },
      times.length ? ago(span) : ""));
    root.append(svg("text", { x: W - RIGHT, y: H - 6, "font-size": 10, fill: "#667085",
      "text-anchor": "end" }, times.length ? "now" : ""));
    if (times.length < 2) {
      root.append(svg("text", { x: (LEFT + W - RIGHT) / 2, y: H / 2, "font-size": 12,
        fill: "#667085", "text-anchor": "middle" },
      times.length ? "needs two samples" : "no sample yet"));
    }
    series.forEach((s, k) => {
      const colour = s.colour || PALETTE[k % PALETTE.length];
      let d = "";
      let previous = null;
      const alone = [];  // points with no neighbour to join: drawn as dots
      s.values.forEach((v, i) => {
        if (v === null || times[i] < t0) { previous = null; return; }
        const joined = previous !== null && times[i] - times[previous] <= 3 * interval;
        const px = x(times[i]).toFixed(1), py = y(Math.min(v, ymax)).toFixed(1);
        d += `${joined ? "L" : "M"}${px},${py}`;
        if (!joined) alone.push([i, px, py]);
        else if (alone.length && alone[alone.length - 1][0] === previous) alone.pop();
        previous = i;
      });
      if (d) {
        root.append(svg("path", { d, fill: "none", stroke: colour, "stroke-width": 1.6,
          "stroke-linejoin": "round", class: "series", "data-series": s.name }));
      }
      for (const [, px, py] of alone) {
        root.append(svg("circle", { cx: px, cy: py, r: 2.2, fill: colour, class: "dot" }));
      }
    });
    if (series.length > 1) {
      const legend = document.createElement("div");
      legend.className = "legend";
      series.forEach((s, k) => {
        const item = document.createElement("span");
        const swatch = svg("svg", { width: 10, height: 10 });
        swatch.append(svg("rect", { width: 10, height: 10,
          fill: s.colour || PALETTE[k % PALETTE.length] }));
        item.append(swatch, ` ${s.name} ${label(last(s.values), unit)}`);
        legend.append(item);
      });
      figure.append(legend);
    }
    return figure;
  }

  return { line };
})();
