/* Pencil: photo -> pencil drawing. Plain JS, no build step, no external assets.
   The page has two views, Sketch (a photo, here) and Live (the camera, live.js), which share
   the options form; this file switches between them and lends live.js the form (window.pencil). */
(() => {
  "use strict";

  const ACCEPTED = ["image/jpeg", "image/png", "image/webp"];
  let maxBytes = 25 * 1024 * 1024; // the server's default; /healthz tells the real limit
  const DEBOUNCE_MS = 300;
  const EXT = { "image/png": "png", "image/jpeg": "jpg", "image/webp": "webp" };
  const STATUS_PREFIX = {
    400: "Could not process the image",
    413: "Too large",
    415: "Unsupported type",
    422: "Invalid options",
    503: "Service busy",
  };

  const $ = (id) => document.getElementById(id);
  const els = {
    file: $("file"),
    fileLabel: $("file-label"),
    fileHint: $("file-hint"),
    dropzone: $("dropzone"),
    original: $("original"),
    originalPlaceholder: $("original-placeholder"),
    sketch: $("sketch"),
    sketchPlaceholder: $("sketch-placeholder"),
    sketchPanel: $("sketch-panel"),
    sketchFrame: document.querySelector("#sketch-panel .frame"),
    busy: $("busy"),
    status: $("status"),
    error: $("error"),
    download: $("download"),
    backend: $("backend"),
    form: $("options"),
    quality: $("quality"),
    compare: $("compare"),
    comparePhoto: $("compare-photo"),
    compareRange: $("compare-range"),
    compareHint: $("compare-hint"),
    fullOpen: $("fullsize-open"),
    full: $("fullsize"),
    fullImg: $("fullsize-img"),
    fullSize: $("fullsize-size"),
    fullScroll: $("fullsize-scroll"),
    fullClose: $("fullsize-close"),
    views: { sketch: $("sketch-view"), live: $("live-view") },
    tabs: document.querySelectorAll(".tabs a[data-view]"),
  };

  // Where the before/after divider starts, in % of the width from the left (the photo shows
  // left of it): 0 shows the drawing alone, with the divider's handle at the left edge.
  const SPLIT_DEFAULT = 0;
  const SPLIT_KEY_STEP = 5; // % per arrow key; PageUp/PageDown move 25, Home/End to either end
  const DRAG_PX = 5; // a press that moves less than this is a click: it opens the full-size view

  const state = {
    file: null,          // the current, validated photo
    originalUrl: null,
    sketchUrl: null,
    timer: 0,
    controller: null,    // AbortController of the in-flight request
    seq: 0,              // id of the latest request; older answers are ignored
    split: SPLIT_DEFAULT,
    drag: null,          // the pointer pressed on the drawing: {id, x, moving, onKnob}
    opener: null,        // what had the focus before the full-size view opened
    view: "sketch",      // the view shown: "sketch" or "live"
    stale: false,        // the options changed while the Live view was shown: draw the photo again
  };

  /* ---------- messages ---------- */

  function setStatus(text) {
    els.status.textContent = text;
  }

  function showError(message) {
    els.error.textContent = message;
    els.error.hidden = false;
  }

  function clearError() {
    els.error.textContent = "";
    els.error.hidden = true;
  }

  function setBusy(busy) {
    els.busy.hidden = !busy;
    els.sketchPanel.setAttribute("aria-busy", String(busy));
    document.body.classList.toggle("is-busy", busy);
  }

  function formatBytes(n) {
    if (n >= 1024 * 1024) return (n / (1024 * 1024)).toFixed(1).replace(/\.0$/, "") + " MB";
    if (n >= 1024) return Math.round(n / 1024) + " KB";
    return n + " bytes";
  }

  /* ---------- client-side checks ---------- */

  // Sniff the first bytes: a browser derives file.type from the name only,
  // so a text file called notes.jpg would otherwise pass as image/jpeg.
  async function sniffType(file) {
    const b = new Uint8Array(await file.slice(0, 12).arrayBuffer());
    if (b.length >= 3 && b[0] === 0xff && b[1] === 0xd8 && b[2] === 0xff) return "image/jpeg";
    if (b.length >= 8 && b[0] === 0x89 && b[1] === 0x50 && b[2] === 0x4e && b[3] === 0x47 &&
        b[4] === 0x0d && b[5] === 0x0a && b[6] === 0x1a && b[7] === 0x0a) return "image/png";
    const ascii = (from, to) => String.fromCharCode(...b.slice(from, to));
    if (b.length >= 12 && ascii(0, 4) === "RIFF" && ascii(8, 12) === "WEBP") return "image/webp";
    return null;
  }

  async function checkFile(file) {
    const name = file.name || "The file";
    if (file.type && !ACCEPTED.includes(file.type)) {
      return `Unsupported type: ${name} is ${file.type}; please choose a JPEG, PNG or WebP image.`;
    }
    if (file.size > maxBytes) {
      return `Too large: ${name} is ${formatBytes(file.size)}; the limit is ${formatBytes(maxBytes)}.`;
    }
    if (file.size === 0) {
      return `Unsupported type: ${name} is empty.`;
    }
    let sniffed = null;
    try {
      sniffed = await sniffType(file);
    } catch (_) {
      return `Could not read ${name}.`;
    }
    if (!sniffed) {
      return `Unsupported type: ${name} does not look like a JPEG, PNG or WebP image.`;
    }
    return null;
  }

  /* ---------- choosing a photo ---------- */

  // A new photo: the previous sketch (of another photo) goes away.
  function clearSketch() {
    closeFullSize();
    els.sketch.hidden = true;
    els.compare.hidden = true;
    els.compareHint.hidden = true;
    els.sketch.removeAttribute("src");
    els.sketch.alt = "";
    delete els.sketch.dataset.imageSize;
    els.sketchPlaceholder.hidden = false;
    els.sketchFrame.classList.remove("stale");
    if (state.sketchUrl) URL.revokeObjectURL(state.sketchUrl);
    state.sketchUrl = null;
    els.download.removeAttribute("href");
    els.download.setAttribute("aria-disabled", "true");
    els.download.removeAttribute("title");
  }

  async function useFile(file) {
    if (!file || state.view !== "sketch") return; // a photo dropped or pasted on the Live view
    const problem = await checkFile(file);
    if (problem) {
      showError(problem);
      setStatus(state.file ? `Kept ${state.file.name}; the new file was not accepted.` : "No photo loaded.");
      return;
    }
    clearError();
    state.file = file;

    if (state.originalUrl) URL.revokeObjectURL(state.originalUrl);
    state.originalUrl = URL.createObjectURL(file);
    els.original.src = state.originalUrl;
    els.original.alt = `Original photo: ${file.name}`;
    els.original.hidden = false;
    els.originalPlaceholder.hidden = true;
    els.comparePhoto.src = state.originalUrl;
    setSplit(SPLIT_DEFAULT);
    els.fileLabel.textContent = "Choose another photo";
    clearSketch();

    render();
  }

  els.file.addEventListener("change", () => {
    const file = els.file.files && els.file.files[0];
    useFile(file);
    els.file.value = ""; // so picking the same file again still fires "change"
  });

  // Clicking anywhere on the drop zone opens the picker (the label handles itself).
  els.dropzone.addEventListener("click", (e) => {
    if (e.target === els.dropzone || e.target.classList.contains("dropzone-hint")) els.file.click();
  });

  // Accept drops anywhere on the page, so a near miss does not navigate away.
  let dragDepth = 0;
  const hasFiles = (e) => e.dataTransfer && Array.from(e.dataTransfer.types || []).includes("Files");
  document.addEventListener("dragenter", (e) => {
    if (!hasFiles(e)) return;
    e.preventDefault();
    dragDepth += 1;
    els.dropzone.classList.add("dragover");
  });
  document.addEventListener("dragover", (e) => {
    if (!hasFiles(e)) return;
    e.preventDefault();
    e.dataTransfer.dropEffect = "copy";
  });
  document.addEventListener("dragleave", () => {
    dragDepth = Math.max(0, dragDepth - 1);
    if (dragDepth === 0) els.dropzone.classList.remove("dragover");
  });
  document.addEventListener("drop", (e) => {
    if (!hasFiles(e)) return;
    e.preventDefault();
    dragDepth = 0;
    els.dropzone.classList.remove("dragover");
    const file = e.dataTransfer.files && e.dataTransfer.files[0];
    useFile(file);
  });

  // Pasting an image from the clipboard works too.
  document.addEventListener("paste", (e) => {
    const items = (e.clipboardData && e.clipboardData.files) || [];
    if (items.length) {
      e.preventDefault();
      useFile(items[0]);
    }
  });

  /* ---------- options ---------- */

  const OUTPUTS = {
    stroke_width: (v) => String(Math.round(v)),
    line_frac: (v) => Number(v).toFixed(4),
    stroke_gamma: (v) => Number(v).toFixed(2),
    tone_gamma: (v) => Number(v).toFixed(2),
    quality: (v) => String(Math.round(v)),
  };

  function syncOutputs() {
    for (const [name, fmt] of Object.entries(OUTPUTS)) {
      const input = els.form.elements[name];
      const out = $(`${name}-out`);
      if (input && out) out.textContent = fmt(input.value);
    }
    const format = els.form.elements.format.value;
    els.quality.disabled = format === "png" && state.view !== "live"; // live frames are JPEG
  }

  // The options as {name: value} for live.js: the enabled fields, numbers as numbers; an
  // empty string (max_side's "Original size") means the server's default.
  function optionValues() {
    const values = {};
    for (const [name, raw] of new FormData(els.form)) {
      values[name] = raw !== "" && Number.isFinite(Number(raw)) ? Number(raw) : raw;
    }
    return values;
  }

  function buildForm() {
    const fd = new FormData(els.form); // disabled fields (quality for PNG) are left out
    if (!fd.get("max_side")) fd.delete("max_side"); // "original": omit the field
    fd.append("image", state.file, state.file.name);
    return fd;
  }

  function schedule(delay = DEBOUNCE_MS) {
    clearTimeout(state.timer);
    if (!state.file) return;
    if (state.view !== "sketch") {
      state.stale = true; // drawn when the Sketch view comes back
      return;
    }
    state.timer = setTimeout(render, delay);
  }

  els.form.addEventListener("input", () => {
    syncOutputs();
    schedule();
  });
  els.form.addEventListener("change", () => {
    syncOutputs();
    schedule();
  });
  els.form.addEventListener("submit", (e) => e.preventDefault());
  els.form.addEventListener("reset", () => {
    // The form resets its fields after this event; read them on the next tick.
    setTimeout(() => {
      syncOutputs();
      schedule();
    }, 0);
  });

  /* ---------- rendering ---------- */

  async function errorMessage(res) {
    let detail = "";
    try {
      const body = await res.json();
      detail = (body && (body.detail || body.error)) || "";
      if (Array.isArray(detail)) { // FastAPI's own validation format
        detail = detail.map((d) => d.msg || JSON.stringify(d)).join("; ");
      } else if (typeof detail !== "string") {
        detail = JSON.stringify(detail);
      }
    } catch (_) {
      detail = "";
    }
    if (!detail) detail = `The server answered ${res.status} ${res.statusText || ""}`.trim() + ".";
    const prefix = STATUS_PREFIX[res.status];
    return prefix ? `${prefix}: ${detail}` : detail;
  }

  function baseName(name) {
    const base = (name || "photo").replace(/\.[^.]+$/, "");
    return base.replace(/[\\/:*?"<>|]+/g, "_") || "photo";
  }

  function setDownload(blob, type) {
    const ext = EXT[type] || "png";
    els.download.href = state.sketchUrl;
    els.download.download = `${baseName(state.file.name)}-sketch.${ext}`;
    els.download.removeAttribute("aria-disabled");
    els.download.title = `${els.download.download} (${formatBytes(blob.size)})`;
  }

  function loadImage(img, url) {
    return new Promise((resolve, reject) => {
      img.onload = () => resolve();
      img.onerror = () => reject(new Error("The sketch could not be decoded."));
      img.src = url;
    });
  }

  async function render() {
    clearTimeout(state.timer);
    if (!state.file) return;
    if (state.controller) state.controller.abort();
    const controller = new AbortController();
    state.controller = controller;
    const seq = ++state.seq;
    const fileName = state.file.name;

    setBusy(true);
    setStatus(`Drawing ${fileName}…`);

    try {
      const res = await fetch("/sketch", { method: "POST", body: buildForm(), signal: controller.signal });
      if (!res.ok) {
        const message = await errorMessage(res);
        if (seq !== state.seq) return;
        showError(message);
        els.sketchFrame.classList.toggle("stale", !els.sketch.hidden);
        setStatus(`Render failed (HTTP ${res.status}).`);
        return;
      }
      const blob = await res.blob();
      if (seq !== state.seq) return;

      const type = (res.headers.get("Content-Type") || blob.type || "image/png").split(";")[0].trim();
      const backend = res.headers.get("X-Backend") || "unknown";
      const ms = parseFloat(res.headers.get("X-Render-Ms") || "");
      const size = res.headers.get("X-Image-Size") || "";
      const queueMs = parseFloat(res.headers.get("X-Queue-Ms") || "");

      const url = URL.createObjectURL(blob);
      const decoded = new Image();
      await loadImage(decoded, url); // decode off-screen first
      if (seq !== state.seq) {
        URL.revokeObjectURL(url);
        return;
      }
      if (state.sketchUrl) URL.revokeObjectURL(state.sketchUrl);
      state.sketchUrl = url;
      els.sketch.src = url;
      if (els.full.open) els.fullImg.src = url;
      sizeCompare(decoded.naturalWidth, decoded.naturalHeight);

      els.sketch.alt = `Pencil sketch of ${fileName}`;
      els.sketch.dataset.imageSize = size;
      els.sketch.hidden = false;
      els.compare.hidden = false;
      els.compareHint.hidden = false;
      els.sketchPlaceholder.hidden = true;
      els.sketchFrame.classList.remove("stale");
      setDownload(blob, type);
      clearError();

      const parts = [];
      if (size) parts.push(size.replace("x", " × ") + " px");
      if (Number.isFinite(ms)) parts.push(ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${Math.round(ms)} ms`);
      if (Number.isFinite(queueMs) && queueMs >= 50) parts.push(`waited ${Math.round(queueMs)} ms in queue`);
      parts.push(`backend: ${backend}`);
      setStatus(`Done · ${parts.join(" · ")}`);
    } catch (err) {
      if (err && err.name === "AbortError") return; // superseded by a newer request
      if (seq !== state.seq) return;
      const message = err instanceof TypeError
        ? "Could not reach the server. Check the connection and try again."
        : (err && err.message) || String(err);
      showError(message);
      els.sketchFrame.classList.toggle("stale", !els.sketch.hidden);
      setStatus("Render failed.");
    } finally {
      if (seq === state.seq) {
        setBusy(false);
        state.controller = null;
      }
    }
  }

  // The download link does nothing until there is a sketch.
  els.download.addEventListener("click", (e) => {
    if (els.download.getAttribute("aria-disabled") === "true") e.preventDefault();
  });

  /* ---------- before/after: the photo over the drawing, clipped at a divider ---------- */

  // The box takes the drawing's aspect ratio and is never wider than the drawing; the photo
  // is stretched to the same box, so a downscaled drawing still lines up with its photo.
  function sizeCompare(width, height) {
    if (!(width > 0 && height > 0)) return;
    els.compare.style.setProperty("--w", `${width}px`);
    els.compare.style.setProperty("--ar", String(width / height));
  }

  function splitText(v) {
    if (v <= 0) return "Drawing only";
    if (v >= 100) return "Photo only";
    return `Photo ${Math.round(v)}% from the left, drawing ${100 - Math.round(v)}%`;
  }

  function setSplit(v) {
    v = Math.min(100, Math.max(0, Number.isFinite(v) ? v : SPLIT_DEFAULT));
    state.split = v;
    els.compare.style.setProperty("--split", `${+v.toFixed(2)}%`);
    els.compareRange.value = String(Math.round(v));
    els.compareRange.setAttribute("aria-valuetext", splitText(v));
  }

  function splitAt(clientX) {
    const box = els.compare.getBoundingClientRect();
    return box.width > 0 ? ((clientX - box.left) / box.width) * 100 : state.split;
  }

  els.compareRange.addEventListener("input", () => setSplit(els.compareRange.valueAsNumber));
  els.compareRange.addEventListener("keydown", (e) => {
    const steps = { ArrowRight: SPLIT_KEY_STEP, ArrowUp: SPLIT_KEY_STEP, ArrowLeft: -SPLIT_KEY_STEP,
      ArrowDown: -SPLIT_KEY_STEP, PageUp: 25, PageDown: -25 };
    if (!(e.key in steps)) return; // Home and End work as they are
    e.preventDefault();
    setSplit(Math.round(state.split) + steps[e.key]);
  });

  // A press on the drawing that moves sideways drags the divider to the pointer; one that
  // does not is a click and opens the full-size view. The knob drags from the first move
  // and never opens the view.
  function endDrag() {
    state.drag = null;
    els.compare.classList.remove("dragging");
  }

  els.compare.addEventListener("pointerdown", (e) => {
    if (!e.isPrimary || e.button !== 0 || e.target.closest("#fullsize-open, #compare-range")) return;
    const onKnob = Boolean(e.target.closest(".compare-knob"));
    state.drag = { id: e.pointerId, x: e.clientX, moving: onKnob, onKnob };
    if (onKnob) els.compare.classList.add("dragging");
    try {
      els.compare.setPointerCapture(e.pointerId);
    } catch (_) { /* the pointer is already gone */ }
  });
  els.compare.addEventListener("pointermove", (e) => {
    const drag = state.drag;
    if (!drag || e.pointerId !== drag.id) return;
    if (!drag.moving && Math.abs(e.clientX - drag.x) >= DRAG_PX) {
      drag.moving = true;
      els.compare.classList.add("dragging");
    }
    if (drag.moving) {
      e.preventDefault();
      setSplit(splitAt(e.clientX));
    }
  });
  els.compare.addEventListener("pointerup", (e) => {
    const drag = state.drag;
    if (!drag || e.pointerId !== drag.id) return;
    endDrag();
    if (!drag.moving && !drag.onKnob) openFullSize();
  });
  els.compare.addEventListener("pointercancel", endDrag); // e.g. the browser took the gesture to scroll
  els.compare.addEventListener("lostpointercapture", (e) => {
    if (state.drag && e.pointerId === state.drag.id) endDrag();
  });
  els.compare.addEventListener("dragstart", (e) => e.preventDefault());

  /* ---------- the drawing at full size ---------- */

  function openFullSize() {
    if (!state.sketchUrl || els.compare.hidden || els.full.open) return;
    els.fullImg.src = state.sketchUrl;
    els.fullImg.alt = els.sketch.alt;
    const w = els.sketch.naturalWidth;
    const h = els.sketch.naturalHeight;
    els.fullSize.textContent = w && h ? `${w} × ${h} px` : "";
    state.opener = document.activeElement;
    document.documentElement.classList.add("lightbox-open");
    els.full.showModal();
    els.fullScroll.scrollTo(0, 0);
  }

  function closeFullSize() {
    if (els.full.open) els.full.close();
  }

  els.fullOpen.addEventListener("click", openFullSize);
  els.fullClose.addEventListener("click", closeFullSize);
  // A click on the dark surround (not on the drawing, the bar or its button) closes the view;
  // Escape closes it too (the dialog's own "cancel").
  els.full.addEventListener("click", (e) => {
    if (e.target === els.full || e.target === els.fullScroll) closeFullSize();
  });
  els.full.addEventListener("close", () => {
    document.documentElement.classList.remove("lightbox-open");
    const opener = state.opener;
    state.opener = null;
    if (opener && opener !== document.body && document.contains(opener) && !opener.closest("[hidden]")) {
      opener.focus({ preventScroll: true });
    }
  });

  /* ---------- views: Sketch and Live ---------- */

  // The tabs are links ("/" and "/#live") that switch the view in place, so the photo, its
  // drawing and the options stay; Back and Forward switch too. Leaving a view is announced
  // to live.js with a "pencil:view" event on the document (it stops the camera).
  function viewOfUrl() {
    return location.hash === "#live" ? "live" : "sketch";
  }

  function setView(view) {
    if (!(view in els.views) || view === state.view) return;
    state.view = view;
    for (const [name, section] of Object.entries(els.views)) section.hidden = name !== view;
    for (const tab of els.tabs) {
      if (tab.dataset.view === view) tab.setAttribute("aria-current", "page");
      else tab.removeAttribute("aria-current");
    }
    document.body.dataset.view = view;
    document.title = view === "live" ? "Pencil — live camera" : "Pencil — photo to pencil drawing";
    if (view !== "sketch") closeFullSize();
    syncOutputs();
    if (view === "sketch" && state.stale) {
      state.stale = false;
      schedule(0);
    }
    document.dispatchEvent(new CustomEvent("pencil:view", { detail: { view } }));
  }

  for (const tab of els.tabs) {
    tab.addEventListener("click", (e) => {
      if (e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return; // a new tab or window
      e.preventDefault();
      if (tab.dataset.view === state.view) return;
      history.pushState(null, "", tab.getAttribute("href"));
      setView(tab.dataset.view);
    });
  }
  window.addEventListener("popstate", () => setView(viewOfUrl()));

  /* ---------- server defaults ---------- */

  // If /healthz names the options' defaults ({"tone": "auto", ...}), they become the form's:
  // what "Reset" restores, and selected now unless the user has already changed that field.
  // Values the page does not offer are ignored. True if a field's value changed.
  function applyDefaults(defaults) {
    if (!defaults || typeof defaults !== "object") return false;
    let changed = false;
    for (const [name, raw] of Object.entries(defaults)) {
      const field = els.form.elements[name];
      if (!field || raw === null || typeof raw === "object") continue;
      const value = String(raw);
      const radios = field instanceof RadioNodeList ? Array.from(field) : field.type === "radio" ? [field] : null;
      const current = () => (radios ? (radios.find((r) => r.checked) || { value: null }).value : field.value);
      const before = current();
      // Setting a default also selects it in a field the user has not touched, and may in
      // one they have: so read "untouched" first and put the user's choice back after.
      if (radios) {
        if (!radios.some((r) => r.value === value)) continue;
        const untouched = radios.every((r) => r.checked === r.defaultChecked);
        for (const r of radios) r.defaultChecked = r.value === value;
        for (const r of radios) r.checked = r.value === (untouched ? value : before);
      } else if (field.tagName === "SELECT") {
        const options = Array.from(field.options);
        if (!options.some((o) => o.value === value)) continue;
        const untouched = options.every((o) => o.selected === o.defaultSelected);
        for (const o of options) o.defaultSelected = o.value === value;
        field.value = untouched ? value : before;
      } else if (field.type === "range") {
        const untouched = field.value === field.defaultValue;
        field.defaultValue = value;
        field.value = untouched ? value : before;
      } else {
        continue;
      }
      if (current() !== before) changed = true;
    }
    return changed;
  }

  /* ---------- footer ---------- */

  async function loadHealth() {
    try {
      const res = await fetch("/healthz", { headers: { Accept: "application/json" } });
      const h = await res.json();
      const parts = [`Backend: ${h.backend || "unknown"}`];
      if (Array.isArray(h.devices) && h.devices.length) {
        parts.push(h.devices.map((d) => (typeof d === "string" ? d : d.name || JSON.stringify(d))).join(", "));
      }
      if (h.version) parts.push(`v${h.version}`);
      if (h.limits && Number.isFinite(h.limits.max_upload_bytes)) {
        maxBytes = h.limits.max_upload_bytes;
        els.fileHint.textContent = `or drop it here · JPEG, PNG or WebP, up to ${formatBytes(maxBytes)}`;
      }
      els.backend.textContent = parts.join(" · ");
      window.pencil.health = h; // live.js picks the Live view's defaults for the backend
      document.dispatchEvent(new CustomEvent("pencil:health", { detail: h }));
      if (applyDefaults(h.defaults)) {
        syncOutputs();
        schedule(0);
      }
      els.backend.dataset.backend = h.backend || "";
      if (!res.ok || h.status !== "ok") els.backend.textContent += ` (${h.status || res.status})`;
    } catch (_) {
      els.backend.textContent = "Backend: unavailable";
    }
  }

  // What live.js borrows: the options form and its values.
  window.pencil = { form: els.form, optionValues };

  document.body.dataset.view = state.view;
  setView(viewOfUrl());
  syncOutputs();
  loadHealth();
})();
