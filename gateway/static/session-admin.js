// What an owner manages in a session: its settings (title, run policy, what
// Sim agent-events-v1 clients may see, archived) and its members (change a
// role, remove). The server decides (PATCH /v1/sessions/{id}, PATCH and
// DELETE /v1/sessions/{id}/members/{user}: owners only, 403 otherwise, 409
// `last_owner` for the last owner); the controls are only drawn for owners.
//
// `view` is the open SessionView: { id, role, client, refresh() }.

import { h, setText, untrusted, showError, clearError } from "./dom.js";

const $ = (id) => document.getElementById(id);
const CONFIRM_MS = 4000;

let current = null; // the view the settings form acts on

/** Wire the settings form once (the page has one). */
export function wireSettings() {
  $("settings-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const view = current;
    if (!view) return;
    const changes = {
      title: $("settings-title").value.trim(),
      run_policy: $("settings-run-policy").value,
      include_thinking: $("settings-include-thinking").checked,
      include_tool_calls: $("settings-include-tool-calls").checked,
    };
    await save(view, changes, $("settings-save"));
  });
  $("session-archive").addEventListener("click", async (ev) => {
    const view = current;
    if (!view) return;
    await save(view, { archived: ev.currentTarget.dataset.archived !== "true" }, ev.currentTarget);
  });
}

async function save(view, changes, btn) {
  clearError($("settings-error"));
  btn.disabled = true;
  try {
    await view.client.updateSession(view.id, changes);
    $("settings-saved").hidden = false;
    setTimeout(() => ($("settings-saved").hidden = true), 2000);
    await view.refresh();
  } catch (e) {
    showError($("settings-error"), e);
  } finally {
    btn.disabled = false;
  }
}

/** Show a session's settings: the form for owners, the archived state for all. */
export function showSettings(view, info) {
  current = view;
  const owner = view.role === "owner";
  const archived = Boolean(info.archived_at);
  $("session-settings").hidden = !owner;
  if (owner) {
    // A refresh (window focus) does not undo what the owner is typing.
    if (document.activeElement !== $("settings-title")) $("settings-title").value = info.title ?? "";
    $("settings-run-policy").value = info.run_policy;
    $("settings-include-thinking").checked = Boolean(info.include_thinking);
    $("settings-include-tool-calls").checked = Boolean(info.include_tool_calls);
    const btn = $("session-archive");
    btn.dataset.archived = String(archived);
    setText(btn, archived ? "Unarchive" : "Archive");
  }
  const banner = $("session-archived");
  banner.hidden = !archived;
  if (archived) {
    setText(banner, `Archived ${new Date(info.archived_at).toLocaleString()}: the history stays, no new runs start.`,
      owner ? " Unarchive it in the session settings to start runs again." : "");
  }
}

/**
 * The owner's controls on a member's row: a role select and a Remove button
 * (click twice: the first click asks). `done()` after a change went through.
 */
export function memberControls(view, member, done) {
  const errEl = $("members-error");
  const select = h("select", { class: "member-role-select", "aria-label": "role" },
    ...["viewer", "approver", "owner"].map((r) => h("option", { value: r, selected: r === member.role }, r)));
  select.addEventListener("change", async () => {
    clearError(errEl);
    select.disabled = true;
    try {
      await view.client.setMemberRole(view.id, member.user_id, select.value);
      await done();
    } catch (e) {
      select.value = member.role; // the change did not happen
      showMemberError(errEl, e, member.user_id);
    } finally {
      select.disabled = false;
    }
  });
  const remove = h("button", { type: "button", class: "member-remove", title: "Remove from the session" }, "Remove");
  let armed = null;
  remove.addEventListener("click", async () => {
    if (!armed) {
      remove.dataset.armed = "true";
      setText(remove, "Confirm");
      armed = setTimeout(() => {
        armed = null;
        delete remove.dataset.armed;
        setText(remove, "Remove");
      }, CONFIRM_MS);
      return;
    }
    clearTimeout(armed);
    armed = null;
    clearError(errEl);
    remove.disabled = true;
    try {
      await view.client.removeMember(view.id, member.user_id);
      await done();
    } catch (e) {
      remove.disabled = false;
      delete remove.dataset.armed;
      setText(remove, "Remove");
      showMemberError(errEl, e, member.user_id);
    }
  });
  return h("span", { class: "member-controls" }, select, remove);
}

// A refused member change; `last_owner` said plainly (the user id isolated).
function showMemberError(el, e, userId) {
  if (e?.code === "last_owner") {
    setText(el, "last_owner: ", untrusted(userId), " is the session's last owner: make another member owner first.");
    el.hidden = false;
  } else {
    showError(el, e);
  }
  el.dataset.code = e?.code ?? "";
}

/** The page for a session this user may no longer open (removed, or never a member). */
export function noAccessScreen(e) {
  const gone = e?.code === "not_a_member";
  return [
    h("h1", {}, gone ? "You are not a member of this session" : "Cannot open this session"),
    gone
      ? h("p", { class: "muted" }, "An owner removed you, or the link is wrong. Ask an owner to add you again.")
      : h("p", { class: "error-text" }, `${e.code}: `, untrusted(e.message)),
  ];
}
