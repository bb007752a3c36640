// The batch-job page: the admin token (sessionStorage), an SVD submission form, the
// stored texts of the search job (upload, search, delete), a JSON form for every job kind
// (examples from /openapi.json), and the job list, refreshed every 2 s. Every request carries "Authorization: Bearer <token>"; result files are fetched
// with it and saved through an object URL; PNG results are shown as thumbnails.
"use strict";

const $ = (id) => document.getElementById(id);
const tokenInput = $("token");
tokenInput.value = sessionStorage.getItem("pencil-admin-token") || "";

function headers(extra = {}) {
  return { Authorization: `Bearer ${tokenInput.value.trim()}`, ...extra };
}

// The page's one error line. `from` names who set it ("refresh" for the periodic reload,
// "action" for a click): each clears only its own, and the refresh never replaces an
// action's error, so the 2 s reload never wipes what the operator has not read yet (their
// next action clears it).
let errorFrom = null;
function showError(message, from = "action") {
  if (!message && errorFrom !== from) return;
  if (from === "refresh" && errorFrom === "action") return;
  errorFrom = message ? from : null;
  $("error").textContent = message;
  $("error").hidden = !message;
}

async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: headers(options.headers) });
  if (!response.ok) {
    let detail = `${response.status} ${response.statusText}`;
    try { detail = (await response.json()).detail || detail; } catch { /* not JSON */ }
    throw new Error(detail);
  }
  return response;
}

function cell(text) {
  const td = document.createElement("td");
  td.textContent = text;
  return td;
}

async function download(url, name) {
  try {
    const blob = await (await api(url)).blob();
    const link = document.createElement("a");
    link.href = URL.createObjectURL(blob);
    link.download = name;
    link.click();
    setTimeout(() => URL.revokeObjectURL(link.href), 10000);
  } catch (error) { showError(error.message); }
}

// One line about a finished job's result: the SVD's own, else its first few scalar fields.
function summarize(kind, result) {
  if (kind === "svd") {
    const accuracy = result.accuracy;
    return `${result.m}x${result.n} ${result.method}, ${Math.round(result.times_ms.svd)} ms` + (accuracy ? `, residual ratio ${accuracy.resid.toFixed(2)}` : "");
  }
  if (kind === "search") {
    const found = result.patterns.map((p) => `${p.pattern === null ? `(${p.length} bytes)` : JSON.stringify(p.pattern.length > 24 ? `${p.pattern.slice(0, 24)}…` : p.pattern)} ×${p.count}`);
    return `${found.join(", ")} in ${formatBytes(result.text_bytes)}, ${result.backend}, ${Math.round(result.times_ms.total)} ms`;
  }
  const scalars = Object.entries(result).filter(([, value]) => ["number", "string", "boolean"].includes(typeof value));
  return scalars.slice(0, 5).map(([key, value]) => `${key} ${typeof value === "number" ? Number(value.toPrecision(4)) : value}`).join(", ");
}

async function thumbnail(url, name) {
  const image = document.createElement("img");
  image.className = "result-thumb";
  image.alt = name;
  image.src = URL.createObjectURL(await (await api(url)).blob());
  return image;
}

async function resultCell(job) {
  const td = document.createElement("td");
  if (job.status === "failed" || job.status === "canceled") { td.textContent = job.error || job.status; return td; }
  if (job.status !== "succeeded") return td;
  const result = await (await api(job.result_url)).json();
  const summary = document.createElement("span");
  summary.textContent = summarize(job.kind, result.result);
  td.append(summary);
  const gallery = document.createElement("div");
  gallery.className = "thumbs";
  for (const [name, url] of Object.entries(result.files)) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "link";
    button.textContent = name;
    button.addEventListener("click", () => download(url, `${job.id}-${name}`));
    td.append(" ", button);
    if (name.endsWith(".png")) {
      try {
        const figure = document.createElement("figure");
        const caption = document.createElement("figcaption");
        caption.textContent = name;
        figure.append(await thumbnail(url, name), caption);
        gallery.append(figure);
      } catch { /* the link alone */ }
    }
  }
  if (gallery.childElementCount) td.append(gallery);
  return td;
}

const results = new Map(); // finished job id -> its rendered result cell (results never change)

async function refresh() {
  if (!tokenInput.value.trim()) return;
  try {
    const { jobs } = await (await api("/jobs?page_size=50")).json();
    const rows = await Promise.all(jobs.map(async (job) => {
      const tr = document.createElement("tr");
      const state = cell(job.cancel_requested && job.status === "running" ? "canceling" : job.status);
      if (job.replica) state.title = `replica ${job.replica}, attempt ${job.attempt}`;  // several replicas: who runs it
      if (job.attempt > 1) state.textContent += ` (attempt ${job.attempt})`;  // an earlier run's replica was lost
      tr.append(cell(`${job.kind} ${job.id.slice(0, 8)}`), state);
      const progress = document.createElement("td");
      const bar = document.createElement("progress");
      bar.max = 1;
      bar.value = job.progress;
      bar.textContent = `${Math.round(job.progress * 100)}%`;
      progress.append(bar);
      tr.append(progress, cell(new Date(job.created).toLocaleString()));
      if (!results.has(job.id) && job.finished) results.set(job.id, await resultCell(job));
      tr.append(results.get(job.id) || document.createElement("td")); // a cached cell moves into the new row
      const actions = document.createElement("td");
      if (!job.finished) {
        const cancel = document.createElement("button");
        cancel.type = "button";
        cancel.className = "button";
        cancel.textContent = "Cancel";
        cancel.addEventListener("click", async () => {
          try { await api(`/jobs/${job.id}`, { method: "DELETE" }); refresh(); } catch (error) { showError(error.message); }
        });
        actions.append(cancel);
      }
      tr.append(actions);
      return tr;
    }));
    $("jobs").tBodies[0].replaceChildren(...rows);
    $("empty").hidden = jobs.length > 0;
    $("status").textContent = `${jobs.length} job${jobs.length === 1 ? "" : "s"}, newest first.`;
    await refreshCorpora();
    showError("", "refresh");
  } catch (error) {
    showError(error.message, "refresh");
  }
}

tokenInput.addEventListener("change", () => {
  sessionStorage.setItem("pencil-admin-token", tokenInput.value.trim());
  results.clear();
  refresh();
});
$("token-form").addEventListener("submit", (event) => event.preventDefault());

for (const radio of document.querySelectorAll("input[name=source]")) {
  radio.addEventListener("change", () => {
    const upload = $("source-upload").checked;
    $("upload-field").hidden = !upload;
    $("spec-fields").hidden = upload;
  });
}

$("svd-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const options = { compute_uv: $("compute_uv").checked, method: $("method").value };
  try {
    if ($("source-upload").checked) {
      const file = $("matrix").files[0];
      if (!file) throw new Error("Choose a .npy file first.");
      const form = new FormData();
      form.append("matrix", file);
      form.append("params", JSON.stringify(options));
      await api("/jobs/svd", { method: "POST", body: form });
    } else {
      const spec = { m: Number($("m").value), n: Number($("n").value), dtype: $("dtype").value, seed: Number($("seed").value), kind: $("kind").value, cond: Number($("cond").value) };
      await api("/jobs/svd", { method: "POST", body: JSON.stringify({ spec, ...options }), headers: { "Content-Type": "application/json" } });
    }
    showError("");
    refresh();
  } catch (error) {
    showError(error.message);
  }
});

// Stored texts (corpora): upload one as the raw body, list them, start a search of one in
// the JSON form, delete one (the server refuses while a search uses it).
function formatBytes(n) {
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

function searchCorpus(corpus) {
  $("json-kind").value = "search";
  const body = { ...(examples.get("search") || {}), corpus_id: corpus.id };
  delete body.text;
  delete body.text_base64;
  $("json-body").value = JSON.stringify(body, null, 2);
  $("json-body").focus();
}

async function refreshCorpora() {
  const { corpora } = await (await api("/corpora")).json();
  $("corpora").replaceChildren(...corpora.map((corpus) => {
    const item = document.createElement("li");
    const label = document.createElement("span");
    label.textContent = `${corpus.name || corpus.id.slice(0, 8)} · ${formatBytes(corpus.bytes)}`;
    label.title = `${corpus.id}, sha256 ${corpus.sha256}`;
    const search = document.createElement("button");
    search.type = "button";
    search.className = "link";
    search.textContent = "Search";
    search.addEventListener("click", () => searchCorpus(corpus));
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "link";
    remove.textContent = "Delete";
    remove.setAttribute("aria-label", `Delete ${corpus.name || corpus.id}`);
    remove.addEventListener("click", async () => {
      try { await api(`/corpora/${corpus.id}`, { method: "DELETE" }); showError(""); await refreshCorpora(); } catch (error) { showError(error.message); }
    });
    item.append(label, " ", search, " ", remove);
    return item;
  }));
}

$("corpus-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const file = $("corpus-file").files[0];
  try {
    if (!file) throw new Error("Choose a text file first.");
    const name = $("corpus-name").value.trim() || file.name;
    $("corpus-submit").disabled = true;
    const response = await api(`/corpora?name=${encodeURIComponent(name)}`, { method: "POST", body: file, headers: { "Content-Type": "application/octet-stream" } });
    const corpus = await response.json();
    showError("");
    await refreshCorpora();
    searchCorpus(corpus);
  } catch (error) {
    showError(error.message);
  } finally {
    $("corpus-submit").disabled = false;
  }
});

// The JSON form: one option per job kind the server runs, its body from the API's example.
const examples = new Map();
async function loadKinds() {
  try {
    const schema = await (await fetch("/openapi.json")).json();
    for (const [path, item] of Object.entries(schema.paths)) {
      const match = path.match(/^\/jobs\/([a-z0-9_]+)$/);
      const content = item.post && item.post.requestBody && item.post.requestBody.content;
      if (!match || !content) continue;
      const json = content["application/json"];
      if (!json) continue; // a kind that takes only uploads (video) has no JSON form
      examples.set(match[1], json.example || {});
    }
  } catch (error) { showError(`Could not read the API schema: ${error.message}`); }
  $("json-kind").replaceChildren(...[...examples.keys()].sort().map((kind) => new Option(kind, kind)));
  showExample();
}
function showExample() {
  const kind = $("json-kind").value;
  $("json-body").value = JSON.stringify(examples.get(kind) || {}, null, 2);
}
$("json-kind").addEventListener("change", showExample);
$("json-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  try {
    let body;
    try { body = JSON.parse($("json-body").value); } catch (error) { throw new Error(`The body is not JSON: ${error.message}`); }
    await api(`/jobs/${$("json-kind").value}`, { method: "POST", body: JSON.stringify(body), headers: { "Content-Type": "application/json" } });
    showError("");
    refresh();
  } catch (error) {
    showError(error.message);
  }
});

loadKinds();
refresh();
setInterval(refresh, 2000);
