/* Pencil's Live view: the camera drawn as it moves, over the /live WebSocket (docs/live.md).
   Frames go out as JPEG binary messages, at most MAX_IN_FLIGHT not yet answered; each drawing
   comes back as a "frame" text message followed by the image. The options form is the one of
   the Sketch view (app.js lends it as window.pencil); a change is sent as an "options" message.
   Plain JS, no build step. */
(() => {
  "use strict";

  const MAX_IN_FLIGHT = 2;            // frames sent and not yet answered; the server keeps only the newest anyway
  const MIN_SEND_INTERVAL_MS = 1000 / 30; // never faster than a 30 fps camera
  const FRAME_QUALITY = 0.8;          // JPEG quality of the frames sent
  // The frame rate counts the drawings of the last RATE_WINDOW_FRAMES intervals, over at least
  // RATE_WINDOW_MS (steady at 30 fps) and at most RATE_WINDOW_MAX_MS (a CPU backend may take
  // longer than 2 s a frame: a 2 s window read 0.0 fps while drawings came).
  const RATE_WINDOW_MS = 2000;
  const RATE_WINDOW_MAX_MS = 10000;
  const RATE_WINDOW_FRAMES = 4;
  // On the CPU backend a 1024 px `lu` drawing lags the camera by seconds: the Live view picks
  // these in the fields left at their defaults, and gives them back on leaving it.
  const CPU_LIVE_DEFAULTS = { texture: "fast", max_side: "640" };
  const STATS_EVERY_MS = 500;
  const OPTIONS_DEBOUNCE_MS = 150;
  const STALL_MS = 15000;             // no answer for this long with frames in flight: count them lost
  const VIDEO = { width: { ideal: 1280 }, height: { ideal: 720 } };

  const pencil = window.pencil;
  const $ = (id) => document.getElementById(id);
  const els = {
    toggle: $("live-toggle"),
    toggleText: $("live-toggle-text"),
    error: $("live-error"),
    status: $("live-status"),
    video: $("live-video"),
    videoPlaceholder: $("live-video-placeholder"),
    drawing: $("live-drawing"),
    drawingPlaceholder: $("live-drawing-placeholder"),
    snapshot: $("live-snapshot"),
    fps: $("live-fps"),
    latency: $("live-latency"),
    rtt: $("live-rtt"),
    frames: $("live-frames"),
    dropped: $("live-dropped"),
    cpuHint: $("live-cpu-hint"),
  };

  // The running session, or null. Every callback of a session checks that it is still the
  // current one, so a late event of a stopped session changes nothing.
  let session = null;
  const canvas = document.createElement("canvas"); // where a video frame becomes a JPEG
  // The drawing shown: its blob (for the snapshot) and object URL (revoked when replaced).
  const shown = { blob: null, url: null, pendingUrl: null };

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

  function cameraProblem(err) {
    switch (err && err.name) {
      case "NotAllowedError":
      case "SecurityError":
        return "Camera permission was denied. Allow this page to use the camera (in the address bar or the site settings), then press Start camera.";
      case "NotFoundError":
      case "OverconstrainedError":
        return "No camera was found. Connect a camera, then press Start camera.";
      case "NotReadableError":
      case "AbortError":
        return "The camera could not be started: another application may be using it.";
      default:
        return `The camera could not be started: ${(err && err.message) || err}.`;
    }
  }

  // Why the server closed the connection, for the user; null for a normal close.
  function closeProblem(event, opened) {
    const reason = event.reason ? ` (${event.reason})` : "";
    switch (event.code) {
      case 1000:
        return "The server ended the live drawing. Press Start camera to go on.";
      case 1001:
        return "The server is restarting. Press Start camera in a moment to go on.";
      case 1009:
        return `A camera frame was larger than the server takes${reason}.`;
      case 1013:
        return `The server is drawing as many live cameras as it can${reason}. Try again in a moment.`;
      case 4422:
        return `The server refused the options${reason}. Change them, then press Start camera.`;
      default:
        return opened
          ? "The connection to the server was lost. Check the connection, then press Start camera."
          : "Could not connect to the server's live drawing. Check the connection, then press Start camera.";
    }
  }

  function formatMs(ms) {
    if (!Number.isFinite(ms)) return "–";
    return ms >= 100 ? `${Math.round(ms)} ms` : `${ms.toFixed(1)} ms`;
  }

  /* ---------- the options ---------- */

  // The form's options for a live session: the drawing options and the JPEG quality. In an
  // options message "" puts an option back to its default (max_side's "Original size").
  function liveOptions() {
    const values = pencil.optionValues();
    delete values.format;
    return values;
  }

  function liveUrl(options) {
    const query = new URLSearchParams({ format: "jpeg" });
    for (const [name, value] of Object.entries(options)) {
      if (value !== "") query.set(name, String(value)); // "": the server's default
    }
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    return `${scheme}//${location.host}/live?${query}`;
  }

  function sendOptions(s) {
    s.optionsTimer = 0;
    if (s !== session || !s.ready) return;
    const options = liveOptions();
    const text = JSON.stringify(options);
    if (text === s.optionsSent) return;
    s.optionsSent = text;
    s.maxSide = options.max_side || Infinity;
    s.ws.send(JSON.stringify({ type: "options", options }));
  }

  function optionsChanged() {
    const s = session;
    if (!s || !s.ready) return; // a session not ready yet opens with the form's options
    clearTimeout(s.optionsTimer);
    s.optionsTimer = setTimeout(() => sendOptions(s), OPTIONS_DEBOUNCE_MS);
  }

  pencil.form.addEventListener("input", optionsChanged);
  pencil.form.addEventListener("change", optionsChanged);
  pencil.form.addEventListener("reset", () => {
    picked.clear();
    chosen.clear();
    setTimeout(() => { // the fields reset after the event
      pickLiveDefaults();
      optionsChanged();
    }, 0);
  });

  /* ---------- the Live view's defaults on the CPU backend ---------- */

  const picked = new Map(); // field name -> the value this file put there, given back on leaving
  const chosen = new Set(); // fields the user has changed (since the last Reset): never picked for

  function fieldState(name) {
    const field = pencil.form.elements[name];
    if (!field) return null;
    if (field.tagName === "SELECT") {
      const options = Array.from(field.options);
      const initial = options.find((o) => o.defaultSelected) || options[0];
      return { value: field.value, initial: initial.value, set: (v) => { field.value = v; } };
    }
    const radios = Array.from(field);
    return {
      value: (radios.find((r) => r.checked) || { value: null }).value,
      initial: (radios.find((r) => r.defaultChecked) || { value: null }).value,
      set: (v) => { for (const r of radios) r.checked = r.value === v; },
    };
  }

  function liveViewShown() {
    return document.body.dataset.view === "live";
  }

  // In the Live view on the CPU backend: CPU_LIVE_DEFAULTS in the fields still at their
  // defaults that the user never changed. No input event: the Sketch view's
  // photo is not drawn again for it.
  function pickLiveDefaults() {
    const cpu = Boolean(pencil.health && pencil.health.backend === "cpu");
    els.cpuHint.hidden = !cpu;
    if (!cpu || !liveViewShown()) return;
    for (const [name, value] of Object.entries(CPU_LIVE_DEFAULTS)) {
      const field = fieldState(name);
      if (!field || chosen.has(name) || field.value !== field.initial || field.value === value) continue;
      field.set(value);
      picked.set(name, value);
    }
  }

  // Leaving the Live view: the fields this file set, and the user left so, get their defaults back.
  function givePicksBack() {
    for (const [name, value] of picked) {
      const field = fieldState(name);
      if (field && field.value === value) field.set(field.initial);
    }
    picked.clear();
  }

  // A field the user changes is theirs: it keeps its value on leaving, and is not picked again.
  pencil.form.addEventListener("change", (e) => {
    picked.delete(e.target.name);
    chosen.add(e.target.name);
  });
  document.addEventListener("pencil:health", pickLiveDefaults);
  document.addEventListener("pencil:view", (e) => {
    if (e.detail.view === "live") pickLiveDefaults();
    else givePicksBack();
  });
  pickLiveDefaults(); // the page may open on #live with /healthz already read

  /* ---------- starting and stopping ---------- */

  function setRunning(running) {
    els.toggleText.textContent = running ? "Stop camera" : "Start camera";
    els.toggle.classList.toggle("is-live", running);
  }

  async function start() {
    if (session) return;
    clearError();
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
      showError(window.isSecureContext
        ? "This browser cannot share a camera with the page."
        : "The camera needs a secure page: open this site over HTTPS (or on localhost).");
      return;
    }
    const s = {
      stream: null,
      ws: null,
      ready: false,
      opened: false,
      maxPixels: Infinity,
      maxBytes: Infinity,
      maxSide: Infinity,  // the max_side sent: larger frames would only be scaled down by the server
      sent: 0,            // frames sent: the server numbers them 1, 2, ... in the same order
      done: 0,            // the newest frame answered (drawn, dropped before it or refused)
      sentAt: new Map(),  // frame number -> performance.now() when it was sent
      lastSend: -Infinity,
      lastAnswer: 0,
      encoding: false,
      meta: null,         // the "frame" message whose image comes next
      drawnAt: [],        // arrival times of the drawings of the last RATE_WINDOW_MAX_MS, and one before
      drawn: 0,
      latencyMs: NaN,
      rttMs: NaN,
      frameError: false,  // the error shown is about a frame: the next drawing clears it
      optionsSent: "",
      optionsTimer: 0,
      pumpTimer: 0,
      statsTimer: 0,
    };
    session = s;
    resetStats();
    setRunning(true);
    setStatus("Asking for the camera…");

    try {
      s.stream = await navigator.mediaDevices.getUserMedia({ video: VIDEO, audio: false });
    } catch (err) {
      if (s !== session) return;
      stop();
      showError(cameraProblem(err));
      setStatus("The camera is off.");
      return;
    }
    if (s !== session) { // stopped while the browser asked
      stopTracks(s.stream);
      return;
    }
    els.video.srcObject = s.stream;
    els.video.hidden = false;
    els.videoPlaceholder.hidden = true;
    try {
      await els.video.play();
    } catch (_) { /* a stop during play(); the checks below see it */ }
    if (s !== session) return;

    setStatus("Connecting to the server…");
    const options = liveOptions();
    s.optionsSent = JSON.stringify(options);
    s.maxSide = options.max_side || Infinity;
    const ws = new WebSocket(liveUrl(options));
    ws.binaryType = "blob";
    s.ws = ws;
    ws.addEventListener("open", () => { s.opened = true; });
    ws.addEventListener("message", (e) => onMessage(s, e));
    ws.addEventListener("close", (e) => {
      if (s !== session) return; // we closed it
      const problem = closeProblem(e, s.opened);
      stop();
      showError(problem);
      setStatus("Stopped.");
    });
    s.statsTimer = setInterval(() => tick(s), STATS_EVERY_MS);
  }

  function resetStats() {
    for (const el of [els.fps, els.latency, els.rtt]) el.textContent = "–";
    els.frames.textContent = "0";
    els.frames.dataset.count = "0";
    els.dropped.textContent = "0";
  }

  function stopTracks(stream) {
    if (stream) for (const track of stream.getTracks()) track.stop();
  }

  // Close the connection, turn the camera off; the last drawing stays (and its snapshot).
  function stop(message) {
    const s = session;
    if (!s) return;
    session = null;
    clearTimeout(s.optionsTimer);
    clearTimeout(s.pumpTimer);
    clearInterval(s.statsTimer);
    if (s.ws && s.ws.readyState <= WebSocket.OPEN) s.ws.close(1000, "stopped");
    stopTracks(s.stream);
    els.video.pause();
    els.video.srcObject = null;
    els.video.hidden = true;
    els.videoPlaceholder.hidden = false;
    els.fps.textContent = "–";
    setRunning(false);
    if (message) setStatus(message);
  }

  els.toggle.addEventListener("click", () => {
    if (session) stop("Stopped. Press Start camera to go on.");
    else start();
  });

  // The camera is never left on for a page nobody looks at.
  document.addEventListener("pencil:view", (e) => {
    if (e.detail.view !== "live") stop("Stopped: you left the Live view.");
  });
  document.addEventListener("visibilitychange", () => {
    if (document.hidden) stop("Stopped while the page was hidden. Press Start camera to go on.");
  });
  window.addEventListener("pagehide", () => {
    stop();
    showDrawing(null);
  });

  /* ---------- frames out ---------- */

  // Send the camera's current frame if fewer than MAX_IN_FLIGHT are unanswered, not sooner
  // than MIN_SEND_INTERVAL_MS after the last one.
  function pump(s) {
    if (s !== session || !s.ready || s.encoding || s.pumpTimer) return;
    if (s.sent - s.done >= MAX_IN_FLIGHT) return; // an answer calls pump again
    const wait = s.lastSend + MIN_SEND_INTERVAL_MS - performance.now();
    const video = els.video;
    if (wait > 0 || video.readyState < HTMLMediaElement.HAVE_CURRENT_DATA || !video.videoWidth) {
      s.pumpTimer = setTimeout(() => {
        s.pumpTimer = 0;
        pump(s);
      }, Math.max(wait, 20));
      return;
    }
    // Scaled down, keeping the camera's shape, to the max_side the server would scale it to
    // anyway (less to encode and upload) and to its max_pixels.
    const { videoWidth: width, videoHeight: height } = video;
    const scale = Math.min(1, s.maxSide / Math.max(width, height), Math.sqrt(s.maxPixels / (width * height)));
    canvas.width = Math.round(width * scale);
    canvas.height = Math.round(height * scale);
    const context = canvas.getContext("2d");
    context.imageSmoothingQuality = "high";
    context.drawImage(video, 0, 0, canvas.width, canvas.height);
    s.encoding = true;
    const capturedAt = performance.now();
    s.lastSend = capturedAt;
    canvas.toBlob((blob) => {
      s.encoding = false;
      if (s !== session) return;
      if (!blob || blob.size > s.maxBytes) {
        pump(s); // skip this frame
        return;
      }
      s.ws.send(blob);
      s.sent += 1;
      s.sentAt.set(s.sent, capturedAt); // the round trip counts the encoding too
      pump(s);
    }, "image/jpeg", FRAME_QUALITY);
  }

  // Frames up to `frame` are answered: drawn, or dropped for a newer one.
  function answered(s, frame) {
    if (!Number.isFinite(frame)) return;
    s.done = Math.max(s.done, Math.min(frame, s.sent));
    s.lastAnswer = performance.now();
    for (const n of s.sentAt.keys()) if (n < frame) s.sentAt.delete(n);
  }

  /* ---------- drawings in ---------- */

  function onMessage(s, e) {
    if (s !== session) return;
    if (typeof e.data !== "string") {
      onDrawing(s, e.data);
      return;
    }
    let msg;
    try {
      msg = JSON.parse(e.data);
    } catch (_) {
      return; // not the protocol's; ignored
    }
    switch (msg.type) {
      case "ready":
        s.ready = true;
        s.lastAnswer = performance.now();
        if (Number.isFinite(msg.max_pixels)) s.maxPixels = msg.max_pixels;
        if (Number.isFinite(msg.max_bytes)) s.maxBytes = msg.max_bytes;
        s.backend = msg.backend || "unknown";
        setStatus(`Live · drawing on the ${s.backend} backend.`);
        sendOptions(s); // the options may have changed while connecting
        pump(s);
        break;
      case "frame":
        s.meta = msg;
        break;
      case "options":
        clearError();
        break;
      case "error": {
        const detail = msg.detail || msg.error || "unknown error";
        if (msg.frame === undefined) { // an options message refused; the previous options stay
          showError(`The server refused the options: ${detail}`);
          break;
        }
        showError(`A frame was not drawn: ${detail}`); // until a drawing comes back
        s.frameError = true;
        answered(s, msg.frame);
        s.sentAt.delete(msg.frame);
        pump(s);
        break;
      }
      default:
        break;
    }
  }

  function onDrawing(s, blob) {
    const meta = s.meta || {};
    s.meta = null;
    const now = performance.now();
    const sentAt = s.sentAt.get(meta.frame);
    if (sentAt !== undefined) s.rttMs = now - sentAt;
    if (Number.isFinite(meta.latency_ms)) s.latencyMs = meta.latency_ms;
    answered(s, meta.frame);
    s.sentAt.delete(meta.frame);
    s.drawn += 1;
    s.drawnAt.push(now);
    showDrawing(blob, meta);
    if (s.frameError) {
      s.frameError = false;
      clearError();
    }
    els.frames.textContent = String(s.drawn);
    els.frames.dataset.count = String(s.drawn);
    if (Number.isFinite(meta.dropped)) els.dropped.textContent = String(meta.dropped);
    els.latency.textContent = formatMs(s.latencyMs);
    els.rtt.textContent = formatMs(s.rttMs);
    pump(s);
  }

  // Show a drawing (null: none). The previous object URL is revoked once the new image has
  // loaded, so the old one stays on screen until then; one that never loaded is revoked
  // when a newer one replaces it.
  function showDrawing(blob, meta) {
    if (shown.pendingUrl) URL.revokeObjectURL(shown.pendingUrl);
    shown.pendingUrl = null;
    if (!blob) {
      if (shown.url) URL.revokeObjectURL(shown.url);
      shown.url = null;
      shown.blob = null;
      els.drawing.removeAttribute("src");
      els.drawing.hidden = true;
      els.drawingPlaceholder.hidden = false;
      els.snapshot.disabled = true;
      return;
    }
    const url = URL.createObjectURL(blob);
    shown.pendingUrl = url;
    shown.blob = blob;
    els.drawing.src = url;
    if (meta && meta.width && meta.height) {
      els.drawing.alt = `Pencil drawing of the camera image, ${meta.width} × ${meta.height} px`;
    }
  }

  els.drawing.addEventListener("load", () => {
    if (!shown.pendingUrl || els.drawing.src !== shown.pendingUrl) return;
    if (shown.url) URL.revokeObjectURL(shown.url);
    shown.url = shown.pendingUrl;
    shown.pendingUrl = null;
    els.drawing.hidden = false;
    els.drawingPlaceholder.hidden = true;
    els.snapshot.disabled = false;
  });

  /* ---------- statistics ---------- */

  // Drawings a second at `now`, from their arrival times `times` (ascending; one older than
  // RATE_WINDOW_MAX_MS kept): the intervals since the drawing RATE_WINDOW_FRAMES back, the time
  // since the last one included (so the rate falls when drawings stop), over a window kept
  // between RATE_WINDOW_MS and RATE_WINDOW_MAX_MS. NaN before two drawings.
  function frameRate(times, now) {
    if (times.length < 2) return times.length && now - times[0] > RATE_WINDOW_MAX_MS ? 0 : NaN;
    const back = Math.max(0, times.length - 1 - RATE_WINDOW_FRAMES);
    const from = Math.min(Math.max(times[back], now - RATE_WINDOW_MAX_MS), now - RATE_WINDOW_MS);
    if (from <= times[0]) return (times.length - 1) / ((now - times[0]) / 1000); // the session's start
    if (from === times[back]) return (times.length - 1 - back) / ((now - from) / 1000);
    return times.filter((t) => t > from).length / ((now - from) / 1000);
  }

  // Every STATS_EVERY_MS: the frame rate (frameRate), and frames presumed lost when nothing has
  // come back for STALL_MS.
  function tick(s) {
    if (s !== session) return;
    const now = performance.now();
    while (s.drawnAt.length > 1 && s.drawnAt[1] < now - RATE_WINDOW_MAX_MS) s.drawnAt.shift();
    if (s.drawn) {
      const rate = frameRate(s.drawnAt, now);
      els.fps.textContent = Number.isFinite(rate) ? `${rate.toFixed(1)} fps` : "–";
    }
    if (s.ready && s.sent > s.done && now - s.lastAnswer > STALL_MS) {
      answered(s, s.sent);
      pump(s);
    }
  }

  pencil.frameRate = frameRate; // for the browser tests

  /* ---------- snapshot ---------- */

  function timestamp(date) {
    const pad = (n) => String(n).padStart(2, "0");
    return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}` +
      `T${pad(date.getHours())}-${pad(date.getMinutes())}-${pad(date.getSeconds())}`;
  }

  els.snapshot.addEventListener("click", () => {
    if (!shown.blob) return;
    const link = document.createElement("a");
    link.href = URL.createObjectURL(new Blob([shown.blob], { type: "image/jpeg" }));
    link.download = `live-sketch-${timestamp(new Date())}.jpg`;
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 10000);
    setStatus(`Saved ${link.download}.`);
  });
})();
