// Narrow screens: the session list and the members column become panels
// that slide over the runs, each opened by its button in the top bar
// (aria-expanded, aria-controls) and closed by the button again, Escape,
// the close button, or picking a session. On wide screens the buttons are
// hidden and the columns are always there (style.css, max-width: 900px).

const PANELS = [
  { button: "toggle-sessions", panel: "sessions-panel" },
  { button: "toggle-members", panel: "members-panel" },
];

export function wirePanels() {
  const $ = (id) => document.getElementById(id);
  const pairs = PANELS.map(({ button, panel }) => ({ button: $(button), panel: $(panel) }));
  const setOpen = (pair, open) => {
    pair.panel.classList.toggle("open", open);
    pair.button.setAttribute("aria-expanded", String(open));
    if (open) {
      for (const other of pairs) if (other !== pair) setOpen(other, false);
      pair.panel.querySelector("button, input, select, textarea, [tabindex]")?.focus({ preventScroll: true });
    }
  };
  const closeAll = () => pairs.forEach((p) => setOpen(p, false));
  for (const pair of pairs) {
    pair.button.addEventListener("click", () => setOpen(pair, !pair.panel.classList.contains("open")));
    pair.panel.querySelector(".panel-close")?.addEventListener("click", () => {
      setOpen(pair, false);
      pair.button.focus();
    });
    // The members button is there only while its column is (a session is open).
    const sync = () => {
      pair.button.hidden = pair.panel.hidden;
      if (pair.panel.hidden) setOpen(pair, false);
    };
    new MutationObserver(sync).observe(pair.panel, { attributes: true, attributeFilter: ["hidden"] });
    sync();
  }
  document.addEventListener("keydown", (ev) => {
    if (ev.key !== "Escape") return;
    const open = pairs.find((p) => p.panel.classList.contains("open"));
    if (!open) return;
    setOpen(open, false);
    open.button.focus();
  });
  // Picking a session closes the list: the run area is what you came for.
  $("sessions").addEventListener("click", (ev) => {
    if (ev.target.closest(".session-item")) setOpen(pairs[0], false);
  });
  return { closeAll };
}
