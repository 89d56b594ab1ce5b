// Who is watching the session now: the gateway's `presence` notice (every
// member with the session open, on any gateway; not part of the log). The
// list is replaced whole by each notice.

import { h, setText, untrusted, firstVisible, plainText } from "./dom.js";

export class PresenceView {
  constructor(el, me) {
    this.el = el;
    this.me = me;
    this.users = [];
    this.show([]);
  }

  show(users) {
    this.users = [...users];
    this.el.dataset.users = this.users.join(",");
    this.el.hidden = !this.users.length;
    setText(this.el, h("span", { class: "presence-label" }, "Watching now"),
      ...this.users.map((u) => h("span", {
        class: "viewer", "data-user": u, title: `${plainText(u)}${u === this.me ? " (you)" : ""} has this session open`,
      }, h("span", { class: "avatar", "aria-hidden": "true" }, (firstVisible(u) || "?").toUpperCase()),
      h("span", { class: "viewer-name" }, untrusted(u)))));
  }
}
