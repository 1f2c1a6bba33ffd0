// mock-gate console. Every value from the gate is rendered with textContent (never parsed as HTML),
// and the page holds no key: the session is an HttpOnly cookie, and state-changing calls send
// the session's CSRF token in the X-Console-Csrf header.
"use strict";

const state = { csrf: null, session: null };

function $(id) { return document.getElementById(id); }

function text(tag, value, className) {
  const el = document.createElement(tag);
  el.textContent = value === null || value === undefined ? "" : String(value);
  if (className) el.className = className;
  return el;
}

function say(message, isError) {
  const m = $("message");
  m.textContent = message;
  m.className = isError ? "error" : "";
}

async function api(path, options) {
  const opts = Object.assign({ credentials: "same-origin", headers: {} }, options || {});
  if (opts.method && opts.method !== "GET") {
    opts.headers["Content-Type"] = "application/json";
    if (state.csrf) opts.headers["X-Console-Csrf"] = state.csrf;
  }
  const response = await fetch(path, opts);
  let body = null;
  const type = response.headers.get("Content-Type") || "";
  if (type.startsWith("application/json")) body = await response.json();
  if (!response.ok) {
    const detail = body && body.detail ? body.detail : "HTTP " + response.status;
    const error = new Error(detail);
    error.status = response.status;
    throw error;
  }
  return body;
}

function onBehalf(value) {
  if (!value) return "";
  if (typeof value === "string") return "on behalf of " + value;
  const who = value.email || value.sub || "";
  return "on behalf of " + who + (value.role ? " (" + value.role + ")" : "");
}

function amount(row) {
  if (row.amount === null || row.amount === undefined) return "";
  return row.amount + (row.currency ? " " + row.currency : "");
}

function showSignedIn(session) {
  state.session = session;
  state.csrf = session.csrf;
  $("login-section").hidden = true;
  $("app").hidden = false;
  $("whoami-bar").hidden = false;
  $("whoami").textContent = "Signed in as " + session.user + (session.role ? " (" + session.role + ")" : "") +
    (session.via === "admin_key" ? " with the admin key" : "");
  $("approver-row").hidden = session.via !== "admin_key";
}

function showSignedOut() {
  state.session = null;
  state.csrf = null;
  $("login-section").hidden = false;
  $("app").hidden = true;
  $("whoami-bar").hidden = true;
}

function renderDecisions(list) {
  const body = $("decisions-body");
  body.replaceChildren();
  for (const d of list) {
    const tr = document.createElement("tr");
    tr.dataset.decisionId = d.decision_id;
    tr.append(
      text("td", d.at),
      text("td", d.agent_id),
      text("td", onBehalf(d.on_behalf_of), "on-behalf"),
      text("td", d.tool + ":" + d.action),
      text("td", amount(d), "amount"),
      text("td", d.decision, "decision decision-" + d.decision),
      text("td", d.code || "", "code"),
      text("td", (d.policies || []).join(", "), "policies"),
      text("td", d.intent, "intent"),
    );
    body.append(tr);
  }
}

function decideButton(label, ref, verb, commentInput) {
  const button = text("button", label, verb);
  button.type = "button";
  button.dataset.ref = ref;
  button.addEventListener("click", () => decide(ref, verb, commentInput.value));
  return button;
}

function renderApprovals(list) {
  const pending = list.filter((a) => a.status === "pending");
  const decided = list.filter((a) => a.status !== "pending");
  const body = $("approvals-body");
  body.replaceChildren();
  for (const a of pending) {
    const tr = document.createElement("tr");
    tr.dataset.ref = a.ref;
    const comment = document.createElement("input");
    comment.className = "comment";
    comment.maxLength = 2000;
    comment.placeholder = "comment";
    comment.setAttribute("aria-label", "comment on " + a.ref);
    const commentCell = document.createElement("td");
    commentCell.append(comment);
    const actions = document.createElement("td");
    actions.append(decideButton("Approve", a.ref, "approve", comment), " ",
      decideButton("Reject", a.ref, "reject", comment));
    tr.append(
      text("td", a.ref, "ref"),
      text("td", a.created_at),
      text("td", onBehalf(a.on_behalf_of), "on-behalf"),
      text("td", (a.tool || "") + ":" + (a.action || "")),
      text("td", amount(a), "amount"),
      text("td", a.reason, "reason"),
      text("td", a.intent, "intent"),
      commentCell,
      actions,
    );
    body.append(tr);
  }
  $("approvals-empty").hidden = pending.length > 0;
  const done = $("decided-body");
  done.replaceChildren();
  for (const a of decided) {
    const tr = document.createElement("tr");
    tr.dataset.ref = a.ref;
    const by = a.decided_by ? (a.decided_by.name || a.decided_by.sub) +
      (a.decided_by.role ? " (" + a.decided_by.role + ")" : "") : "";
    tr.append(
      text("td", a.ref, "ref"),
      text("td", a.status, "status"),
      text("td", by, "decided-by"),
      text("td", a.comment, "comment"),
      text("td", amount(a), "amount"),
      text("td", a.decided_at),
    );
    done.append(tr);
  }
}

function renderMandates(list) {
  const body = $("mandates-body");
  body.replaceChildren();
  for (const m of list) {
    const tr = document.createElement("tr");
    tr.dataset.mandateId = m.mandate_id;
    tr.append(
      text("td", m.mandate_id),
      text("td", m.currency),
      text("td", m.per_tx_limit, "amount"),
      text("td", m.daily_limit, "amount"),
      text("td", m.used_today, "amount used-today"),
      text("td", m.held_today, "amount held-today"),
      text("td", m.monthly_limit, "amount"),
      text("td", m.used_this_month, "amount used-month"),
      text("td", m.held_this_month, "amount held-month"),
    );
    body.append(tr);
  }
}

async function refresh() {
  try {
    const [decisions, approvals, mandates] = await Promise.all([
      api("/console/api/decisions"), api("/console/api/approvals"), api("/console/api/mandates"),
    ]);
    renderDecisions(decisions.decisions);
    renderApprovals(approvals.approvals);
    renderMandates(mandates.mandates);
    document.body.dataset.loaded = String(Date.now());
  } catch (error) {
    if (error.status === 401) showSignedOut();
    say(error.message, true);
  }
}

async function decide(ref, verb, comment) {
  const payload = { comment: comment };
  if (state.session && state.session.via === "admin_key") payload.approver = $("approver-name").value;
  try {
    const view = await api("/console/api/approvals/" + encodeURIComponent(ref) + "/" + verb,
      { method: "POST", body: JSON.stringify(payload) });
    say(view.ref + " " + view.status, false);
  } catch (error) {
    say(error.message, true);
  }
  await refresh();
}

async function login(payload) {
  try {
    const session = await api("/console/api/login", { method: "POST", body: JSON.stringify(payload) });
    showSignedIn(session);
    say("", false);
    await refresh();
  } catch (error) {
    say(error.message, true);
  }
}

document.addEventListener("DOMContentLoaded", async () => {
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    login({ username: $("username").value, password: $("password").value });
    $("password").value = "";
  });
  $("admin-form").addEventListener("submit", (event) => {
    event.preventDefault();
    login({ admin_key: $("admin-key").value });
    $("admin-key").value = "";
  });
  $("refresh").addEventListener("click", refresh);
  $("logout").addEventListener("click", async () => {
    try { await api("/console/api/logout", { method: "POST" }); } catch (error) { say(error.message, true); }
    showSignedOut();
  });
  try {
    showSignedIn(await api("/console/api/session"));
    await refresh();
  } catch (error) {
    showSignedOut();
  }
});
