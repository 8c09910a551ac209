// The vramscope explorer: draws the bands and moments that inspector/src/html/explorer.rs
// precomputed. No network, no library: canvas drawing only. Errors are written into #errors,
// which the browser test reads.
"use strict";
(function () {
  const errorList = document.getElementById("errors");
  function fail(message) {
    const li = document.createElement("li");
    li.textContent = String(message);
    errorList.appendChild(li);
    errorList.hidden = false;
    document.body.dataset.errors = String(errorList.children.length);
  }
  window.addEventListener("error", (e) => fail(e.message + " (line " + e.lineno + ")"));
  const consoleError = console.error;
  console.error = function (...args) {
    fail(args.join(" "));
    consoleError.apply(console, args);
  };
  try {
    main();
  } catch (e) {
    fail((e && e.stack) || e);
  }

  // pool:begin
  // The columns k0..k1 as drawn: consecutive columns whose left edges fall in one device
  // pixel (`scale` device pixels to a CSS pixel) are one drawn column spanning them, with the
  // bands of the one whose `height` is highest (the first of equals) and the highest
  // `reserved` among them; a column wider than a pixel is drawn as it is. So a spike
  // narrower than a pixel keeps its height and its place. Returns {k, x0, x1, r} in order.
  function poolColumns(k0, k1, left, right, height, reserved, scale) {
    const cols = [];
    let cur = null;
    for (let k = k0; k <= k1; k++) {
      const x0 = left(k), x1 = right(k);
      const px = Math.floor(x0 * scale);
      const r = reserved ? reserved(k) : 0;
      if (cur && px === cur.px) {
        if (height(k) > height(cur.k)) cur.k = k;
        cur.x1 = Math.max(cur.x1, x1);
        cur.r = Math.max(cur.r, r);
      } else {
        cur = { px, k, x0, x1, r };
        cols.push(cur);
      }
    }
    // Each drawn column covers whole device pixels, so the highest column of a pixel is drawn
    // opaque there, not blended half into its neighbours: it starts at its pixel and ends where
    // the next one starts (the last one at the pixel edge past its end).
    return cols.map((c, i) => {
      const end = i === cols.length - 1 ? Math.ceil(c.x1 * scale) : Math.floor(c.x1 * scale);
      return { k: c.k, x0: c.px / scale, x1: Math.max(c.px + 1, end) / scale, r: c.r };
    });
  }
  // pool:end

  function main() {
    const D = JSON.parse(document.getElementById("vs-data").textContent);
    const F = JSON.parse(document.getElementById("vs-findings").textContent);
    // A reader of the page's compact strings (html/compact.rs): LEB128 varints in base64.
    // num() reads a number, exact below 2^53 as JSON's are; big() a BigInt, exact for any u64.
    function varints(b64, what) {
      const text = atob(b64);
      const bytes = new Uint8Array(text.length);
      for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
      let at = 0;
      const byte = () => {
        if (at >= bytes.length) throw new Error(what + " is cut short");
        return bytes[at++];
      };
      const big = () => {
        let v = 0n, shift = 0n;
        for (;;) {
          const b = byte();
          v |= BigInt(b & 127) << shift;
          if (!(b & 128)) return v;
          shift += 7n;
        }
      };
      const num = () => {
        const start = at;
        let v = 0, mul = 1;
        for (;;) {
          const b = byte();
          v += (b & 127) * mul;
          if (!(b & 128)) return v;
          mul *= 128;
          if (mul >= 2 ** 49) { at = start; return Number(big()); }
        }
      };
      return { num, big };
    }
    // The step marks: their count, then per step its number and position less the previous
    // step's, zigzag-coded (0, -1, 1, -2… as 0, 1, 2, 3…).
    D.steps = (() => {
      const { num } = varints(D.steps, "the step marks");
      const unzigzag = (v) => (v % 2 ? -(v + 1) / 2 : v / 2);
      const steps = [];
      let step = 0, pos = 0;
      for (let n = num(); n > 0; n--) {
        step += unzigzag(num());
        pos += unzigzag(num());
        steps.push({ step, pos });
      }
      return steps;
    })();
    const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948",
      "#b07aa1", "#ff9da7", "#9c755f", "#2f8f9d", "#8cd17d", "#d37295"];
    const nb = D.bucket_start.length;
    const S = D.series.length;
    const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    // The same rounding as the report's format_bytes.
    function fmt(b) {
      if (b < 1024) return b + " B";
      let v = b, u = 0;
      while (v >= 1024 && u < UNITS.length - 1) { v /= 1024; u++; }
      return (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)) + " " + UNITS[u];
    }
    // A path shortened to its last two parts, for the legend and tables (the full one on hover).
    function short(label) {
      const parts = label.split(/[\\/]/);
      if (parts.length <= 3) return label;
      const sep = label.includes("/") ? "/" : "\\";
      return "…" + sep + parts.slice(-2).join(sep);
    }
    function el(tag, text, cls) {
      const e = document.createElement(tag);
      if (text !== undefined) e.textContent = text;
      if (cls) e.className = cls;
      return e;
    }
    const colors = D.series.map((s, i) => {
      if (s.kind === "before") return "#b9a27a";
      if (s.kind === "other") return "#c4c4c4";
      return PALETTE[(i - (D.series[0] && D.series[0].kind === "before" ? 1 : 0)) % PALETTE.length];
    });
    const seriesOfGroup = new Map();
    D.series.forEach((s, i) => { if (s.group !== null) seriesOfGroup.set(s.group, i); });
    const otherSeries = D.series.findIndex((s) => s.kind === "other");
    function groupColor(g) {
      const s = seriesOfGroup.has(g) ? seriesOfGroup.get(g) : otherSeries;
      return s >= 0 ? colors[s] : "#c4c4c4";
    }
    // Cumulative band tops, bottom band first.
    const cum = [];
    let acc = new Float64Array(nb);
    for (let s = 0; s < S; s++) {
      const next = new Float64Array(nb);
      const v = D.values[s];
      for (let k = 0; k < nb; k++) next[k] = acc[k] + v[k];
      cum.push(next);
      acc = next;
    }

    // Positions, times and buckets.
    let useTime = D.has_time;
    function bucketOfPos(p) {
      let lo = 0, hi = nb - 1;
      while (lo < hi) {
        const mid = (lo + hi + 1) >> 1;
        if (D.bucket_start[mid] <= p) lo = mid; else hi = mid - 1;
      }
      return lo;
    }
    function timeOfPos(p) {
      const k = bucketOfPos(p);
      const p0 = D.bucket_start[k], t0 = D.bucket_time[k];
      const p1 = k + 1 < nb ? D.bucket_start[k + 1] : D.events;
      const t1 = k + 1 < nb ? D.bucket_time[k + 1] : D.duration_ns;
      return p1 > p0 ? t0 + (t1 - t0) * (p - p0) / (p1 - p0) : t0;
    }
    function domainOfPos(p) { return useTime ? timeOfPos(p) : p; }
    function bucketLeft(k) { return useTime ? D.bucket_time[k] : D.bucket_start[k]; }
    function bucketRight(k) {
      if (k + 1 < nb) return bucketLeft(k + 1);
      return useTime ? D.duration_ns : D.events;
    }
    function domainEnd() { return Math.max(useTime ? D.duration_ns : D.events, 1); }
    function bucketAtDomain(x) {
      let lo = 0, hi = nb - 1;
      while (lo < hi) {
        const mid = (lo + hi + 1) >> 1;
        if (bucketLeft(mid) <= x) lo = mid; else hi = mid - 1;
      }
      return lo;
    }

    // State of the view.
    const peakBucket = bucketOfPos(D.peak_pos);
    let view = [0, domainEnd()];
    let cursor = peakBucket;
    // The position the tables show: the cursor column's, or exactly the end after E.
    let cursorPos = D.bucket_pos[peakBucket];
    let pinned = -1;
    let finding = -1;

    // The chart.
    const canvas = document.getElementById("chart");
    const ctx = canvas.getContext("2d");
    const tip = document.getElementById("tip");
    const M = { left: 78, right: 14, top: 22, bottom: 34 };
    let W = 0, H = 0;
    function resize() {
      const dpr = window.devicePixelRatio || 1;
      W = canvas.clientWidth || 1000;
      H = canvas.clientHeight || 380;
      canvas.width = Math.round(W * dpr);
      canvas.height = Math.round(H * dpr);
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    }
    const plotW = () => W - M.left - M.right;
    const plotH = () => H - M.top - M.bottom;
    const xOf = (d) => M.left + (d - view[0]) / (view[1] - view[0]) * plotW();
    const domainOfX = (x) => view[0] + (x - M.left) / plotW() * (view[1] - view[0]);
    let yTop = 1;
    const yOf = (b) => M.top + plotH() - b / yTop * plotH();
    function tickStep(top) {
      let step = 1;
      while (Math.ceil(top / step) > 6 && step < 2 ** 62) step *= 2;
      return step;
    }
    function niceStep(span, count) {
      const raw = span / count;
      const mag = Math.pow(10, Math.floor(Math.log10(Math.max(raw, 1e-12))));
      for (const m of [1, 2, 5, 10]) if (m * mag >= raw) return m * mag;
      return 10 * mag;
    }
    function fmtTime(ns, step) {
      const s = ns / 1e9;
      const digits = Math.max(0, Math.min(6, -Math.floor(Math.log10(Math.max(step / 1e9, 1e-9)))));
      return s.toFixed(digits) + " s";
    }
    let drawn = 0;
    const selfTesting = location.hash === "#selftest";
    let peakPixel = -1;
    function draw() {
      const t0 = performance.now();
      ctx.clearRect(0, 0, W, H);
      ctx.font = "11px system-ui, sans-serif";
      const k0 = bucketAtDomain(view[0]);
      const k1 = bucketAtDomain(view[1]);
      // The y range: what is visible.
      let top = 1;
      for (let k = k0; k <= k1; k++) {
        top = Math.max(top, D.allocated[k]);
        if (D.reserved.length) top = Math.max(top, D.reserved[k]);
      }
      const cap = D.capacity && D.capacity <= top * 2 ? D.capacity : null;
      if (cap) top = Math.max(top, cap);
      const step = tickStep(top);
      yTop = Math.ceil(top / step) * step;
      // Grid and y labels.
      ctx.textAlign = "right";
      ctx.fillStyle = "#555";
      for (let b = 0; b <= yTop; b += step) {
        const y = yOf(b);
        ctx.strokeStyle = "#ececec";
        ctx.beginPath(); ctx.moveTo(M.left, y); ctx.lineTo(W - M.right, y); ctx.stroke();
        ctx.fillText(fmt(b), M.left - 6, y + 4);
      }
      // Finding's steps.
      if (finding >= 0) {
        const r = findingRange(F[finding]);
        if (r) {
          ctx.fillStyle = "rgba(255, 200, 0, 0.18)";
          const a = Math.max(M.left, xOf(domainOfPos(r[0])));
          const b = Math.min(W - M.right, xOf(domainOfPos(r[1])));
          if (b > a) ctx.fillRect(a, M.top, Math.max(b - a, 2), plotH());
        }
      }
      ctx.save();
      ctx.beginPath(); ctx.rect(M.left, M.top, plotW(), plotH()); ctx.clip();
      // Several columns in one pixel are drawn as one, with the bands of its highest column:
      // a spike narrower than a pixel is drawn at its height, where it is (issue 42).
      const cols = poolColumns(k0, k1, (k) => xOf(bucketLeft(k)), (k) => xOf(bucketRight(k)),
        (k) => D.allocated[k], D.reserved.length ? (k) => D.reserved[k] : null,
        window.devicePixelRatio || 1);
      // The bands, bottom first, each between the one below and its own top, as steps.
      for (let s = 0; s < S && cols.length; s++) {
        const upper = cum[s];
        const lower = s > 0 ? cum[s - 1] : null;
        ctx.globalAlpha = pinned < 0 || pinned === s ? 0.92 : 0.22;
        ctx.fillStyle = colors[s];
        ctx.beginPath();
        ctx.moveTo(cols[0].x0, yOf(lower ? lower[cols[0].k] : 0));
        for (const c of cols) {
          const y = yOf(upper[c.k]);
          ctx.lineTo(c.x0, y);
          ctx.lineTo(c.x1, y);
        }
        for (let i = cols.length - 1; i >= 0; i--) {
          const c = cols[i];
          const y = yOf(lower ? lower[c.k] : 0);
          ctx.lineTo(c.x1, y);
          ctx.lineTo(c.x0, y);
        }
        ctx.closePath();
        ctx.fill();
      }
      ctx.globalAlpha = 1;
      if (selfTesting) {
        // Whether the bands reach the peak where the peak's dot is: the most opaque of the
        // three pixels just below it.
        const dpr = window.devicePixelRatio || 1;
        const px = xOf(bucketLeft(peakBucket) + (bucketRight(peakBucket) - bucketLeft(peakBucket)) / 2);
        const below = ctx.getImageData(Math.floor(px * dpr) - 1, Math.floor((yOf(D.peak_allocated) + 2) * dpr), 3, 1).data;
        peakPixel = Math.max(below[3], below[7], below[11]);
      }
      // Reserved bytes: each drawn column's highest.
      if (D.reserved.length) {
        ctx.strokeStyle = "#222";
        ctx.lineWidth = 1.2;
        ctx.beginPath();
        cols.forEach((c, i) => {
          const y = yOf(c.r);
          if (i === 0) ctx.moveTo(c.x0, y); else ctx.lineTo(c.x0, y);
          ctx.lineTo(c.x1, y);
        });
        ctx.stroke();
        ctx.lineWidth = 1;
      }
      if (cap) {
        ctx.strokeStyle = "#c62828"; ctx.setLineDash([6, 3]);
        ctx.beginPath(); ctx.moveTo(M.left, yOf(cap)); ctx.lineTo(W - M.right, yOf(cap)); ctx.stroke();
        ctx.setLineDash([]);
        ctx.fillStyle = "#c62828"; ctx.textAlign = "right";
        ctx.fillText("capacity " + fmt(cap), W - M.right - 4, yOf(cap) - 4);
      }
      // Step marks: every k-th step (k of 1, 2, 5, 10, 20…) so that marks stay at least 6 px
      // apart and labels never overlap.
      const visible = D.steps.filter((st) => {
        const x = xOf(domainOfPos(st.pos));
        return x >= M.left && x <= W - M.right;
      });
      const every = (minPx) => {
        for (let base = 1; ; base *= 10) {
          for (const m of [1, 2, 5]) {
            const k = base * m;
            const n = visible.filter((st) => st.step % k === 0).length;
            if (n * minPx <= plotW() || k > 1e15) return k;
          }
        }
      };
      const markEvery = every(6);
      const widest = ctx.measureText(String(D.steps.length ? D.steps[D.steps.length - 1].step : 0)).width;
      const labelEvery = Math.max(markEvery, every(widest + 12));
      ctx.strokeStyle = "rgba(90, 90, 90, 0.45)";
      ctx.setLineDash([3, 3]);
      ctx.textAlign = "left";
      ctx.fillStyle = "#666";
      let lastLabelEnd = -Infinity;
      for (const st of visible) {
        if (st.step % markEvery !== 0) continue;
        const x = xOf(domainOfPos(st.pos));
        ctx.beginPath(); ctx.moveTo(x, M.top); ctx.lineTo(x, M.top + plotH()); ctx.stroke();
        if (st.step % labelEvery !== 0) continue;
        const label = String(st.step);
        const w = ctx.measureText(label).width;
        if (x + 2 > lastLabelEnd + 6 && x + 2 + w < W - M.right) {
          ctx.fillText(label, x + 2, M.top + 10);
          lastLabelEnd = x + 2 + w;
        }
      }
      ctx.setLineDash([]);
      // The host's waits for the device: short ticks along the top.
      ctx.strokeStyle = "#ef6c00";
      for (const p of (D.waits || [])) {
        const x = xOf(domainOfPos(p));
        if (x < M.left || x > W - M.right) continue;
        ctx.beginPath(); ctx.moveTo(x, M.top); ctx.lineTo(x, M.top + 8); ctx.stroke();
      }
      for (const p of D.ooms) {
        const x = xOf(domainOfPos(p));
        ctx.strokeStyle = "#c62828"; ctx.lineWidth = 2;
        ctx.beginPath(); ctx.moveTo(x, M.top); ctx.lineTo(x, M.top + plotH()); ctx.stroke();
        ctx.lineWidth = 1;
      }
      // The peak.
      const px = xOf(bucketLeft(peakBucket) + (bucketRight(peakBucket) - bucketLeft(peakBucket)) / 2);
      ctx.strokeStyle = "#c62828";
      ctx.beginPath(); ctx.moveTo(px, yOf(D.peak_allocated)); ctx.lineTo(px, M.top + plotH()); ctx.stroke();
      ctx.fillStyle = "#c62828";
      ctx.beginPath(); ctx.arc(px, yOf(D.peak_allocated), 4, 0, 7); ctx.fill();
      // The cursor.
      const cx = xOf(bucketLeft(cursor));
      ctx.strokeStyle = "#111"; ctx.setLineDash([2, 2]);
      ctx.beginPath(); ctx.moveTo(cx, M.top); ctx.lineTo(cx, M.top + plotH()); ctx.stroke();
      ctx.setLineDash([]);
      ctx.restore();
      const label = "peak " + fmt(D.peak_allocated) + " at event " + D.peak_pos;
      ctx.textAlign = px > W / 2 ? "right" : "left";
      ctx.fillStyle = "#c62828";
      ctx.fillText(label, px + (px > W / 2 ? -6 : 6), Math.max(M.top + 22, yOf(D.peak_allocated) - 6));
      // x axis.
      ctx.strokeStyle = "#888";
      ctx.beginPath(); ctx.moveTo(M.left, M.top + plotH()); ctx.lineTo(W - M.right, M.top + plotH()); ctx.stroke();
      const span = view[1] - view[0];
      const xs = niceStep(span, Math.max(2, Math.floor(plotW() / 110)));
      ctx.fillStyle = "#555"; ctx.textAlign = "center";
      for (let d = Math.ceil(view[0] / xs) * xs; d <= view[1]; d += xs) {
        const x = xOf(d);
        ctx.beginPath(); ctx.moveTo(x, M.top + plotH()); ctx.lineTo(x, M.top + plotH() + 4); ctx.stroke();
        ctx.fillText(useTime ? fmtTime(d, xs) : "event " + Math.round(d), x, M.top + plotH() + 16);
      }
      ctx.textAlign = "left";
      ctx.fillText(useTime ? "time since the first event" : "event index", M.left, H - 4);
      drawCategories();
      drawn += 1;
      document.getElementById("draw-ms").textContent = (performance.now() - t0).toFixed(1);
    }

    // The positions of a finding's steps, which the report worked out from all the steps
    // (the page may carry them thinned).
    function findingRange(f) {
      return f.range;
    }

    // The legend.
    const legend = document.getElementById("legend");
    D.series.slice().reverse().forEach((s) => {
      const i = D.series.indexOf(s);
      const item = el("span", "", "item");
      const sw = el("i", "", "swatch");
      sw.style.background = colors[i];
      item.appendChild(sw);
      item.appendChild(document.createTextNode(short(s.label) + " (max " + fmt(s.max) + ")"));
      item.title = s.label;
      item.dataset.series = String(i);
      item.addEventListener("click", () => { pin(pinned === i ? -1 : i); });
      legend.appendChild(item);
    });
    if (D.reserved.length) legend.appendChild(el("span", "— reserved", "item"));
    if (D.capacity) legend.appendChild(el("span", "- - capacity " + fmt(D.capacity), "item cap"));
    document.getElementById("band-count").textContent = String(S);
    document.getElementById("band-count").dataset.count = String(S);

    // The site table and the segment map at the cursor.
    function nearestMoment(pos) {
      let best = D.moments[0];
      for (const m of D.moments) if (Math.abs(m.pos - pos) < Math.abs(best.pos - pos)) best = m;
      return best;
    }
    function fillTable() {
      const exact = D.moments.find((m) => m.pos === cursorPos);
      const pos = exact ? cursorPos : D.bucket_pos[cursor];
      const body = document.querySelector("#site-table tbody");
      body.textContent = "";
      const title = document.getElementById("table-title");
      let total = 0;
      const row = (label, fn, bytes, blocks, color, series, stack) => {
        const tr = el("tr");
        tr.dataset.bytes = String(bytes);
        if (series >= 0) tr.dataset.series = String(series);
        if (series >= 0 && series === pinned) tr.className = "pinned";
        const td = el("td");
        const sw = el("i", "", "swatch");
        sw.style.background = color;
        td.appendChild(sw);
        const code = el("code", short(label));
        code.title = label;
        td.appendChild(code);
        if (fn) td.appendChild(el("span", " " + fn, "muted"));
        if (stack && stack.length) td.title = stack.join("\n");
        tr.appendChild(td);
        tr.appendChild(el("td", fmt(bytes), "num"));
        tr.appendChild(el("td", blocks === null ? "" : String(blocks), "num"));
        tr.addEventListener("click", () => { if (series >= 0) pin(pinned === series ? -1 : series); });
        body.appendChild(tr);
        total += bytes;
      };
      if (exact) {
        for (const [g, bytes, blocks] of exact.sites) {
          const info = D.groups[g];
          const s = seriesOfGroup.has(g) ? seriesOfGroup.get(g) : otherSeries;
          row(info.label, info.function, bytes, blocks, groupColor(g), s, info.stack);
        }
        if (exact.rest[0] > 0) row("(" + exact.rest[0] + " more sites)", "", exact.rest[1], exact.rest[2], "#c4c4c4", -1, null);
        title.textContent = "Live at the " + (exact.name.startsWith("event") ? "cursor" : exact.name) +
          " (after " + pos + " events): " + fmt(exact.allocated);
      } else {
        const order = [];
        for (let s = 0; s < S; s++) if (D.values[s][cursor] > 0) order.push(s);
        order.sort((a, b) => D.values[b][cursor] - D.values[a][cursor]);
        for (const s of order) {
          const g = D.series[s].group;
          const info = g === null ? null : D.groups[g];
          row(D.series[s].label, info ? info.function : "", D.values[s][cursor], null, colors[s], s, info ? info.stack : null);
        }
        title.textContent = "Live at the cursor (after " + pos + " events): " + fmt(D.allocated[cursor]);
      }
      const foot = document.querySelector("#site-table tfoot");
      foot.textContent = "";
      const tr = el("tr");
      tr.appendChild(el("th", "total"));
      const sum = el("th", fmt(total), "num");
      sum.id = "table-total";
      sum.dataset.bytes = String(total);
      tr.appendChild(sum);
      tr.appendChild(el("th", ""));
      foot.appendChild(tr);
      drawSegments(exact || nearestMoment(pos));
      fillCategoryLegend();
      drawIcicle(exact || nearestMoment(pos));
    }

    const seg = document.getElementById("segmap");
    const sctx = seg.getContext("2d");
    let segRows = [];
    // A moment's segment map, decoded from its compact form (html/compact.rs) when the cursor
    // first shows it: the number of rows, then per row its address less the previous row's,
    // size, flags (1 small pool, 2 expandable) and block count, then per block its offset less
    // the previous block's, size and group times two plus 1 when waiting to be freed.
    // Addresses are BigInts until written as hex, so that any 64-bit address comes out exact.
    const maps = new Map();
    function mapOf(m) {
      if (maps.has(m)) return maps.get(m);
      const { num, big } = varints(m.map, "the segment map of " + m.name);
      const rows = [];
      let addr = 0n;
      for (let r = num(); r > 0; r--) {
        addr = (addr + big()) & 0xffffffffffffffffn;
        const size = num(), flags = num(), count = num();
        const blocks = [];
        let off = 0;
        for (let b = 0; b < count; b++) {
          off += num();
          const bsize = num(), tagged = num();
          blocks.push(off, bsize, tagged % 2, Math.floor(tagged / 2));
        }
        rows.push({ addr: "0x" + addr.toString(16), size, pool: flags & 1 ? "s" : "L", expandable: (flags & 2) !== 0, blocks });
      }
      maps.set(m, rows);
      return rows;
    }
    function drawSegments(m) {
      const title = document.getElementById("segmap-title");
      const note = document.getElementById("segmap-note");
      title.textContent = "Segments at the " + (m.name.startsWith("event") ? "moment nearest the cursor" : m.name) +
        " (after " + m.pos + " events)";
      note.textContent = "";
      if (!m.segment_count) {
        note.textContent = "The trace records no segments" + (m.orphan_bytes ? " (" + fmt(m.orphan_bytes) + " live outside any known segment)." : ".");
        seg.height = 0; seg.style.height = "0px";
        segRows = [];
        return;
      }
      const rows = mapOf(m);
      const dpr = window.devicePixelRatio || 1;
      const w = seg.clientWidth || 600, rowH = 16, gap = 3, labelW = 200;
      const h = rows.length * (rowH + gap) + 4;
      seg.style.height = h + "px";
      seg.width = Math.round(w * dpr); seg.height = Math.round(h * dpr);
      sctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      sctx.font = "11px ui-monospace, monospace";
      const maxSize = Math.max(...rows.map((r) => r.size));
      segRows = [];
      let split = 0;
      rows.forEach((r, i) => {
        const y = 2 + i * (rowH + gap);
        const width = Math.max(40, (w - labelW - 6) * r.size / maxSize);
        const x0 = labelW;
        const scale = width / r.size;
        const live = r.blocks.length > 0;
        sctx.fillStyle = live ? "#f3b3b3" : "#e4e4e4";
        sctx.fillRect(x0, y, width, rowH);
        for (let b = 0; b < r.blocks.length; b += 4) {
          const off = r.blocks[b], size = r.blocks[b + 1], pending = r.blocks[b + 2], g = r.blocks[b + 3];
          sctx.fillStyle = pending ? "#6d4c41" : groupColor(g);
          sctx.fillRect(x0 + off * scale, y, Math.max(size * scale, 0.5), rowH);
        }
        sctx.strokeStyle = "#999";
        sctx.strokeRect(x0 + 0.5, y + 0.5, width - 1, rowH - 1);
        sctx.fillStyle = "#333";
        sctx.fillText(r.addr + " " + r.pool + (r.expandable ? "e" : " ") + " " + fmt(r.size), 2, y + 12);
        segRows.push({ y, x0, width, r });
        if (live) split += 1;
      });
      if (m.segment_count > rows.length) note.textContent += (m.segment_count - rows.length) + " more segments not drawn. ";
      if (m.blocks_left_out) note.textContent += m.blocks_left_out + " blocks left out of the map to bound the file's size. ";
      note.textContent += m.segment_count + " segments, " + split + " holding live blocks; reserved " + fmt(m.reserved) + ".";
    }
    seg.addEventListener("mousemove", (ev) => {
      const rect = seg.getBoundingClientRect();
      const x = ev.clientX - rect.left, y = ev.clientY - rect.top;
      const row = segRows.find((s) => y >= s.y && y < s.y + 16);
      if (!row || x < row.x0 || x > row.x0 + row.width) { tip.hidden = true; return; }
      const off = (x - row.x0) / row.width * row.r.size;
      const b = row.r.blocks;
      let text = row.r.addr + " (" + (row.r.pool === "s" ? "small" : "large") + " pool" + (row.r.expandable ? ", expandable" : "") + ")\n";
      let found = false;
      for (let i = 0; i < b.length; i += 4) {
        if (off >= b[i] && off < b[i] + b[i + 1]) {
          const info = D.groups[b[i + 3]];
          text += (b[i + 2] ? "waiting to be freed: " : "allocated: ") + fmt(b[i + 1]) + " at +" + b[i].toString(16) + "\n" + info.label + (info.function ? " " + info.function : "");
          found = true;
          break;
        }
      }
      if (!found) text += b.length ? "free (inactive split)" : "free";
      showTip(ev, text);
    });
    seg.addEventListener("mouseleave", () => { tip.hidden = true; });

    function showTip(ev, text) {
      tip.textContent = text;
      tip.hidden = false;
      const x = Math.min(ev.pageX + 14, document.documentElement.scrollWidth - 420);
      tip.style.left = x + "px";
      tip.style.top = ev.pageY + 14 + "px";
    }

    function pin(s) {
      pinned = s;
      document.querySelectorAll("#legend .item").forEach((it) => {
        it.classList.toggle("pinned", it.dataset.series === String(s));
      });
      document.querySelectorAll("#findings tr[data-finding]").forEach((tr) => {
        const f = F[Number(tr.dataset.finding)];
        tr.classList.toggle("related", s >= 0 && f.site !== null && f.site === D.series[s].label);
      });
      fillTable();
      draw();
    }
    function setCursor(k, pos) {
      cursor = Math.max(0, Math.min(nb - 1, k));
      cursorPos = pos === undefined ? D.bucket_pos[cursor] : pos;
      const l = bucketLeft(cursor);
      if (l < view[0] || l > view[1]) {
        const span = view[1] - view[0];
        view = clampView([l - span / 2, l + span / 2]);
      }
      fillTable();
      draw();
    }
    function clampView(v) {
      const end = domainEnd();
      let span = Math.min(Math.max(v[1] - v[0], end / 1e7, 1e-9), end);
      let a = Math.max(0, Math.min(v[0], end - span));
      return [a, a + span];
    }
    function zoom(factor, at) {
      const a = at - (at - view[0]) * factor;
      const b = at + (view[1] - at) * factor;
      view = clampView([a, b]);
      draw();
    }

    // Mouse: hover shows the band, click pins it and moves the cursor, drag pans, wheel zooms.
    let drag = null;
    canvas.addEventListener("mousemove", (ev) => {
      const rect = canvas.getBoundingClientRect();
      const x = ev.clientX - rect.left, y = ev.clientY - rect.top;
      if (drag) {
        const dx = x - drag.x;
        if (Math.abs(dx) > 3) drag.moved = true;
        const d = dx / plotW() * (drag.view[1] - drag.view[0]);
        view = clampView([drag.view[0] - d, drag.view[1] - d]);
        draw();
        return;
      }
      const hit = hitTest(x, y);
      if (!hit) { tip.hidden = true; return; }
      const { k, s } = hit;
      let text = "after " + D.bucket_pos[k] + " events" + (useTime && D.bucket_time.length ? " (" + fmtTime(timeOfPos(D.bucket_pos[k]), 1e6) + ")" : "") +
        ": allocated " + fmt(D.allocated[k]) + (D.reserved.length ? ", reserved " + fmt(D.reserved[k]) : "");
      if (s >= 0) {
        const g = D.series[s].group;
        const info = g === null ? null : D.groups[g];
        text = D.series[s].label + (info && info.function ? "  " + info.function : "") + "\n" + fmt(D.values[s][k]) + " live\n" + text;
        if (info && info.stack.length) text += "\n\n" + info.stack.slice(0, 14).join("\n");
      }
      showTip(ev, text);
    });
    canvas.addEventListener("mouseleave", () => { tip.hidden = true; drag = null; });
    canvas.addEventListener("mousedown", (ev) => {
      const rect = canvas.getBoundingClientRect();
      drag = { x: ev.clientX - rect.left, view: view.slice(), moved: false };
    });
    canvas.addEventListener("mouseup", (ev) => {
      const rect = canvas.getBoundingClientRect();
      const x = ev.clientX - rect.left, y = ev.clientY - rect.top;
      const moved = drag && drag.moved;
      drag = null;
      if (moved) return;
      const hit = hitTest(x, y);
      if (!hit) return;
      cursor = hit.k;
      cursorPos = D.bucket_pos[hit.k];
      pin(hit.s === pinned ? -1 : hit.s);
    });
    canvas.addEventListener("wheel", (ev) => {
      ev.preventDefault();
      const rect = canvas.getBoundingClientRect();
      zoom(ev.deltaY > 0 ? 1.25 : 0.8, domainOfX(ev.clientX - rect.left));
    }, { passive: false });
    function hitTest(x, y) {
      if (x < M.left || x > W - M.right || y < M.top || y > M.top + plotH()) return null;
      const k = bucketAtDomain(domainOfX(x));
      const b = (M.top + plotH() - y) / plotH() * yTop;
      let s = -1;
      for (let i = 0; i < S; i++) {
        if (b <= cum[i][k] && D.values[i][k] > 0) { s = i; break; }
      }
      return { k, s };
    }
    document.addEventListener("keydown", (ev) => {
      if (ev.target && (ev.target.tagName === "INPUT" || ev.target.tagName === "TEXTAREA")) return;
      const mid = (view[0] + view[1]) / 2, span = view[1] - view[0];
      const actions = {
        "+": () => zoom(0.8, bucketLeft(cursor)), "=": () => zoom(0.8, bucketLeft(cursor)),
        "-": () => zoom(1.25, bucketLeft(cursor)),
        "0": () => { view = [0, domainEnd()]; draw(); },
        "[": () => { view = clampView([view[0] - span / 4, view[1] - span / 4]); draw(); },
        "]": () => { view = clampView([view[0] + span / 4, view[1] + span / 4]); draw(); },
        "ArrowLeft": () => setCursor(cursor - (ev.shiftKey ? 10 : 1)),
        "ArrowRight": () => setCursor(cursor + (ev.shiftKey ? 10 : 1)),
        "p": () => setCursor(peakBucket), "P": () => setCursor(peakBucket),
        "r": () => { if (D.peak_reserved_pos !== null) setCursor(bucketOfPos(D.peak_reserved_pos)); },
        "e": () => setCursor(nb - 1, D.events), "E": () => setCursor(nb - 1, D.events),
        "t": () => toggleTime(), "T": () => toggleTime(),
        "Escape": () => { finding = -1; pin(-1); },
      };
      const act = actions[ev.key];
      if (act) { ev.preventDefault(); act(); }
      void mid;
    });
    function toggleTime() {
      if (!D.has_time) return;
      const a = bucketAtDomain(view[0]), b = bucketAtDomain(view[1]);
      useTime = !useTime;
      view = clampView([bucketLeft(a), bucketRight(b)]);
      document.getElementById("axis-mode").textContent = useTime ? "time" : "events";
      draw();
    }
    document.getElementById("go-peak").addEventListener("click", () => setCursor(peakBucket));
    document.getElementById("go-end").addEventListener("click", () => setCursor(nb - 1, D.events));
    document.getElementById("reset-zoom").addEventListener("click", () => { view = [0, domainEnd()]; draw(); });
    const axisButton = document.getElementById("toggle-axis");
    if (D.has_time) axisButton.addEventListener("click", toggleTime); else axisButton.disabled = true;
    document.getElementById("axis-mode").textContent = useTime ? "time" : "events";

    // Findings: selecting one pins its site and shades its steps.
    document.querySelectorAll("#findings tr[data-finding]").forEach((tr) => {
      tr.addEventListener("click", () => {
        const i = Number(tr.dataset.finding);
        finding = finding === i ? -1 : i;
        document.querySelectorAll("#findings tr[data-finding]").forEach((t) => t.classList.toggle("selected", Number(t.dataset.finding) === finding));
        const f = F[i];
        const s = finding >= 0 && f.site !== null ? D.series.findIndex((x) => x.label === f.site) : -1;
        const r = finding >= 0 ? findingRange(f) : null;
        if (r) {
          const a = domainOfPos(r[0]), b = domainOfPos(r[1]);
          const pad = (b - a) * 0.1 + 1e-9;
          view = clampView([a - pad, b + pad]);
        }
        pin(s);
        document.getElementById("chart").scrollIntoView({ block: "nearest" });
      });
    });

    // What the memory is made of (issue 46): each column's allocated bytes by category,
    // stacked over the chart's window, a legend with each category's bytes at the cursor, and
    // an icicle of the live bytes by the user's call tree at the moment the tables show.
    const CAT_COLORS = { activations: "#e15759", parameters: "#4e79a7", optimizer_state: "#b07aa1",
      gradients: "#edc948", temporaries: "#76b7b2", inputs: "#59a14f", before_trace: "#b9a27a", unknown: "#c4c4c4" };
    const CAT_ORDER = ["activations", "parameters", "optimizer_state", "gradients", "temporaries", "inputs", "before_trace", "unknown"];
    const C = D.categories || [];
    const catCum = [];
    let catAcc = new Float64Array(nb);
    for (const band of C) {
      const next = new Float64Array(nb);
      for (let k = 0; k < nb; k++) next[k] = catAcc[k] + band.values[k];
      catCum.push(next);
      catAcc = next;
    }
    const catCanvas = document.getElementById("cat-chart");
    const cctx = catCanvas.getContext("2d");
    function drawCategories() {
      const dpr = window.devicePixelRatio || 1;
      const w = catCanvas.clientWidth || 1000, h = catCanvas.clientHeight || 220;
      catCanvas.width = Math.round(w * dpr); catCanvas.height = Math.round(h * dpr);
      cctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      cctx.clearRect(0, 0, w, h);
      cctx.font = "11px system-ui, sans-serif";
      if (!C.length) return;
      const ph = h - M.top - M.bottom;
      const k0 = bucketAtDomain(view[0]), k1 = bucketAtDomain(view[1]);
      let top = 1;
      for (let k = k0; k <= k1; k++) top = Math.max(top, catCum[C.length - 1][k]);
      const step = tickStep(top);
      const yMax = Math.ceil(top / step) * step;
      const y = (b) => M.top + ph - b / yMax * ph;
      cctx.textAlign = "right"; cctx.fillStyle = "#555";
      for (let b = 0; b <= yMax; b += step) {
        cctx.strokeStyle = "#ececec";
        cctx.beginPath(); cctx.moveTo(M.left, y(b)); cctx.lineTo(w - M.right, y(b)); cctx.stroke();
        cctx.fillText(fmt(b), M.left - 6, y(b) + 4);
      }
      const sx = (d) => M.left + (d - view[0]) / (view[1] - view[0]) * (w - M.left - M.right);
      cctx.save();
      cctx.beginPath(); cctx.rect(M.left, M.top, w - M.left - M.right, ph); cctx.clip();
      const cols = poolColumns(k0, k1, (k) => sx(bucketLeft(k)), (k) => sx(bucketRight(k)),
        (k) => D.allocated[k], null, dpr);
      C.forEach((band, s) => {
        if (!cols.length) return;
        const upper = catCum[s], lower = s > 0 ? catCum[s - 1] : null;
        cctx.fillStyle = CAT_COLORS[band.name] || "#999";
        cctx.beginPath();
        cctx.moveTo(cols[0].x0, y(lower ? lower[cols[0].k] : 0));
        for (const c of cols) { cctx.lineTo(c.x0, y(upper[c.k])); cctx.lineTo(c.x1, y(upper[c.k])); }
        for (let i = cols.length - 1; i >= 0; i--) {
          const c = cols[i], yl = y(lower ? lower[c.k] : 0);
          cctx.lineTo(c.x1, yl); cctx.lineTo(c.x0, yl);
        }
        cctx.closePath();
        cctx.fill();
      });
      const cx = sx(bucketLeft(cursor));
      cctx.strokeStyle = "#111"; cctx.setLineDash([2, 2]);
      cctx.beginPath(); cctx.moveTo(cx, M.top); cctx.lineTo(cx, M.top + ph); cctx.stroke();
      cctx.setLineDash([]);
      cctx.restore();
    }
    function fillCategoryLegend() {
      const box = document.getElementById("cat-legend");
      box.textContent = "";
      const total = C.reduce((a, band) => a + band.values[cursor], 0);
      for (let s = C.length - 1; s >= 0; s--) {
        const band = C[s], bytes = band.values[cursor];
        const item = el("span", "", "item");
        item.dataset.category = band.name;
        item.dataset.bytes = String(bytes);
        const sw = el("i", "", "swatch");
        sw.style.background = CAT_COLORS[band.name] || "#999";
        item.appendChild(sw);
        item.appendChild(document.createTextNode(band.label + " " + fmt(bytes) +
          (total > 0 ? " (" + Math.round(bytes * 100 / total) + " %)" : "")));
        box.appendChild(item);
      }
      const sum = el("span", "at the cursor (after " + D.bucket_pos[cursor] + " events): " + fmt(total), "item muted");
      sum.id = "cat-total";
      sum.dataset.bytes = String(total);
      box.appendChild(sum);
    }
    // The icicle: the root (every allocated block) on top, each node under its parent, as
    // wide as its bytes, coloured by the category holding most of them.
    const ice = document.getElementById("icicle");
    const ictx = ice.getContext("2d");
    let iceBoxes = [];
    let iceMoment = null;
    function drawIcicle(m) {
      iceMoment = m;
      const title = document.getElementById("icicle-title");
      const nodes = m.tree || [];
      title.textContent = "Live bytes by the call tree at the " +
        (m.name.startsWith("event") ? "moment nearest the cursor" : m.name) + " (after " + m.pos + " events)";
      const dpr = window.devicePixelRatio || 1;
      const w = ice.clientWidth || 1000, rowH = 22;
      let depth = 0;
      const depthOf = new Int32Array(nodes.length);
      nodes.forEach((n, i) => { depthOf[i] = n[1] < 0 ? 0 : depthOf[n[1]] + 1; depth = Math.max(depth, depthOf[i]); });
      const h = nodes.length ? (depth + 1) * rowH + 2 : 0;
      ice.style.height = h + "px";
      ice.width = Math.round(w * dpr); ice.height = Math.round(h * dpr);
      ictx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ictx.font = "11px system-ui, sans-serif";
      iceBoxes = [];
      if (!nodes.length || nodes[0][2] === 0) return;
      const x0 = new Float64Array(nodes.length), next = new Float64Array(nodes.length);
      const scale = (w - 2) / nodes[0][2];
      nodes.forEach((n, i) => {
        x0[i] = n[1] < 0 ? 1 : next[n[1]];
        if (n[1] >= 0) next[n[1]] += n[2] * scale;
        next[i] = x0[i];
        const bw = n[2] * scale, yy = depthOf[i] * rowH;
        if (bw < 0.5) return;
        const cat = n[4] >= 0 ? CAT_ORDER[n[4]] : null;
        ictx.fillStyle = i === 0 ? "#8a8a8a" : (cat ? CAT_COLORS[cat] : "#c4c4c4");
        ictx.fillRect(x0[i], yy + 1, Math.max(bw - 1, 0.5), rowH - 2);
        iceBoxes.push([x0[i], yy, bw, i]);
        if (bw > 40) {
          ictx.fillStyle = "#111";
          const label = (i === 0 ? "all allocated blocks" : n[0]) + " " + fmt(n[2]);
          ictx.save();
          ictx.beginPath(); ictx.rect(x0[i], yy, bw - 2, rowH); ictx.clip();
          ictx.fillText(label, x0[i] + 4, yy + 15);
          ictx.restore();
        }
      });
    }
    ice.addEventListener("mousemove", (ev) => {
      const r = ice.getBoundingClientRect();
      const x = ev.clientX - r.left, y = ev.clientY - r.top;
      const hit = iceBoxes.find((b) => x >= b[0] && x < b[0] + b[2] && y >= b[1] && y < b[1] + 22);
      if (!hit || !iceMoment) { tip.hidden = true; return; }
      const nodes = iceMoment.tree;
      const path = [];
      for (let i = hit[3]; i > 0; i = nodes[i][1]) path.unshift(nodes[i][0]);
      const n = nodes[hit[3]];
      showTip(ev, (path.join("\n  > ") || "all allocated blocks") + "\n" + fmt(n[2]) + " in " + n[3] +
        " blocks (" + (n[2] * 100 / nodes[0][2]).toFixed(1) + " % of the moment's)" +
        (n[4] >= 0 ? "\nmostly " + CAT_ORDER[n[4]].replace("_", " ") : ""));
    });
    ice.addEventListener("mouseleave", () => { tip.hidden = true; });

    window.addEventListener("resize", () => { resize(); draw(); fillTable(); });
    resize();
    draw();
    fillTable();
    // What the browser test and the benchmark read.
    const peakSum = D.values.reduce((a, v) => a + v[peakBucket], 0);
    const pf = document.getElementById("peak-figure");
    pf.dataset.bytes = String(peakSum);
    pf.textContent = fmt(peakSum);
    document.body.dataset.paintMs = performance.now().toFixed(0);
    document.body.dataset.ready = "1";
    if (location.hash === "#selftest") selfTest();

    // Drives the page as a user would (keys, wheel, hover, click, a finding) and writes what
    // it saw into #selftest, for the browser test; errors land in #errors as always.
    function selfTest() {
      const out = document.getElementById("selftest");
      const key = (k) => document.dispatchEvent(new KeyboardEvent("keydown", { key: k, bubbles: true }));
      const rect = canvas.getBoundingClientRect();
      const mouse = (type, x, y, extra) => canvas.dispatchEvent(new MouseEvent(type, Object.assign({ clientX: rect.left + x, clientY: rect.top + y, bubbles: true }, extra || {})));
      key("E");
      out.dataset.endTotal = document.getElementById("table-total").dataset.bytes;
      key("P");
      out.dataset.peakTotal = document.getElementById("table-total").dataset.bytes;
      // What the memory is made of at the peak, and the icicle of the peak's call tree.
      const catTotal = document.getElementById("cat-total");
      out.dataset.catPeak = catTotal ? catTotal.dataset.bytes : "";
      out.dataset.categories = Array.from(document.querySelectorAll("#cat-legend [data-category]")).map((e) => e.dataset.category).join(" ");
      out.dataset.icicle = iceBoxes.length + ":" + (iceMoment && iceMoment.tree.length ? iceMoment.tree[0][2] : -1);
      const span = view[1] - view[0];
      canvas.dispatchEvent(new WheelEvent("wheel", { deltaY: -100, clientX: rect.left + W / 2, clientY: rect.top + H / 2, bubbles: true, cancelable: true }));
      out.dataset.zoomed = String(view[1] - view[0] < span);
      key("0");
      // Zoomed out, the bands reach the peak under its dot (alpha of the pixel below it).
      out.dataset.peakPixel = String(peakPixel);
      // Hover and click just above the axis at the peak: the bottom band there.
      const px = xOf(bucketLeft(peakBucket) + (bucketRight(peakBucket) - bucketLeft(peakBucket)) / 2);
      const py = M.top + plotH() - 2;
      mouse("mousemove", px, py);
      out.dataset.tip = tip.hidden ? "" : tip.textContent.split("\n")[0];
      mouse("mousedown", px, py);
      mouse("mouseup", px, py);
      out.dataset.pinned = String(pinned);
      key("ArrowRight");
      key("ArrowLeft");
      const first = document.querySelector("#findings tr[data-finding]");
      if (first) first.click();
      out.dataset.finding = String(finding);
      key("Escape");
      if (D.has_time) { key("T"); key("T"); }
      out.dataset.draws = String(drawn);
      // Each moment's segment map as drawn: the FNV-1a hash of its decoded rows as JSON, the
      // rows drawn and all segments, and the note under the map.
      const fnv = (text) => {
        let h = 0x811c9dc5;
        for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193) >>> 0;
        return h;
      };
      const seen = [], notes = [];
      for (const m of D.moments) {
        drawSegments(m);
        seen.push(m.pos + ":" + fnv(JSON.stringify(mapOf(m))) + ":" + mapOf(m).length + ":" + m.segment_count);
        notes.push(document.getElementById("segmap-note").textContent);
      }
      out.dataset.segmaps = seen.join(" ");
      out.dataset.steps = D.steps.length + ":" + fnv(JSON.stringify(D.steps));
      out.dataset.segnotes = notes.join("|");
      fillTable();
      out.textContent = "done";
    }
  }
})();
