// phrony approvals console. Every value from the runtime is rendered with textContent (never
// parsed as HTML). The page holds no credential: the session is an HttpOnly cookie, and every
// state-changing call is a JSON POST carrying the session's CSRF token in X-Phrony-Csrf.
"use strict";

const TERMINAL = new Set(["completed", "failed", "cancelled"]);
const state = { session: null, csrf: null, events: null, view: null, approval: null, poll: null, flash: null };

function $(id) { return document.getElementById(id); }

function text(tag, value, className) {
  const el = document.createElement(tag);
  el.textContent = value === null || value === undefined ? "" : String(value);
  if (className) el.className = className;
  return el;
}

function link(href, label) {
  const a = document.createElement("a");
  a.href = href;
  a.textContent = label;
  return a;
}

function say(message, isError) {
  const m = $("message");
  m.textContent = message || "";
  m.className = isError ? "error" : "";
}

function pretty(value) {
  return JSON.stringify(value, null, 2);
}

function setStatus(el, status) {
  el.textContent = status || "";
  el.className = status ? "status-" + status : "";
}

async function api(path, options) {
  const opts = Object.assign({ credentials: "same-origin", headers: {} }, options || {});
  if (opts.method && opts.method !== "GET") {
    opts.headers["Content-Type"] = "application/json";
    if (state.csrf) opts.headers["X-Phrony-Csrf"] = state.csrf;
  }
  const response = await fetch(path, opts);
  let body = null;
  const type = response.headers.get("Content-Type") || "";
  if (type.startsWith("application/json")) body = await response.json();
  if (!response.ok) {
    const error = new Error(body && body.message ? body.message : "HTTP " + response.status);
    error.status = response.status;
    throw error;
  }
  return body;
}

// ---------------------------------------------------------------------------------------------
// Signing in

function showSignedIn(session) {
  state.session = session;
  state.csrf = session.csrf;
  $("login-section").hidden = true;
  $("app").hidden = false;
  $("whoami-bar").hidden = false;
  const roles = session.roles.length ? session.roles.join(", ") : "no roles";
  $("whoami").textContent = "Signed in as " + session.user + " (" + roles + "; " +
    (session.verification === "unverified" ? "local operator, unverified" : "verified by " + session.verification) + ")";
  $("logout").hidden = session.mode === "local";
  startEvents();
  route();
}

function showSignedOut() {
  stopEvents();
  state.session = null;
  state.csrf = null;
  $("login-section").hidden = false;
  $("app").hidden = true;
  $("whoami-bar").hidden = true;
}

async function start() {
  try {
    showSignedIn(await api("/console/api/session"));
  } catch (error) {
    if (error.status !== 401) { say(error.message, true); return; }
    if (error.message.includes("auth mode: local")) {
      // Local mode: the console acts as the local operator, no credential to give.
      try { showSignedIn(await api("/console/api/login", { method: "POST", body: "{}" })); }
      catch (e) { say(e.message, true); }
    } else {
      showSignedOut();
    }
  }
}

async function login(event) {
  event.preventDefault();
  say("");
  try {
    const session = await api("/console/api/login", {
      method: "POST", body: JSON.stringify({ token: $("token").value }),
    });
    $("token").value = "";
    showSignedIn(session);
  } catch (error) {
    say(error.message, true);
  }
}

async function logout() {
  try { await api("/console/api/logout", { method: "POST", body: "{}" }); } catch (e) { /* signed out anyway */ }
  showSignedOut();
  say("Signed out.");
}

// ---------------------------------------------------------------------------------------------
// Live updates

function startEvents() {
  if (state.events) return;
  const source = new EventSource("/console/api/events");
  state.events = source;
  const live = $("live");
  source.onopen = () => { live.textContent = "live"; live.className = "live-on"; };
  source.onerror = () => { live.textContent = "reconnecting"; live.className = "live-off"; };
  for (const kind of ["opened", "updated", "decided"]) {
    source.addEventListener(kind, (event) => onChange(kind, JSON.parse(event.data).approval));
  }
  source.addEventListener("current_end", () => { if (state.view === "list") refreshList(); });
}

function stopEvents() {
  if (state.events) state.events.close();
  state.events = null;
}

function onChange(kind, approval) {
  if (!approval) return;
  if (state.view === "list") refreshList();
  if (state.view === "approval" && state.approval && state.approval.id === approval.id) showApproval(approval.id);
  if (state.view === "session" && $("session-id").textContent === approval.session_id) showSession(approval.session_id);
}

// ---------------------------------------------------------------------------------------------
// Views

function showView(name) {
  // A message survives one navigation (the outcome of a decision shown on the session's page).
  say(state.flash ? state.flash.message : "", state.flash ? state.flash.isError : false);
  state.flash = null;
  state.view = name;
  $("list-view").hidden = name !== "list";
  $("approval-view").hidden = name !== "approval";
  $("session-view").hidden = name !== "session";
  if (state.poll) { clearTimeout(state.poll); state.poll = null; }
}

function route() {
  if (!state.session) return;
  const hash = location.hash || "#/";
  let m;
  if ((m = hash.match(/^#\/approvals\/([^/]+)$/))) { showView("approval"); showApproval(decodeURIComponent(m[1])); }
  else if ((m = hash.match(/^#\/sessions\/([^/]+)$/))) { showView("session"); showSession(decodeURIComponent(m[1])); }
  else { showView("list"); refreshList(); }
}

function filterQuery() {
  const params = new URLSearchParams();
  for (const name of ["agent", "tool", "route", "session"]) {
    const value = $("filter-" + name).value.trim();
    if (value) params.set(name, value);
  }
  return params.toString();
}

function argsSummary(args) {
  if (!args || typeof args !== "object") return String(args === undefined ? "" : args);
  return Object.entries(args).map(([k, v]) => k + "=" + (typeof v === "object" ? JSON.stringify(v) : v)).join(", ");
}

async function refreshList() {
  let listed;
  try { listed = await api("/console/api/approvals?" + filterQuery()); }
  catch (error) { handleError(error); return; }
  const body = $("approvals-body");
  body.replaceChildren();
  for (const a of listed.approvals) {
    const tr = document.createElement("tr");
    tr.dataset.approvalId = a.id;
    tr.dataset.sessionId = a.session_id;
    const open = document.createElement("td");
    open.append(link("#/approvals/" + encodeURIComponent(a.id), "Open"));
    tr.append(
      text("td", a.created_at), text("td", a.agent_ref), text("td", a.tool + "@" + a.version),
      text("td", argsSummary(a.args)), text("td", a.route), text("td", a.reason),
      text("td", a.approvals_received + " / " + a.approvals_required), text("td", a.expires_at || "never"), open,
    );
    body.append(tr);
  }
  $("approvals-empty").hidden = listed.approvals.length > 0;
}

async function showApproval(id) {
  let a;
  try { a = await api("/console/api/approvals/" + encodeURIComponent(id)); }
  catch (error) { handleError(error); return; }
  const changed = !state.approval || state.approval.id !== a.id;
  state.approval = a;
  $("approval-id").textContent = a.id;
  setStatus($("approval-status"), a.status);
  $("approval-tool").textContent = a.tool + "@" + a.version;
  $("approval-agent").textContent = a.agent_ref;
  $("approval-session").textContent = a.session_id;
  $("approval-session").href = "#/sessions/" + encodeURIComponent(a.session_id);
  $("approval-policy").textContent = a.policy_ref || a.policy_name || "(none)";
  $("approval-reason").textContent = a.reason;
  $("approval-route").textContent = a.route || "(any approver)";
  $("approval-quorum").textContent = a.approvals_received + " of " + a.approvals_required + " approvals";
  $("approval-expires").textContent = a.expires_at || "never";
  $("approval-decided").textContent = a.decided_at
    ? a.decided_at + " by " + a.decided_by + (a.decided_by_verification ? " (" + a.decided_by_verification + ")" : "") +
      (a.comment ? ": " + a.comment : "")
    : "not yet";
  $("approval-args").textContent = pretty(a.args);
  $("effective-block").hidden = a.effective_args === null;
  $("approval-effective-args").textContent = a.effective_args === null ? "" : pretty(a.effective_args);
  const votes = $("votes-body");
  votes.replaceChildren();
  for (const v of a.votes) {
    votes.append(Object.assign(document.createElement("tr"), {}));
    votes.lastChild.append(text("td", v.created_at), text("td", v.decided_by + (v.via ? " via " + v.via : "")),
      text("td", v.verification), text("td", v.decision), text("td", v.comment));
  }
  $("no-votes").hidden = a.votes.length > 0;
  const pending = a.status === "pending";
  const canDecide = state.session.can_decide && pending && a.kind !== "outcome_review";
  $("decide-form").hidden = !canDecide;
  const cannot = $("cannot-decide");
  if (!pending) { cannot.hidden = true; }
  else if (!state.session.can_decide) {
    cannot.hidden = false;
    cannot.textContent = "Your roles (" + state.session.roles.join(", ") + ") cannot decide approvals.";
  } else if (a.kind === "outcome_review") {
    cannot.hidden = false;
    cannot.textContent = "Outcome reviews are resolved with `phrony approvals`.";
  } else { cannot.hidden = true; }
  $("comprehension-row").hidden = !a.comprehension_required;
  $("edit-row").hidden = a.kind !== "policy";
  if (changed) {
    $("comment").value = "";
    $("edit-args").checked = false;
    $("edited-args").hidden = true;
    $("edited-args").value = pretty(a.args);
  }
}

function editedArgs() {
  if (!$("edit-args").checked) return { ok: true, value: null };
  let value;
  try { value = JSON.parse($("edited-args").value); }
  catch (error) { return { ok: false, message: "The edited arguments are not valid JSON: " + error.message }; }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    return { ok: false, message: "The edited arguments must be a JSON object." };
  }
  return { ok: true, value };
}

async function decide(decision) {
  const a = state.approval;
  if (!a) return;
  const body = { decision, comment: $("comment").value, comprehension_acknowledged: $("comprehension").checked };
  if (decision === "approve") {
    const edited = editedArgs();
    if (!edited.ok) { say(edited.message, true); return; }
    if (edited.value !== null) body.args = edited.value;
  }
  for (const b of [$("approve-button"), $("reject-button")]) b.disabled = true;
  try {
    const answer = await api("/console/api/approvals/" + encodeURIComponent(a.id) + "/decide", {
      method: "POST", body: JSON.stringify(body),
    });
    state.flash = { message: (decision === "approve" ? "Approved" : "Rejected") + ": approval " + answer.status +
      ", session " + answer.session_status + ".", isError: false };
    location.hash = "#/sessions/" + encodeURIComponent(a.session_id);
  } catch (error) {
    handleError(error);
  } finally {
    for (const b of [$("approve-button"), $("reject-button")]) b.disabled = false;
  }
}

async function showSession(id) {
  let inspected;
  try { inspected = await api("/console/api/sessions/" + encodeURIComponent(id)); }
  catch (error) { handleError(error); return; }
  const s = inspected.session || {};
  $("session-id").textContent = s.id || id;
  setStatus($("session-status"), s.status);
  $("session-agent").textContent = s.agent_ref || "";
  $("session-started-by").textContent = (s.started_by || "") +
    (s.started_by_verification ? " (" + s.started_by_verification + ")" : "");
  $("session-output").textContent = s.error ? "failed: " + s.error : (s.output || "");
  const body = $("timeline-body");
  body.replaceChildren();
  for (const e of inspected.timeline) {
    const tr = document.createElement("tr");
    tr.dataset.kind = e.kind;
    const summary = text("td", e.summary);
    if (e.approval_id) {
      summary.append(" ", link("#/approvals/" + encodeURIComponent(e.approval_id), "approval"));
    }
    tr.append(text("td", e.timestamp), text("td", e.kind), text("td", e.actor || ""), summary);
    body.append(tr);
  }
  $("timeline-more").hidden = !inspected.more;
  // The session's own progress is not an approval change: follow it until it ends.
  if (state.poll) clearTimeout(state.poll);
  if (state.view === "session" && !TERMINAL.has(s.status)) {
    state.poll = setTimeout(() => { if (state.view === "session") showSession(id); }, 1000);
  }
}

function handleError(error) {
  if (error.status === 401) { showSignedOut(); }
  say(error.message, true);
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", login);
  $("logout").addEventListener("click", logout);
  $("filters").addEventListener("submit", (event) => { event.preventDefault(); refreshList(); });
  $("clear-filters").addEventListener("click", () => {
    for (const name of ["agent", "tool", "route", "session"]) $("filter-" + name).value = "";
    refreshList();
  });
  $("approve-button").addEventListener("click", () => decide("approve"));
  $("reject-button").addEventListener("click", () => decide("reject"));
  $("edit-args").addEventListener("change", () => { $("edited-args").hidden = !$("edit-args").checked; });
  window.addEventListener("hashchange", route);
  start();
});
