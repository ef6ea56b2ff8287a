// The execgate approval page: pending requests arrive as server-sent events from /events and are
// answered with POST /api/resolve. Request data is shown with textContent only (never as HTML),
// and arrives with its control characters already escaped by the approver (\x1b, \u202e): a
// request that held any is flagged ("controls").
"use strict";

const cards = new Map();  // request id -> {card, deadline}

function $(selector, root = document) { return root.querySelector(selector); }

function text(card, selector, value) { $(selector, card).textContent = value; }

function addHistory(line) {
  const item = document.createElement("li");
  item.textContent = `${new Date().toLocaleTimeString()} ${line}`;
  $("#history").prepend(item);
}

function refreshEmpty() { $("#empty").hidden = cards.size > 0; }

function fillEnv(card, env) {
  if (env === null || env === undefined) {  // this policy service does not send the variables
    $(".env-title", card).remove();
    $(".env-cell", card).remove();
    return;
  }
  const table = $(".env", card);
  const names = Object.keys(env);
  if (names.length === 0) { table.textContent = "(none)"; return; }
  for (const name of names) {
    const row = table.insertRow();
    row.insertCell().textContent = name;
    row.insertCell().textContent = env[name];
  }
}

function render(request) {
  const card = $("#request-template").content.firstElementChild.cloneNode(true);
  card.dataset.requestId = request.id;
  text(card, ".program", request.program);
  text(card, ".command", request.command);
  text(card, ".cwd", request.cwd);
  text(card, ".session", request.session);
  const labels = Object.entries(request.labels).map(([k, v]) => `${k}=${v}`).join(", ");
  text(card, ".labels", labels ? `(${labels})` : "");
  text(card, ".rule", request.rule || "(default)");
  text(card, ".justification", request.justification || "no justification");
  text(card, ".execution", request.execution);
  text(card, ".file", request.file || "");
  if (request.children_unseen === true) card.classList.add("children-unseen");
  if (request.controls === true) $(".controls-flag", card).hidden = false;
  if (request.no_session_grant) {  // the file may change in place: "for the session" approves once
    const note = $(".grant-note", card);
    note.textContent = `No session grant possible (${request.no_session_grant}): approving for the session approves this request once.`;
    note.hidden = false;
    $(".approve-session", card).textContent = "Approve once (no session grant)";
  }
  fillEnv(card, request.env);
  for (const button of card.querySelectorAll("button[data-verdict]")) {
    button.addEventListener("click", () => answer(request, card, button.dataset.verdict));
  }
  return card;
}

function add(request) {
  if (cards.has(request.id)) return;
  const card = render(request);
  cards.set(request.id, {card, deadline: Date.now() + request.seconds_left * 1000});
  $("#pending").append(card);
  refreshEmpty();
  tick();
}

function remove(id, why) {
  const entry = cards.get(id);
  if (!entry) return;
  cards.delete(id);
  addHistory(`${$(".command", entry.card).textContent} — ${why}`);
  entry.card.remove();
  refreshEmpty();
}

async function answer(request, card, verdict) {
  const reason = verdict === "deny" ? $(".reason", card).value.trim() : "";
  for (const button of card.querySelectorAll("button")) button.disabled = true;
  text(card, ".result", "sending…");
  let message;
  try {
    const reply = await fetch("/api/resolve", {
      method: "POST",
      headers: {"Content-Type": "application/json", "X-Execgate": "1"},
      body: JSON.stringify({id: request.id, verdict, reason}),
    });
    message = reply.ok ? null : ((await reply.json().catch(() => ({}))).message || `HTTP ${reply.status}`);
  } catch (error) {
    message = `not sent: ${error}`;
  }
  if (message === null) return;  // the "gone" event removes the card
  text(card, ".result", message);
  for (const button of card.querySelectorAll("button")) button.disabled = false;
}

function tick() {
  const now = Date.now();
  for (const {card, deadline} of cards.values()) {
    text(card, ".left", `${Math.max(0, Math.round((deadline - now) / 1000))} s left`);
  }
}

function setStatus(connected) {
  const status = $("#status");
  status.textContent = connected ? "connected" : "not connected to the policy service";
  status.className = `status ${connected ? "up" : "down"}`;
}

function start() {
  refreshEmpty();
  const events = new EventSource("/events");
  events.addEventListener("snapshot", (event) => {
    for (const id of [...cards.keys()]) { cards.get(id).card.remove(); cards.delete(id); }
    JSON.parse(event.data).forEach(add);
    refreshEmpty();
  });
  events.addEventListener("pending", (event) => add(JSON.parse(event.data)));
  events.addEventListener("gone", (event) => { const g = JSON.parse(event.data); remove(g.id, g.why); });
  events.addEventListener("status", (event) => setStatus(JSON.parse(event.data).connected));
  events.addEventListener("error", () => {
    setStatus(false);
    if (events.readyState === EventSource.CLOSED) $("#status").textContent = "logged out: reload the page";
  });
  setInterval(tick, 1000);
}

document.addEventListener("DOMContentLoaded", start);
