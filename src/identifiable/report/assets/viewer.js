// Offline attention viewer. Each viewer root (.idf-viewer) holds its own JSON data island,
// written by identifiable.report.viewer_page; this script starts every root on the page that has
// not been started yet, and looks elements up only inside their own root, so several viewers
// can share one page. Every input string is inserted with textContent, never as HTML.
// Matrices are zlib-compressed uint8 codes, decoded on demand.
"use strict";
(function () {
  const KINDS = ["raw", "effective", "null"];
  // Maps of the certified head only: constrained attention (on the shared scale) and the
  // interval widths with the identifiable weights marked.
  const CERT_KINDS = ["constrained", "width"];
  const ATTENTION_KINDS = [...KINDS, ...CERT_KINDS];
  // The last map: a context-mixing method's per-layer map, shown in place of the others.
  const ALL_KINDS = [...ATTENTION_KINDS, "mixing"];
  const GREY = [225, 225, 225]; // masked: a key the row cannot see
  const PALE = [244, 241, 236]; // a row of the certified head that was not computed
  const GREEN = [27, 122, 58]; // identifiable weight (width below the threshold)
  const fmt = (v) => (Math.abs(v) < 5e-5 ? "0.0000" : v.toFixed(4));
  const el = (tag, text, cls) => {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  };

  async function inflate(b64) {
    const bin = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const stream = new Blob([bin]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }

  // The diverging colormap of identifiable.colormap (its stops come in the page data):
  // t = clamp(v / s, -1, 1), linear in RGB between the stops around (t + 1) / 2, rounded
  // half up, exactly as colormap.colour computes it in Python.
  function divergingColour(stops) {
    return (v, s) => {
      let t = s > 0 ? Math.max(-1, Math.min(1, v / s)) : 0;
      if (Number.isNaN(t)) t = 0;
      const pos = ((t + 1) / 2) * (stops.length - 1);
      const k = Math.min(stops.length - 2, Math.floor(pos));
      const f = pos - k;
      return stops[k].map((x, c) => Math.floor(x + (stops[k + 1][c] - x) * f + 0.5));
    };
  }

  // A panel's scale s (identifiable.colormap.panel_scale): the q-th percentile of |value|
  // over the visible cells outside key column 0 (numpy's linear rule, its lerp included);
  // else the panel's largest |value|; else 1. vals: m×m; visible(i, j) says which count.
  function panelScale(vals, m, visible, q) {
    const buf = new Float64Array(m * m); // a typed array sorts numerically, and fast
    let count = 0, top = 0;
    for (let i = 0; i < m; i++) {
      for (let j = 0; j < m; j++) {
        const a = Math.abs(vals[i * m + j]);
        if (!visible(i, j) || !Number.isFinite(a)) continue;
        top = Math.max(top, a);
        if (j > 0 || m === 1) buf[count++] = a;
      }
    }
    let s = 0;
    if (count) {
      const inner = buf.subarray(0, count).sort();
      const pos = (q / 100) * (inner.length - 1);
      const lo = Math.floor(pos), hi = Math.min(inner.length - 1, lo + 1), t = pos - lo;
      const d = inner[hi] - inner[lo];
      s = t >= 0.5 ? inner[hi] - d * (1 - t) : inner[lo] + d * t;
    }
    if (!(s > 0)) s = top;
    return s > 0 ? s : 1;
  }

  // Sequential shade for the head grid: white (0) to dark teal (1).
  function shade(t) {
    const c = [14, 92, 99];
    return c.map((x) => Math.round(255 + (x - 255) * Math.max(0, Math.min(1, t))));
  }

  // Sequential shade for interval widths: white (0) to purple (1).
  function purple(t) {
    const c = [94, 60, 153];
    return c.map((x) => Math.round(255 + (x - 255) * Math.max(0, Math.min(1, t))));
  }

  // A null fraction in a grid cell: two decimals, or two significant digits below 0.095
  // (a [CLS]-dominated head can have a small one, and the cells must still differ).
  const fraction = (v) => (v === 0 ? "0" : v >= 0.095 ? v.toFixed(2) : v.toPrecision(2));

  const bit = (bytes, k) => (bytes[k >> 3] >> (7 - (k & 7))) & 1;

  function start(root) {
    root.dataset.init = "1";
    const D = JSON.parse(root.querySelector("script.idf-viewer-data").textContent);
    const n = D.n;
    const colour = divergingColour(D.colormap.stops);
    const Q = D.colormap.percentile;
    const cache = new Map();
    const state = { layer: D.start[0], head: D.start[1], row: D.start_row ?? null, mats: null, show: "attention", mix: null, cert: null };
    const THRESHOLD = D.threshold ?? 0.01;
    const METHODS = D.mixing || {};
    const part = (name) => root.querySelector('[data-part="' + name + '"]');
    const parts = (sel) => root.querySelectorAll(sel);
    const masked = (i, j) => D.causal && j > i;

    // Float64 matrices raw, effective, null (= raw - effective) for one head, or null if absent.
    // f > 1 marks a preview: m×m means of f×f token blocks.
    async function matrices(layer, head) {
      const key = layer + "," + head;
      if (cache.has(key)) return cache.get(key);
      const entry = D.matrices[key];
      if (!entry) return null;
      const codes = await inflate(entry.blob);
      const f = entry.f || 1;
      const m = Math.ceil(n / f);
      const mm = m * m;
      const raw = new Float64Array(mm), eff = new Float64Array(mm), nul = new Float64Array(mm);
      let top = 0;
      for (let k = 0; k < mm; k++) {
        raw[k] = entry.raw[0] + codes[k] * entry.raw[1];
        eff[k] = entry.eff[0] + codes[mm + k] * entry.eff[1];
        nul[k] = raw[k] - eff[k];
        top = Math.max(top, Math.abs(raw[k]), Math.abs(eff[k]), Math.abs(nul[k]));
      }
      const seen = (i, j) => !masked(i, j);
      const scale = { raw: panelScale(raw, m, seen, Q), effective: panelScale(eff, m, seen, Q), null: panelScale(nul, m, seen, Q) };
      const mats = { raw, effective: eff, null: nul, max: top || 1, scale, err: [entry.raw[1] / 2, entry.eff[1] / 2], f, m };
      cache.set(key, mats);
      return mats;
    }

    // One method's map at one layer: {v, m, f, max, err}, or null if absent.
    async function mixingMap(name, layer) {
      const key = "mix:" + name + ":" + layer;
      if (cache.has(key)) return cache.get(key);
      const method = METHODS[name];
      const entry = method ? method.layers[layer] : null;
      if (!entry) return null;
      const codes = await inflate(entry.blob);
      const f = entry.f || 1;
      const m = Math.ceil(n / f);
      const v = new Float64Array(m * m);
      let top = 0;
      for (let k = 0; k < m * m; k++) {
        v[k] = entry.v[0] + codes[k] * entry.v[1];
        top = Math.max(top, Math.abs(v[k]));
      }
      const mats = { mixing: v, max: top || 1, scale: { mixing: panelScale(v, m, (i, j) => !masked(i, j), Q) }, err: entry.v[1] / 2, f, m };
      cache.set(key, mats);
      return mats;
    }

    // The certified head (interval bands, identifiable marks, constrained attention), decoded
    // once: {layer, head, rows: Map row -> index, raw, lower, upper, constrained, keys, ident,
    // err, maxWidth, maxConstrained}, or null when the page has none.
    async function certified() {
      const C = D.certified;
      if (!C) return null;
      const bytes = await inflate(C.blob);
      const R = C.rows.length;
      const size = R * n;
      const arrays = {};
      const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
      C.arrays.forEach((name, a) => {
        const v = new Float64Array(size);
        for (let k = 0; k < size; k++) {
          const code = C.bits === 16 ? view.getUint16(2 * (a * size + k), true) : bytes[a * size + k];
          v[k] = C.q[0] + code * C.q[1];
        }
        arrays[name] = v;
      });
      const keys = await inflate(C.keys), ident = await inflate(C.ident);
      // Rows whose constrained row was computed (the time budget may cover fewer of them).
      const conRows = new Set(arrays.constrained ? C.constrained_rows : []);
      let maxWidth = 0, maxConstrained = 0;
      for (let k = 0; k < size; k++) {
        if (!bit(keys, k)) continue;
        maxWidth = Math.max(maxWidth, arrays.upper[k] - arrays.lower[k]);
        if (conRows.has(C.rows[Math.floor(k / n)])) maxConstrained = Math.max(maxConstrained, Math.abs(arrays.constrained[k]));
      }
      // The constrained panel's scale by the same rule, over its computed rows and seen keys.
      const conVals = new Float64Array(n * n), rowIndex = new Map(C.rows.map((r, i) => [r, i]));
      const conSeen = (i, j) => conRows.has(i) && rowIndex.has(i) && bit(keys, rowIndex.get(i) * n + j) === 1;
      if (arrays.constrained) {
        rowIndex.forEach((r, i) => conVals.set(arrays.constrained.subarray(r * n, (r + 1) * n), i * n));
      }
      return {
        layer: C.layer, head: C.head, rows: rowIndex, conScale: panelScale(conVals, n, conSeen, Q),
        raw: arrays.raw, lower: arrays.lower, upper: arrays.upper, constrained: arrays.constrained || null,
        keys, ident, err: C.q[1] / 2, maxWidth, maxConstrained, conRows,
      };
    }

    // The certified data when it belongs to the head shown, else null.
    const certHere = () => (state.cert && state.cert.layer === state.layer && state.cert.head === state.head ? state.cert : null);

    // One certified row i as {lo, hi, weights, constrained, ident, keys} over all n keys, or null.
    function certRow(i) {
      const c = certHere();
      if (!c || !c.rows.has(i)) return null;
      const base = c.rows.get(i) * n;
      const take = (v) => (v ? Array.from(v.subarray(base, base + n)) : null);
      const flags = (bytes) => Array.from({ length: n }, (_, j) => bit(bytes, base + j) === 1);
      const con = c.conRows.has(i) ? take(c.constrained) : null;
      return { lo: take(c.lower), hi: take(c.upper), weights: take(c.raw), constrained: con, ident: flags(c.ident), keys: flags(c.keys) };
    }

    const current = () => (state.show === "attention" ? state.mats : state.mix);

    function draw(kind) {
      const canvas = part("map-" + kind);
      const ctx = canvas.getContext("2d");
      ctx.setTransform(1, 0, 0, 1, 0, 0);
      ctx.clearRect(0, 0, canvas.width, canvas.height);
      const placeholder = (text) => {
        ctx.fillStyle = "#f4f6f8";
        ctx.fillRect(0, 0, canvas.width, canvas.height);
        ctx.fillStyle = "#5b6673";
        ctx.font = "13px sans-serif";
        text.split("\n").forEach((line, k) => ctx.fillText(line, 20, canvas.height / 2 + 18 * k));
      };
      if (CERT_KINDS.includes(kind)) {
        const c = certHere();
        if (!c) {
          placeholder(state.cert
            ? "computed for layer " + state.cert.layer + ", head " + state.cert.head + " only"
            : "not computed for this page");
        } else if (kind === "constrained" && !c.conRows.size) {
          placeholder("constrained attention not computed");
        } else drawCertified(canvas, ctx, kind, c);
        return;
      }
      const mats = kind === "mixing" ? state.mix : state.mats;
      if (!mats) {
        placeholder(kind === "mixing" ? "map not embedded in this page" : "head not embedded in this page");
        return;
      }
      const m = mats.m;
      const vals = mats[kind];
      const off = pixels(m, (i) => (j) =>
        masked(i, j) ? GREY : colour(vals[i * m + j], mats.scale[kind]));
      ctx.imageSmoothingEnabled = false;
      // A preview's last block may be partial: scale so that blocks line up with token positions.
      const side = (canvas.width * m * mats.f) / n;
      ctx.drawImage(off, 0, 0, side, side);
      markRow(canvas, ctx);
    }

    // An m×m offscreen canvas whose pixel (i, j) is rowColours(i)(j), an [r, g, b] triple;
    // rowColours(i) is called once per row, so per-row look-ups stay out of the inner loop.
    function pixels(m, rowColours) {
      const off = document.createElement("canvas");
      off.width = m;
      off.height = m;
      const octx = off.getContext("2d");
      const img = octx.createImageData(m, m);
      for (let i = 0; i < m; i++) {
        const at = rowColours(i);
        for (let j = 0; j < m; j++) {
          const p = 4 * (i * m + j);
          const rgb = at(j);
          img.data[p] = rgb[0];
          img.data[p + 1] = rgb[1];
          img.data[p + 2] = rgb[2];
          img.data[p + 3] = 255;
        }
      }
      octx.putImageData(img, 0, 0);
      return off;
    }

    function markRow(canvas, ctx) {
      if (state.row === null) return;
      const cell = canvas.height / n;
      ctx.strokeStyle = "#f0a500";
      ctx.lineWidth = 2;
      ctx.strokeRect(1, state.row * cell, canvas.width - 2, Math.max(cell, 2));
    }

    // Constrained attention (shared scale) or interval widths (white to purple, identifiable
    // weights green) of the certified head; rows not computed are pale, unseen keys grey.
    function drawCertified(canvas, ctx, kind, c) {
      const off = pixels(n, (i) => {
        const r = c.rows.get(i);
        if (r === undefined || (kind === "constrained" && !c.conRows.has(i))) return () => PALE;
        return (j) => {
          const k = r * n + j;
          if (!bit(c.keys, k)) return GREY;
          if (kind === "constrained") return colour(c.constrained[k], c.conScale);
          if (bit(c.ident, k)) return GREEN;
          return purple(c.maxWidth > 0 ? (c.upper[k] - c.lower[k]) / c.maxWidth : 0);
        };
      });
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(off, 0, 0, canvas.width, canvas.height);
      markRow(canvas, ctx);
    }

    // The scale s of each panel shown, by the page's rule (D.colormap.rule).
    function panelScales() {
      const out = {};
      const mats = current();
      if (state.show !== "attention") {
        if (mats) out.mixing = mats.scale.mixing;
        return out;
      }
      if (mats) KINDS.forEach((k) => (out[k] = mats.scale[k]));
      const c = certHere();
      if (c && c.conRows.size) out.constrained = c.conScale;
      return out;
    }

    // One bar for every panel, drawn from -s to +s; each panel's s is in its caption.
    function drawColourBar() {
      const canvas = part("colourbar");
      const ctx = canvas.getContext("2d");
      const w = canvas.width, hgt = canvas.height;
      for (let x = 0; x < w; x++) {
        const rgb = colour((2 * x) / (w - 1) - 1, 1);
        ctx.fillStyle = "rgb(" + rgb.join(",") + ")";
        ctx.fillRect(x, 0, 1, hgt);
      }
      part("colourbar-lo").textContent = "−s";
      part("colourbar-hi").textContent = "+s";
      const scales = panelScales();
      ALL_KINDS.forEach((kind) => {
        const box = part("scale-" + kind);
        if (!box) return;
        box.textContent = kind in scales ? " · s = " + scales[kind].toFixed(4) : "";
        box.dataset.scale = kind in scales ? String(scales[kind]) : "";
      });
    }

    function drawAll() {
      if (state.show === "attention") ATTENTION_KINDS.forEach(draw);
      else draw("mixing");
      drawColourBar();
    }

    // Token labels on both axes of each map: every token when they fit (11 px apart at least),
    // else every k-th; the hovered query and key are always labelled (see hover()).
    function buildAxes() {
      const px = 250 / n;
      const stride = Math.max(1, Math.ceil(11 / px));
      const label = (i, cls) => {
        const s = el("span", D.tokens[i], cls);
        s.dataset.index = i;
        s.title = i + ": " + D.tokens[i];
        return s;
      };
      ALL_KINDS.forEach((kind) => {
        const ya = part("yaxis-" + kind), xa = part("xaxis-" + kind);
        for (let i = 0; i < n; i += stride) {
          const y = label(i, "idf-tick");
          y.style.top = ((i + 0.5) * px).toFixed(1) + "px";
          ya.appendChild(y);
          const x = label(i, "idf-tick");
          x.style.left = ((i + 0.5) * px).toFixed(1) + "px";
          xa.appendChild(x);
        }
        ya.dataset.stride = stride;
        xa.dataset.stride = stride;
      });
      if (stride > 1) {
        part("axis-note").textContent +=
          " Every " + stride + "th token is labelled on the axes; hovering labels the others.";
      }
    }

    function markCursor(i, j) {
      ALL_KINDS.forEach((kind) => {
        const px = 250 / n;
        [["yaxis-", i, "top"], ["xaxis-", j, "left"]].forEach(([prefix, idx, side]) => {
          const axis = part(prefix + kind);
          let c = axis.querySelector(".idf-cursor");
          if (idx === null) {
            if (c) c.remove();
            return;
          }
          if (!c) {
            c = el("span", null, "idf-cursor");
            axis.appendChild(c);
          }
          c.textContent = D.tokens[idx];
          c.style[side] = ((idx + 0.5) * px).toFixed(1) + "px";
        });
      });
    }

    function buildGrid() {
      const table = part("null-grid");
      const head = el("tr");
      head.appendChild(el("th", "L \\ H"));
      for (let k = 0; k < D.heads; k++) head.appendChild(el("th", k));
      table.appendChild(head);
      const omitted = new Set(D.omitted.map((p) => p[0] + "," + p[1]));
      let dmax = 0;
      const value = (l, k) => D.distance[l][k];
      D.distance.forEach((r) => r.forEach((v) => (dmax = Math.max(dmax, v))));
      part("grid-legend").textContent =
        "Shade from white (null fraction 0) to dark (" + dmax.toFixed(3) + ", the largest here).";
      // dim LN(T) = n − rank(T) (n − d_v for a full-rank head) is usually one number for
      // every head: said once here, per head in each cell's tooltip.
      const dims = D.null_dims.flat();
      const lo = Math.min(...dims), hi = Math.max(...dims);
      part("null-dims-note").textContent = "Null-space dimension dim LN(T) = n − rank(T): " +
        (lo === hi ? lo + " for every head" : "from " + lo + " to " + hi + " (per head in each cell's tooltip)") +
        " (n = " + n + " tokens, head width d_v = " + D.head_dim +
        (n > D.head_dim ? ", n − d_v = " + (n - D.head_dim) : ": n ≤ d_v, attention can be identifiable") + ").";
      D.null_dims.forEach((r, layer) => {
        const tr = el("tr");
        tr.appendChild(el("th", layer));
        r.forEach((v, k) => {
          const td = el("td", fraction(value(layer, k)));
          td.dataset.layer = layer;
          td.dataset.head = k;
          const t = dmax > 0 ? value(layer, k) / dmax : 0;
          td.style.background = "rgb(" + shade(t).join(",") + ")";
          td.style.color = t > 0.55 ? "#fff" : "#1d232b";
          let title = "layer " + layer + ", head " + k + ": ‖A − A_eff‖_F / ‖A‖_F = " + value(layer, k).toFixed(4) + ", null-space dim " + v;
          if (omitted.has(layer + "," + k)) {
            td.classList.add("idf-absent");
            title += " (preview only: page size limit)";
          }
          td.title = title;
          td.addEventListener("click", () => select(layer, k));
          tr.appendChild(td);
        });
        table.appendChild(tr);
      });
    }

    function markGrid() {
      parts("table.idf-grid td").forEach((td) => {
        const cur = +td.dataset.layer === state.layer && +td.dataset.head === state.head;
        td.classList.toggle("idf-current", cur);
      });
    }

    function buildControls() {
      const ls = part("layer"), hs = part("head"), show = part("show");
      show.appendChild(new Option("raw · effective · null attention", "attention"));
      Object.keys(METHODS).forEach((name) => show.appendChild(new Option("mixing: " + name, name)));
      if (!Object.keys(METHODS).length) show.parentElement.hidden = true;
      show.addEventListener("change", () => setShow(show.value));
      for (let l = 0; l < D.layers; l++) ls.appendChild(new Option(String(l), String(l)));
      for (let k = 0; k < D.heads; k++) hs.appendChild(new Option(String(k), String(k)));
      ls.addEventListener("change", () => select(+ls.value, state.head));
      hs.addEventListener("change", () => select(state.layer, +hs.value));
    }

    function buildTokens() {
      const box = part("tokens");
      if (!box) return; // an image model's page shows the patch grid instead
      D.tokens.forEach((t, i) => {
        const s = el("span", t);
        s.dataset.index = i;
        s.title = "token " + i;
        s.addEventListener("click", () => chooseRow(i));
        box.appendChild(s);
      });
    }

    function markTokens() {
      parts(".idf-tokens span").forEach((s) => {
        const i = +s.dataset.index;
        s.classList.toggle("idf-selected", i === state.row);
        const c = certHere();
        s.classList.toggle("idf-has-intervals", (state.layer + "," + state.head + "," + i) in D.intervals || (c !== null && c.rows.has(i)));
      });
    }

    // Which map is shown: the three attention maps of a head, or one method's layer map.
    async function setShow(name) {
      state.show = name in METHODS ? name : "attention";
      part("show").value = state.show;
      const mixing = state.show !== "attention";
      ATTENTION_KINDS.forEach((kind) => (part("figure-" + kind).hidden = mixing));
      part("figure-mixing").hidden = !mixing;
      // A method's map is per layer: the head selector does not apply to it.
      part("head").disabled = mixing;
      if (mixing) part("caption-mixing").textContent = state.show + ": " + (METHODS[state.show].caption || "");
      await select(state.layer, state.head);
    }

    async function select(layer, head) {
      state.layer = layer;
      state.head = head;
      part("layer").value = String(layer);
      part("head").value = String(head);
      state.mats = await matrices(layer, head);
      state.mix = state.show === "attention" ? null : await mixingMap(state.show, layer);
      const dim = D.null_dims[layer][head];
      const rerun = (PG ? "identifiable view --image FILE" : "identifiable view TEXT") + " --layer " + layer + " --head " + head;
      const mats = state.mats;
      let status = "layer " + layer + ", head " + head + ": null-space dimension " + dim;
      status += ", ‖A − A_eff‖_F / ‖A‖_F = " + D.distance[layer][head].toFixed(3);
      if (!mats) status += " · matrices not embedded (page size limit). Run: " + rerun;
      else {
        status += " · colour scales raw ±" + mats.scale.raw.toFixed(3) + ", effective ±" + mats.scale.effective.toFixed(3) +
          ", null ±" + mats.scale.null.toFixed(3) + " (each panel its own)";
        if (mats.f > 1) status += " · preview: means of " + mats.f + "×" + mats.f + " token blocks (page size limit); full resolution: " + rerun;
      }
      if (state.show !== "attention") {
        const mix = state.mix;
        status = "layer " + layer + " · " + state.show + " (one map per layer: the head selector does not apply)";
        if (!mix) status += " · map not embedded";
        else {
          status += " · colour scale ±" + mix.scale.mixing.toFixed(3);
          if (mix.f > 1) status += " · preview: means of " + mix.f + "×" + mix.f + " token blocks (page size limit)";
        }
      }
      part("head-status").textContent = status;
      markGrid();
      markTokens();
      drawAll();
      renderPanel();
      await renderPatches();
    }

    function cellAt(canvas, ev) {
      const r = canvas.getBoundingClientRect();
      const j = Math.floor(((ev.clientX - r.left) / r.width) * n);
      const i = Math.floor(((ev.clientY - r.top) / r.height) * n);
      return i >= 0 && i < n && j >= 0 && j < n ? [i, j] : null;
    }

    function hover(ev) {
      const out = part("hover");
      const c = cellAt(ev.currentTarget, ev);
      if (!c) return;
      const [i, j] = c;
      markCursor(i, j);
      if (ev.currentTarget.dataset.kind === "mixing") {
        const mx = state.mix;
        if (!mx) return;
        const bi = Math.floor(i / mx.f), bj = Math.floor(j / mx.f);
        out.textContent = [
          mx.f > 1 ? "preview block " + bi + "," + bj + " (means)" : "query " + i + " “" + D.tokens[i] + "” ← key " + j + " “" + D.tokens[j] + "”",
          masked(bi, bj) ? "masked (causal: a query cannot see later keys)" : state.show + " " + fmt(mx.mixing[bi * mx.m + bj]) + " (±" + mx.err.toPrecision(2) + ")",
        ].join("\n");
        return;
      }
      if (CERT_KINDS.includes(ev.currentTarget.dataset.kind)) {
        out.textContent = certReadout(i, j);
        return;
      }
      if (!state.mats) return;
      const m = state.mats;
      const bi = Math.floor(i / m.f), bj = Math.floor(j / m.f);
      const k = bi * m.m + bj;
      const span = (b) => b * m.f + "–" + Math.min(n - 1, (b + 1) * m.f - 1);
      const lines = [
        m.f > 1
          ? "preview block: queries " + span(bi) + " → keys " + span(bj) + " (means)"
          : "query " + i + " “" + D.tokens[i] + "” → key " + j + " “" + D.tokens[j] + "”",
        masked(bi, bj)
          ? "masked (causal: a query cannot see later keys)"
          : "raw " + fmt(m.raw[k]) + " (±" + m.err[0].toPrecision(2) + ")   effective " + fmt(m.effective[k]) +
            " (±" + m.err[1].toPrecision(2) + ")   null " + fmt(m.null[k]),
      ];
      out.textContent = lines.join("\n");
    }

    function certReadout(i, j) {
      const head = "query " + i + " “" + D.tokens[i] + "” → key " + j + " “" + D.tokens[j] + "”";
      const c = certHere();
      if (!c) return head + "\nintervals and constrained attention not computed for this head";
      const r = c.rows.get(i);
      if (r === undefined) return head + "\nrow not computed (time budget): see the note below the maps";
      const k = r * n + j;
      if (!bit(c.keys, k)) return head + "\nmasked (the query cannot see this key)";
      const err = " (±" + c.err.toPrecision(2) + ")";
      const parts = [
        "raw " + fmt(c.raw[k]) + err,
        c.conRows.has(i) ? "constrained " + fmt(c.constrained[k]) : "constrained not computed for this row",
        "interval [" + fmt(c.lower[k]) + ", " + fmt(c.upper[k]) + "]",
        "width " + fmt(c.upper[k] - c.lower[k]),
        bit(c.ident, k) ? "✓ identifiable (width < " + THRESHOLD + ")" : "not identifiable (width ≥ " + THRESHOLD + ")",
      ];
      return head + "\n" + parts.filter((x) => x !== null).join("   ");
    }

    function chooseRow(i) {
      state.row = i;
      markTokens();
      drawAll();
      renderPanel();
      renderPatches();
    }

    // ---- Image models: the patch grid (D.patches) in place of the token strip. A query cell
    // (a patch or a special token) is chosen by clicking; every key cell is shaded by the
    // chosen map's row of that query, on a scale set by the row's largest |value|.
    const PG = D.patches || null;
    const PATCH_MAPS = [
      ["raw", "raw attention A"],
      ["effective", "effective attention A_eff"],
      ["null", "null attention A − A_eff"],
      ["constrained", "constrained attention C"],
      ["width", "interval width upper − lower"],
    ];
    let patchSeq = 0;

    function buildPatches() {
      if (!PG) return;
      state.patchMap = "raw";
      const sel = part("patch-map");
      PATCH_MAPS.forEach(([value, label]) => sel.appendChild(new Option(label, value)));
      Object.keys(METHODS).forEach((name) => sel.appendChild(new Option("mixing: " + name, "mix:" + name)));
      sel.addEventListener("change", () => {
        state.patchMap = sel.value;
        renderPatches();
      });
      parts(".idf-patch-cell").forEach((c) => {
        const i = +c.dataset.index;
        c.addEventListener("click", () => chooseRow(i));
        c.addEventListener("mouseenter", () => patchHover(i));
      });
    }

    // Row i of the map (a preview's block row: block means), null where the key is masked.
    function rowOf(vals, m, i) {
      const bi = Math.floor(i / m.f);
      return Array.from({ length: n }, (_, j) => (masked(i, j) ? null : vals[bi * m.m + Math.floor(j / m.f)]));
    }

    // The chosen map's row for query i: {vals, err, f, width, ident} or {note} saying why not.
    async function patchValues(kind, i) {
      if (kind.startsWith("mix:")) {
        const name = kind.slice(4);
        const mx = await mixingMap(name, state.layer);
        if (!mx) return { note: name + " map not embedded in this page" };
        return { vals: rowOf(mx.mixing, mx, i), err: mx.err, f: mx.f, where: "layer " + state.layer + " (one map per layer)" };
      }
      const where = "layer " + state.layer + ", head " + state.head;
      if (kind === "constrained" || kind === "width") {
        const c = certHere();
        if (!c) {
          return { note: state.cert
            ? "intervals and constrained attention were computed for layer " + state.cert.layer + ", head " + state.cert.head + " only"
            : "intervals and constrained attention were not computed for this page" };
        }
        const r = certRow(i);
        if (!r) return { note: "this row was not computed (time budget): see the note below the maps" };
        if (kind === "constrained") {
          if (!r.constrained) return { note: "constrained attention was not computed for this row" };
          return { vals: r.constrained.map((v, j) => (r.keys[j] ? v : null)), err: c.err, f: 1, where };
        }
        return { vals: r.hi.map((v, j) => (r.keys[j] ? v - r.lo[j] : null)), ident: r.ident, width: true, err: 2 * c.err, f: 1, where };
      }
      const m = state.mats;
      if (!m) return { note: "this head is not embedded in this page" };
      const err = kind === "raw" ? m.err[0] : kind === "effective" ? m.err[1] : m.err[0] + m.err[1];
      return { vals: rowOf(m[kind], m, i), err, f: m.f, where };
    }

    function drawPatchBar(max, width) {
      const canvas = part("patch-colourbar");
      const ctx = canvas.getContext("2d");
      for (let x = 0; x < canvas.width; x++) {
        const t = x / (canvas.width - 1);
        const rgb = width ? purple(t) : colour((2 * t - 1) * max, max);
        ctx.fillStyle = "rgb(" + rgb.join(",") + ")";
        ctx.fillRect(x, 0, 1, canvas.height);
      }
      part("patch-colourbar-lo").textContent = width ? "0" : (-max).toFixed(4);
      part("patch-colourbar-hi").textContent = (width ? "" : "+") + max.toFixed(4);
    }

    async function renderPatches() {
      if (!PG) return;
      const seq = ++patchSeq;
      const i = state.row, kind = state.patchMap;
      const res = i === null ? { note: "Click a patch or a special token to choose the query." } : await patchValues(kind, i);
      if (seq !== patchSeq) return; // a later choice has started its own render
      const vals = res.vals || null;
      let max = 0;
      if (vals) vals.forEach((v) => (max = v === null ? max : Math.max(max, Math.abs(v))));
      max = max || 1;
      const alpha = PG.image ? 0.72 : 1; // translucent over the image
      const rgba = (rgb) => "rgba(" + rgb.join(",") + "," + alpha + ")";
      state.patch = { res, max };
      parts(".idf-patch-cell").forEach((c) => {
        const j = +c.dataset.index;
        c.classList.toggle("idf-selected", j === i);
        const v = vals ? vals[j] : null;
        if (v === null || v === undefined) {
          delete c.dataset.value;
          c.style.backgroundColor = vals ? rgba(GREY) : "";
        } else {
          c.dataset.value = String(v);
          c.style.backgroundColor = rgba(res.width ? (res.ident[j] ? GREEN : purple(v / max)) : colour(v, max));
        }
      });
      const label = part("patch-map").selectedOptions[0].textContent;
      let text;
      if (!vals) text = label + ": " + res.note;
      else {
        text = label + " from query “" + D.tokens[i] + "” (token " + i + "), " + res.where + ". " +
          (res.width
            ? "White 0 to purple " + max.toFixed(4) + " (the widest in this row); green: identifiable (width < " + THRESHOLD + ")."
            : "Red above 0, blue below 0, grey at 0; scale ±" + max.toFixed(4) + ", the largest |value| in this row.") +
          (res.f > 1 ? " Preview: means of " + res.f + "×" + res.f + " token blocks (page size limit)." : "") +
          " Values within ±" + res.err.toPrecision(2) + " (quantised)." + (PG.image ? " Cells are translucent over the image." : "");
      }
      part("patch-legend").textContent = text;
      drawPatchBar(max, !!res.width);
      const grid = part("patch-grid");
      grid.dataset.map = kind;
      grid.dataset.layer = state.layer;
      grid.dataset.head = state.head;
      grid.dataset.scale = vals ? String(max) : "";
      grid.dataset.row = i === null ? "" : String(i);
    }

    function patchHover(j) {
      const out = part("patch-readout");
      const head = "key " + j + " “" + D.tokens[j] + "”";
      const res = state.patch ? state.patch.res : null;
      if (state.row === null || !res || !res.vals) {
        out.textContent = head;
        return;
      }
      const v = res.vals[j];
      out.textContent = "query " + state.row + " “" + D.tokens[state.row] + "” → " + head + ": " +
        part("patch-map").selectedOptions[0].textContent + " " + (v === null ? "masked" : fmt(v) + " (±" + res.err.toPrecision(2) + ")") +
        (res.width && res.ident[j] ? " ✓ identifiable" : "");
    }

    // One key's bar on the row's own axis [x0, x1] (see rowAxis): the interval as a band,
    // the credible band inside it (dark; cred = [lo, hi] or null), the raw weight (black),
    // witness (red), constrained (purple) and effective (orange) marks.
    function bar(ax, lo, hi, a, w, cw, e, ok, cred) {
      const at = (v) => (100 * (v - ax[0])) / (ax[1] - ax[0]);
      const b = el("div", null, "idf-bar");
      const span = el("div", null, ok ? "idf-span idf-span-ident" : "idf-span");
      span.style.left = at(lo).toFixed(2) + "%";
      span.style.width = Math.max(0.5, at(hi) - at(lo)).toFixed(2) + "%";
      b.append(span);
      if (cred) {
        const band = el("div", null, "idf-cred");
        band.style.left = at(cred[0]).toFixed(2) + "%";
        band.style.width = Math.max(0.5, at(cred[1]) - at(cred[0])).toFixed(2) + "%";
        b.append(band);
      }
      [[a, "idf-mark"], [w, "idf-wit"], [cw, "idf-con"], [e, "idf-eff"]].forEach(([v, cls]) => {
        if (v === null) return;
        const mark = el("div", null, cls);
        mark.style.left = at(v).toFixed(2) + "%";
        b.append(mark);
      });
      return b;
    }

    // The axis of a row's bars: from the least to the greatest value drawn in the row
    // (bounds, raw, witness, constrained, effective), padded by 4% of that range on each
    // side (at least 0.01 wide), so that narrow intervals stay visible.
    function rowAxis(values) {
      const lo = Math.min(...values), hi = Math.max(...values);
      const pad = Math.max(0.04 * (hi - lo), hi - lo < 0.01 ? (0.01 - (hi - lo)) / 2 : 0);
      return [lo - pad, hi + pad];
    }

    // The row table's legend: the bars' axis and the colour of each mark.
    function barLegend(ax, withEffective, withCredible) {
      const legend = el("p", null, "idf-legend");
      legend.append("bar axis fitted to this row: " + fmt(ax[0]) + " … " + fmt(ax[1]) +
        " (its least to greatest value, padded 4%): ");
      const keys = [["#9fbfe3", "interval"], ["#1b7a3a", "interval of an identifiable weight"], ["#1d232b", "raw weight"],
        ["#d1495b", "witness"], ["#7b4fc4", "constrained"]].concat(withEffective ? [["#e08a00", "effective"]] : [],
        withCredible ? [["#1f4e8c", "95% credible band (uniform posterior)"]] : []);
      keys.forEach(([colourCss, label]) => {
        const sw = el("i");
        sw.style.background = colourCss;
        legend.append(sw, label);
      });
      return legend;
    }

    // The shown head's effective row i over all n keys, or null (head absent, or a preview).
    function effectiveRow(i) {
      const m = state.mats;
      if (!m || m.f > 1) return null;
      return Array.from(m.effective.subarray(i * n, (i + 1) * n));
    }

    // The chosen row's intervals: bounds from the interval map where the page has it (else
    // the row's own entry), the witness from the row's entry, constrained attention from the map.
    function renderPanel() {
      const panel = part("interval-panel");
      panel.replaceChildren();
      if (state.row === null) {
        panel.appendChild(el("p", "Click a query token to see its intervals.", "idf-note"));
        return;
      }
      const i = state.row;
      const entry = D.intervals[state.layer + "," + state.head + "," + i] || null;
      const fromMap = certRow(i);
      panel.appendChild(el("h3", "Layer " + state.layer + ", head " + state.head + ", query " + i + " “" + D.tokens[i] + "”"));
      if (!entry && !fromMap) {
        panel.appendChild(el("p", "Intervals were not precomputed for this row.", "idf-missing"));
        if (D.interval_note) panel.appendChild(el("p", D.interval_note, "idf-note"));
        return;
      }
      const iv = fromMap || entry;
      const witness = entry ? entry.witness : null;
      const con = fromMap ? fromMap.constrained : null;
      const eff = effectiveRow(i);
      const identSet = fromMap ? null : new Set(entry.ident || []);
      const isIdent = (j) => (fromMap ? fromMap.ident[j] : identSet.has(j));
      // Keys the row cannot see (causal or windowed) are left out.
      const keys = iv.lo.map((_, j) => j).filter((j) => (fromMap ? fromMap.keys[j] : !masked(i, j)));
      keys.sort((a, b) => iv.weights[b] - iv.weights[a]);
      const wide = keys.filter((j) => iv.hi[j] - iv.lo[j] > 0.1).length;
      const nIdent = keys.filter(isIdent).length;
      let text = "Any attention row within these intervals that satisfies the same constraints (non-negative, " +
        "summing to 1) gives this head exactly the same output. " + nIdent + " of " + keys.length +
        " keys are identifiable (width < " + THRESHOLD + "); " + wide + " have an interval wider than 0.1.";
      if (witness) {
        const moved = Math.max(...keys.map((j) => Math.abs(witness[j] - iv.weights[j])));
        text += " The witness (red) is one such row; it changes a weight by up to " + fmt(moved) + ".";
      }
      if (con) {
        const moved = keys.reduce((s, j) => s + Math.abs(con[j] - iv.weights[j]), 0);
        text += " The constrained row C (purple) is another; it moves " + fmt(moved) + " of L1 mass.";
      }
      panel.appendChild(el("p", text, "idf-summary"));
      if (fromMap) {
        panel.appendChild(el("p", "Values from the page's interval map, each within ±" + state.cert.err.toPrecision(2) +
          " (quantised); the identifiable marks come from the exact bounds.", "idf-note"));
      }
      if (entry && entry.note) panel.appendChild(el("p", entry.note, "idf-note"));
      // The credible band (computed with the page, inside the row's exact bounds), or null.
      const cred = entry && entry.cred_lo ? (j) => [entry.cred_lo[j], entry.cred_hi[j]] : null;
      if (cred && entry.posterior_note) panel.appendChild(el("p", entry.posterior_note, "idf-note idf-posterior-note"));
      const drawn = keys.flatMap((j) => [iv.lo[j], iv.hi[j], iv.weights[j]].concat(
        witness ? [witness[j]] : [], con ? [con[j]] : [], eff ? [eff[j]] : []));
      const ax = rowAxis(drawn);
      panel.appendChild(barLegend(ax, eff !== null, cred !== null));
      const table = el("table");
      table.dataset.axis = ax.join(",");
      const head = el("tr");
      ["key", "token", "raw a", "effective a_eff", "witness ã", "constrained c", "min", "max", "width", "credible 95%", "identifiable", ""].forEach((t) => head.appendChild(el("th", t)));
      table.appendChild(head);
      keys.forEach((j) => {
        const tr = el("tr");
        tr.dataset.key = j;
        const ok = isIdent(j);
        if (ok) tr.classList.add("idf-ident");
        tr.append(el("td", j), el("td", D.tokens[j], "idf-tok"), el("td", fmt(iv.weights[j])), el("td", eff ? fmt(eff[j]) : "–", "idf-eff-cell"),
          el("td", witness ? fmt(witness[j]) : "–"), el("td", con ? fmt(con[j]) : "–"), el("td", fmt(iv.lo[j])), el("td", fmt(iv.hi[j])),
          el("td", fmt(iv.hi[j] - iv.lo[j])), el("td", cred ? fmt(cred(j)[0]) + " … " + fmt(cred(j)[1]) : "–", "idf-cred-cell"),
          el("td", ok ? "✓" : "", "idf-ident-mark"));
        const td = el("td");
        td.appendChild(bar(ax, iv.lo[j], iv.hi[j], iv.weights[j], witness ? witness[j] : null, con ? con[j] : null, eff ? eff[j] : null, ok,
          cred ? cred(j) : null));
        tr.appendChild(td);
        table.appendChild(tr);
      });
      panel.appendChild(table);
    }

    function coverageNote() {
      const box = part("coverage-note");
      const C = D.certified;
      part("threshold-note").hidden = !C && !Object.keys(D.intervals).length;
      if (!C) {
        box.textContent = "This page has no interval map (identifiable view --certify computes one for the chosen head).";
        return;
      }
      let text = C.note || "";
      if (C.dropped) text += " " + C.dropped + " computed rows were left out to keep the page within its size limit.";
      text += " Stored with " + C.bits + "-bit codes (values within ±" + (C.q[1] / 2).toPrecision(2) + ").";
      box.textContent = text.trim();
    }

    buildControls();
    buildGrid();
    buildTokens();
    buildPatches();
    buildAxes();
    ALL_KINDS.forEach((kind) => {
      const c = part("map-" + kind);
      c.addEventListener("mousemove", hover);
      c.addEventListener("mouseleave", () => markCursor(null, null));
      c.addEventListener("click", (ev) => {
        const cell = cellAt(c, ev);
        if (cell) chooseRow(cell[0]);
      });
    });
    coverageNote();
    return certified().then((c) => {
      state.cert = c;
      return select(state.layer, state.head);
    }).then(() => {
      root.dataset.ready = "1";
      // A standalone page marks its body too, once every viewer in it is ready.
      if (root.dataset.standalone && !document.querySelector(".idf-viewer:not([data-ready])")) {
        document.body.dataset.ready = "1";
      }
    });
  }

  document.querySelectorAll(".idf-viewer:not([data-init])").forEach(start);
})();
