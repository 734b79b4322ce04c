// tracklane view: the steps on the left, a step's rollouts (or validation generations) on the right, filtered,
// sorted, searched, and optionally beside another step or as the step's best and worst; below them the step's rollout
// traces, grouped by sample, each rollout's also in its card. Every text from the run is put in with textContent,
// never as HTML.
"use strict";

const state = { run: null, steps: [], step: null, data: null, other: null, alerts: [], charts: {}, runs: [] };
const RUN_COLOURS = ["#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a"];  // the browsed run, then the compared ones
const promptOf = (t) => String((t.messages.find((m) => m.role === "user") || {}).content ?? "");
const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "text") node.textContent = value;
    else if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

const fmt = (x) => (x === null || x === undefined ? "–" : Number(x).toFixed(3));
const duration = (ms) => (ms < 1 ? `${Math.round(ms * 1000)} µs` : ms < 1000 ? `${ms.toFixed(1)} ms` : `${(ms / 1000).toFixed(2)} s`);
const known = (x) => x !== null && x !== undefined;

async function getJSON(url) {
  const response = await fetch(url, { cache: "no-store" });
  if (!response.ok) throw new Error(`${url}: ${response.status}`);
  return response.json();
}

async function refreshRun() {
  let answer;
  try {
    answer = await getJSON("/api/run");
  } catch (err) {
    $("live").textContent = `cannot reach the viewer: ${err.message}`;
    $("live").className = "error";
    return;
  }
  await showRun(answer);
}

// The server pushes the run each time it was read again (server-sent events); if the stream cannot be opened the
// page asks every 2 s instead.
function follow() {
  if (!window.EventSource) { setInterval(refreshRun, 2000); return; }
  const events = new EventSource("/api/events");
  events.addEventListener("run", (event) => showRun(JSON.parse(event.data)));
  events.onerror = () => {
    $("live").textContent = "lost the viewer; trying again";
    $("live").className = "error";
  };
}

async function showRun(answer) {
  state.pushes = (state.pushes || 0) + 1;
  document.body.dataset.pushes = state.pushes;
  state.run = answer.run;
  $("run-title").textContent = `${answer.run.project || ""} / ${answer.run.experiment || ""}`;
  $("run-where").textContent = answer.run.where || "";
  const read = answer.read_at ? new Date(answer.read_at * 1000).toLocaleTimeString() : "never";
  $("live").textContent = answer.error ? `read at ${read}; now: ${answer.error}` : `read at ${read}`;
  $("live").className = answer.error ? "error" : "";
  const before = state.steps.find((s) => s.step === state.step);
  state.steps = answer.steps;
  state.alerts = answer.alerts || [];
  state.charts = answer.charts || {};
  if (state.runs.length !== 1) {  // runs compared (or not known yet): their curves as they are now
    try { state.runs = await getJSON("/api/runs"); } catch { state.runs = []; }
  }
  renderAlerts();
  renderCharts();
  renderSteps();
  renderCompareChoices();
  const after = state.steps.find((s) => s.step === state.step);
  if (after && before && (after.trajectories !== before.trajectories || after.generations !== before.generations
      || after.traces !== before.traces)) {
    await openStep(state.step);
  }
}

function renderSteps() {
  const body = $("steps").tBodies[0];
  body.replaceChildren(...state.steps.map((s) => {
    const row = el("tr", { "data-step": s.step, class: s.step === state.step ? "selected" : "" },
      el("td", { text: s.step }), el("td", { text: s.trajectories }), el("td", { text: fmt(s.score_mean) }),
      el("td", { text: fmt(s.score_min) }), el("td", { text: fmt(s.score_max) }), el("td", { text: s.generations || "" }),
      el("td", { class: s.trace_errors ? "traces error" : "traces", text: s.traces ? `${s.traces}${s.trace_errors ? ` (${s.trace_errors} err)` : ""}` : "" }),
      el("td", { class: "alerted", text: state.alerts.filter((a) => a.step === s.step).map((a) => a.rule).join(", ") }));
    row.addEventListener("click", () => openStep(s.step));
    return row;
  }));
}

// The run's health alerts (docs/health.md): one line each, newest last; a click opens the step when it has rollouts.
function renderAlerts() {
  const box = $("alerts");
  box.hidden = state.alerts.length === 0;
  box.replaceChildren(el("h2", { text: `${state.alerts.length} alert${state.alerts.length === 1 ? "" : "s"}` }),
    ...state.alerts.map((a) => {
      const line = el("div", { class: `alert ${(a.level || "warn").toLowerCase()}`, "data-rule": a.rule, "data-step": a.step },
        el("b", { text: `${a.rule} at step ${a.step}` }), el("span", { text: a.text ? `: ${a.text}` : "" }));
      line.addEventListener("click", () => state.steps.some((s) => s.step === a.step) && openStep(a.step));
      return line;
    }));
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  return node;
}

// Each charted step metric as a line over the steps, every alert a red mark at its step (hover: which and why).
function renderCharts() {
  const W = 300, H = 96, P = 4;
  const legend = state.runs.length > 1 ? [el("div", { class: "legend" }, ...state.runs.map((r, k) =>
    el("span", { style: `color: ${RUN_COLOURS[k]}`, text: `■ ${r.run.experiment || `run ${k}`}${k ? "" : " (browsed)"}` })))] : [];
  $("charts").replaceChildren(...legend, ...Object.entries(state.charts).map(([key, points]) => {
    // the browsed run's points, then each compared run's (same key), on one scale
    const series = [points, ...state.runs.slice(1).map((r) => (r.charts || {})[key] || [])]
      .map((ps) => ps.filter(([, y]) => known(y) && Number.isFinite(y)));
    const finite = series[0];
    const steps = series.flat().map(([x]) => x).concat(state.alerts.map((a) => a.step));
    const x0 = Math.min(...steps), x1 = Math.max(x0 + 1, ...steps);
    const ys = series.flat().map(([, y]) => y), y0 = Math.min(...ys), y1 = Math.max(y0 + 1e-9, ...ys);
    const X = (x) => P + ((x - x0) / (x1 - x0)) * (W - 2 * P), Y = (y) => H - P - ((y - y0) / (y1 - y0)) * (H - 2 * P);
    const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, "data-key": key });
    for (const a of state.alerts) {
      const mark = svg("line", { x1: X(a.step), x2: X(a.step), y1: 0, y2: H, class: "alert-mark", "data-rule": a.rule });
      mark.append(Object.assign(svg("title", {}), { textContent: `${a.rule} at step ${a.step}${a.text ? `: ${a.text}` : ""}` }));
      chart.append(mark);
    }
    series.forEach((ps, k) => chart.append(svg("polyline", { points: ps.map(([x, y]) => `${X(x).toFixed(1)},${Y(y).toFixed(1)}`).join(" "),
      class: "series", "data-run": k, style: `stroke: ${RUN_COLOURS[k]}` })));
    const last = finite.length ? finite[finite.length - 1][1] : null;
    return el("figure", { class: "chart" }, chart, el("figcaption", { text: `${key}  ${fmt(last)}` }));
  }));
}

function renderCompareChoices() {
  const select = $("compare");
  const chosen = select.value;
  const fixed = [...select.options].slice(0, 2);
  const runs = state.runs.slice(1).map((r) => el("option", { value: `run:${r.index}`,
    text: `the same prompts in ${r.run.experiment || `run ${r.index}`}` }));
  const others = state.steps.filter((s) => s.step !== state.step)
    .map((s) => el("option", { value: `step:${s.step}`, text: `step ${s.step}` }));
  select.replaceChildren(...fixed, ...runs, ...others);
  select.value = [...select.options].some((o) => o.value === chosen) ? chosen : "";
}

async function openStep(step) {
  state.step = step;
  state.data = await getJSON(`/api/step/${step}`);
  renderSteps();
  renderCompareChoices();
  const sources = new Set(state.data.trajectories.map((t) => t.data_source).filter(Boolean));
  const select = $("source");
  const chosen = select.value;
  select.replaceChildren(el("option", { value: "", text: "all" }),
    ...[...sources].sort().map((s) => el("option", { value: s, text: s })));
  select.value = sources.has(chosen) ? chosen : "";
  await loadOther();
  render();
  renderTraces();
}

async function loadOther() {
  const compare = $("compare").value;
  state.other = null;
  if (compare.startsWith("step:")) state.other = await getJSON(`/api/step/${compare.slice(5)}`);
  if (compare.startsWith("run:") && known(state.step)) {  // that run's rollouts of this step; none: nothing beside
    try { state.other = await getJSON(`/api/step/${state.step}?run=${compare.slice(4)}`); } catch { state.other = null; }
  }
}

function matches(t) {
  const low = parseFloat($("min-score").value);
  const high = parseFloat($("max-score").value);
  if (!Number.isNaN(low) && !(t.score >= low)) return false;
  if (!Number.isNaN(high) && !(t.score <= high)) return false;
  if ($("source").value && t.data_source !== $("source").value) return false;
  const needle = $("search").value.trim().toLowerCase();
  if (!needle) return true;
  const texts = [...t.messages.map((m) => m.content), ...t.tool_calls.flatMap((c) => [c.name, c.arguments, c.result])];
  return texts.some((x) => String(x ?? "").toLowerCase().includes(needle));
}

function ordered(rows) {
  const sort = $("sort").value;
  const key = (t) => (t.score === null ? -Infinity : t.score);
  const copy = [...rows];
  if (sort === "score-desc") copy.sort((a, b) => key(b) - key(a));
  if (sort === "score-asc") copy.sort((a, b) => key(a) - key(b));
  return copy;
}

function render() {
  if (!state.data) return;
  const metrics = Object.entries(state.data.summary.metrics || {}).map(([k, v]) => `${k} ${fmt(v)}`);
  $("step-metrics").textContent = metrics.join(" · ");
  const compare = $("compare").value;
  const paneB = $("pane-b");
  paneB.hidden = !compare;
  if ($("show").value === "generations") {
    fillGenerations($("pane-a"), state.data);
    if (state.other) fillGenerations(paneB, state.other);
    else paneB.hidden = true;
    return;
  }
  const shown = ordered(state.data.trajectories.filter(matches));
  if ($("show").value === "groups") {
    fillGroups($("pane-a"), `step ${state.step}`, shown);
    if (state.other) fillGroups(paneB, `step ${state.other.step}`, ordered(state.other.trajectories.filter(matches)));
    else paneB.hidden = true;
    return;
  }
  if (compare === "best-worst") {
    const byScore = [...shown].sort((a, b) => (b.score ?? -Infinity) - (a.score ?? -Infinity));
    fillTrajectories($("pane-a"), `step ${state.step}: best`, byScore.slice(0, 1));
    fillTrajectories(paneB, `step ${state.step}: worst`, byScore.slice(-1));
    return;
  }
  fillTrajectories($("pane-a"), `step ${state.step}: ${shown.length} of ${state.data.trajectories.length} rollouts`, shown);
  if (compare.startsWith("run:")) {  // another run's rollouts of the prompts shown here, in their order
    const run = state.runs.find((r) => `run:${r.index}` === compare);
    const order = new Map(shown.map((t, i) => [promptOf(t), i]));
    const same = state.other ? state.other.trajectories.filter((t) => order.has(promptOf(t)))
      .sort((a, b) => order.get(promptOf(a)) - order.get(promptOf(b))) : [];
    fillTrajectories(paneB, `${run ? run.run.experiment : compare} step ${state.step}: ${same.length} rollouts of the same prompts`,
      same, state.other || { step: state.step, traces: [] });
    return;
  }
  if (state.other) {
    const other = ordered(state.other.trajectories.filter(matches));
    fillTrajectories(paneB, `step ${state.other.step}: ${other.length} of ${state.other.trajectories.length} rollouts`, other, state.other);
  }
}

function fillTrajectories(pane, title, rows, data = state.data) {
  const traces = data.traces || [];
  pane.replaceChildren(el("h2", { text: title }),
    ...rows.map((t) => trajectoryCard(t, traces.filter((x) => x.trajectory === t.index), traces, data.step)));
}

// GRPO groups: the rollouts of one prompt (same sample_index) side by side, with the group's reward spread and each
// rollout's advantage: the logged one (meta "advantage") where the trainer logged it, else GRPO's (reward - group
// mean) / group std. A group with no spread teaches nothing (no advantage): it is flagged, as the flat_groups rule counts.
function groups(rows) {
  const byPrompt = new Map();
  for (const t of rows) {
    const key = t.meta && t.meta.sample_index !== undefined ? `sample ${t.meta.sample_index}`
      : `prompt ${String((t.messages.find((m) => m.role === "user") || {}).content ?? "")}`;
    if (!byPrompt.has(key)) byPrompt.set(key, []);
    byPrompt.get(key).push(t);
  }
  return [...byPrompt.entries()].map(([key, members]) => {
    const scores = members.map((t) => t.score).filter(known);
    const mean = scores.reduce((a, b) => a + b, 0) / Math.max(1, scores.length);
    const std = Math.sqrt(scores.reduce((a, b) => a + (b - mean) ** 2, 0) / Math.max(1, scores.length));
    const advantage = (t) => (known(t.meta && t.meta.advantage) ? Number(t.meta.advantage)
      : known(t.score) ? (std > 1e-9 ? (t.score - mean) / std : 0) : null);
    // one stored rollout of a group (a tracker keeps a sample of the step's) shows no spread: not flagged
    return { key, members: members.map((t) => ({ t, advantage: advantage(t) })), mean, std,
      flat: members.length > 1 && std <= 1e-9 };
  });
}

function fillGroups(pane, title, rows) {
  const all = groups(rows);
  const flat = all.filter((g) => g.flat).length;
  pane.replaceChildren(el("h2", { text: `${title}: ${all.length} groups, ${flat} of those with 2 or more rollouts stored have no reward spread` }),
    ...all.map((g) => {
      const prompt = String((g.members[0].t.messages.find((m) => m.role === "user") || {}).content ?? "");
      return el("div", { class: `group${g.flat ? " flat" : ""}`, "data-group": g.key, "data-size": g.members.length },
        el("div", { class: "head", text: `${g.key} · ${g.members.length} rollouts · reward mean ${fmt(g.mean)}, std ${fmt(g.std)}${g.flat ? " · no spread: no advantage" : ""}` }),
        el("pre", { class: "prompt", text: prompt }),
        el("div", { class: "members" }, ...g.members.map(({ t, advantage }) => {
          const answer = [...t.messages].reverse().find((m) => m.role === "assistant");
          return el("div", { class: "member", "data-index": t.index, "data-advantage": advantage ?? "" },
            el("div", { class: "head", text: `#${t.index} · rollout ${t.meta.rollout_index ?? "?"} · reward ${fmt(t.score)} · advantage ${fmt(advantage)}` }),
            el("div", { class: "rewards" }, ...Object.entries(t.rewards).map(([k, v]) => el("span", { text: `${k} ${fmt(v)}` }))),
            el("pre", { text: String(answer ? answer.content : "") }));
        })));
    }));
}

// The per-token strip (trainer/token_strip.py: meta "token_strip", a JSON string): the response's tokens, each
// shaded by its log-probability (red: unlikely) or its entropy (blue: uncertain), as the toolbar chooses; tokens
// outside the loss mask (a tool's reply) are grey and struck through. Hover: the token's figures.
function tokenStrip(text) {
  if (typeof text !== "string") return null;
  let strip;
  try { strip = JSON.parse(text); } catch { return null; }
  const by = $("shade").value;
  const top = Math.max(1e-6, ...strip.entropy);
  const box = el("div", { class: "token-strip", "data-shade": by });
  strip.tokens.forEach((token, i) => {
    const logprob = strip.logprob[i], entropy = strip.entropy[i], trained = strip.loss_mask[i] === "1";
    const weight = by === "entropy" ? entropy / top : Math.min(1, -logprob / 5);
    const span = el("span", { class: trained ? "tok" : "tok masked", "data-logprob": logprob, "data-entropy": entropy,
      title: `${JSON.stringify(token)} · logprob ${logprob} · entropy ${entropy}${trained ? "" : " · not trained on"}`,
      text: token });
    if (trained) span.style.background = by === "entropy" ? `rgba(21,101,192,${weight.toFixed(3)})` : `rgba(198,40,40,${weight.toFixed(3)})`;
    box.append(span);
  });
  return box;
}

function trajectoryCard(t, traces = [], all = [], step = state.step) {
  const meta = t.meta || {};
  const where = [`#${t.index}`];
  if (meta.sample_index !== undefined) where.push(`sample ${meta.sample_index}`);
  if (meta.rollout_index !== undefined) where.push(`rollout ${meta.rollout_index}`);
  if (t.data_source) where.push(t.data_source);
  // staleness: how many updates the policy had moved on from the one that generated the rollout when the step
  // trained on it (the step trains weights version step - 1); only where the trainer logged meta policy_version
  const staleness = known(meta.policy_version) && known(step) ? step - 1 - meta.policy_version : null;
  if (known(staleness)) where.push(`policy v${meta.policy_version} · ${staleness} stale`);
  const card = el("div", { class: "trajectory", "data-index": t.index, "data-score": t.score ?? "",
    "data-staleness": staleness ?? "" },
    el("div", { class: "head", text: `${where.join(" · ")} · reward ${fmt(t.score)} · ${t.tokens} tokens` }),
    el("div", { class: "rewards" }, ...Object.entries(t.rewards).map(([k, v]) => el("span", { text: `${k} ${fmt(v)}` }))));
  let assistantTurn = 0;
  let toolIndex = 0;
  for (const message of t.messages) {
    const role = message.role || "?";
    if (role === "assistant") assistantTurn += 1;
    const tokens = role === "assistant" ? meta[`turn_${assistantTurn}_assistant_tokens`]
      : role === "tool" ? meta[`turn_${assistantTurn}_tool_tokens`] : undefined;
    const label = `${role}${role === "assistant" ? ` turn ${assistantTurn}` : ""}${tokens !== undefined ? ` · ${tokens} tokens` : ""}`;
    const turn = el("div", { class: `turn role-${role}` }, el("div", { class: "role", text: label }));
    if (role === "tool" && toolIndex < t.tool_calls.length) turn.append(toolCall(t.tool_calls[toolIndex++]));
    else turn.append(el("pre", { text: String(message.content ?? "") }));
    card.append(turn);
  }
  for (; toolIndex < t.tool_calls.length; toolIndex++) card.append(toolCall(t.tool_calls[toolIndex]));
  const strip = tokenStrip(meta.token_strip);
  if (strip) card.append(strip);
  const metaText = Object.entries(meta).filter(([k]) => !k.startsWith("turn_") && k !== "token_strip")
    .map(([k, v]) => `${k}: ${JSON.stringify(v)}`);
  card.append(el("div", { class: "meta", text: metaText.join(" · ") }));
  if (traces.length) {
    const errors = traces.filter((x) => x.error).length;
    card.append(el("details", { class: "rollout-traces" },
      el("summary", { text: `${traces.length} rollout traces${errors ? ` · ${errors} failed` : ""}` }),
      ...traces.map((x) => traceRow(x, stepSpan(all)))));
  }
  return card;
}

// -- rollout traces ------------------------------------------------------------------------------------------------
const stepSpan = (traces) => Math.max(1e-6, ...traces.map((t) => t.offset_ms + t.duration_ms));

function traceGroups(traces) {
  const groups = new Map();
  for (const t of traces) {
    const key = known(t.sample_index) ? `${t.attributes.validate ? "v" : "t"}/${t.sample_index}/${t.rollout_n ?? ""}` : "";
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(t);
  }
  const order = ([a, [x]], [b, [y]]) => (a === "" ? 1 : b === "" ? -1 : !!x.attributes.validate - !!y.attributes.validate
    || Number(x.sample_index) - Number(y.sample_index) || Number(x.rollout_n ?? -1) - Number(y.rollout_n ?? -1));
  return [...groups.entries()].sort(order);
}

function renderTraces() {
  const box = $("traces");
  const traces = (state.data && state.data.traces) || [];
  box.hidden = !traces.length;
  const errors = traces.filter((t) => t.error).length;
  const span = stepSpan(traces);
  box.replaceChildren(el("h2", { text: `step ${state.step}: ${traces.length} rollout traces${errors ? `, ${errors} failed` : ""}` }),
    ...traceGroups(traces).map(([key, group]) => traceGroup(key, group, span)));
}

function traceGroup(key, group, span) {
  const [first] = group;
  const failed = group.filter((t) => t.error).length;
  const where = key === "" ? ["not tied to a sample"] : [`sample ${first.sample_index}`];
  if (key !== "" && known(first.rollout_n)) where.push(`rollout ${first.rollout_n}`);
  if (key !== "" && first.attributes.validate) where.push("validation");
  where.push(`${group.length} traces`);
  if (failed) where.push(`${failed} failed`);
  const head = el("div", { class: "head" }, el("span", { text: where.join(" · ") }));
  if (known(first.trajectory)) {
    const link = el("a", { href: "#", class: "to-rollout", text: `rollout #${first.trajectory}` });
    link.addEventListener("click", (event) => { event.preventDefault(); showRollout(first.trajectory); });
    head.append(" → ", link);
  }
  return el("div", { class: "trace-group", "data-sample": first.sample_index ?? "", "data-rollout": first.rollout_n ?? "" },
    head, ...group.map((t) => traceRow(t, span)));
}

function showRollout(index) {
  const find = () => document.querySelector(`#pane-a .trajectory[data-index='${index}']`);
  if (!find()) {  // filtered out, or validation generations shown: show every rollout
    for (const id of ["search", "min-score", "max-score", "source"]) $(id).value = "";
    $("show").value = "trajectories";
    $("compare").value = "";
    state.other = null;
    render();
  }
  const card = find();
  if (!card) return;
  card.scrollIntoView({ block: "start" });
  card.classList.remove("flash");
  void card.offsetWidth;  // restart the animation
  card.classList.add("flash");
}

function traceRow(t, span) {
  const status = t.error ? `error${t.exception_type ? `: ${t.exception_type}` : ""}` : t.status;
  const bar = el("span", { class: "bar", title: `starts ${duration(t.offset_ms)} into the step's traces` },
    el("span", { style: `left: ${(100 * t.offset_ms) / span}%; width: ${Math.max(0.5, (100 * t.duration_ms) / span)}%` }));
  const row = el("details", { class: `trace${t.error ? " error" : ""}`, "data-index": t.index, "data-status": t.status },
    el("summary", {}, el("span", { class: "name", text: t.name }), el("span", { class: "duration", text: duration(t.duration_ms) }),
      el("span", { class: "status", text: status }), bar));
  row.addEventListener("toggle", () => { if (row.open && row.children.length === 1) row.append(...traceBody(t)); });
  return row;
}

function traceBody(t) {
  const json = (x) => (typeof x === "string" ? x : JSON.stringify(x, null, 2));
  const parts = [el("div", { class: "meta", text: [`starts +${duration(t.offset_ms)}`,
    ...Object.entries(t.attributes).map(([k, v]) => `${k}: ${JSON.stringify(v)}`)].join(" · ") })];
  for (const message of t.messages) {
    const role = message.role || "?";
    parts.push(el("div", { class: `turn role-${role}` }, el("div", { class: "role", text: role }),
      el("pre", { class: "content", text: String(message.content ?? "") })));
  }
  if (known(t.inputs)) parts.push(el("div", { class: "role", text: "inputs" }), el("pre", { class: "inputs", text: json(t.inputs) }));
  if (known(t.output)) parts.push(el("div", { class: "role", text: "output" }), el("pre", { class: "output", text: json(t.output) }));
  if (known(t.exception_type)) parts.push(el("div", { class: "role", text: "exception" }), el("pre", { class: "exception", text: t.exception_type }));
  const said = { ...t.attributes, status: t.status };  // verl repeats the attributes and status in the metadata
  const rest = Object.entries(t.metadata || {}).filter(([k, v]) => JSON.stringify(said[k]) !== JSON.stringify(v))
    .map(([k, v]) => `${k}: ${JSON.stringify(v)}`);
  if (rest.length) parts.push(el("div", { class: "meta", text: rest.join(" · ") }));
  if (t.cut) parts.push(el("div", { class: "cut", text: `${t.cut} long texts or lists cut for this page; the run holds them whole` }));
  return parts;
}

function toolCall(call) {
  const latency = call.latency_s !== undefined && call.latency_s !== null ? ` · ${Number(call.latency_s * 1000).toFixed(2)} ms` : "";
  return el("details", { class: "tool-call" },
    el("summary", { text: `tool call: ${call.name}${latency}` }),
    el("div", { class: "role", text: "arguments" }), el("pre", { class: "arguments", text: String(call.arguments ?? "") }),
    el("div", { class: "role", text: "result" }), el("pre", { class: "result", text: String(call.result ?? "") }));
}

function fillGenerations(pane, data) {
  const needle = $("search").value.trim().toLowerCase();
  const rows = data.generations.filter((g) => !needle || `${g.input}\n${g.output}`.toLowerCase().includes(needle));
  pane.replaceChildren(el("h2", { text: `step ${data.step}: ${rows.length} validation generations` }),
    ...rows.map((g) => el("div", { class: "generation" },
      el("div", { class: "head", text: `#${g.index} · score ${fmt(g.score)}` }),
      el("div", { class: "role", text: "input" }), el("pre", { text: g.input }),
      el("div", { class: "role", text: "output" }), el("pre", { text: g.output }))));
}

for (const id of ["search", "min-score", "max-score", "source", "sort", "show", "shade"]) $(id).addEventListener("input", render);
$("compare").addEventListener("change", async () => { await loadOther(); render(); });
follow();
