// The first requests of a chart page, sent from <head> (base.html inlines this classic script)
// before Plotly (megabytes to compile and run) and the page's modules have loaded: the answers
// travel meanwhile, and api.js's get() of the same path takes the answer instead of asking
// again. A path here must be exactly the one the page's module asks for first.
(() => {
  const sent = new Map(); // path → Promise<Response | null> (null: failed, get() asks again)
  window.CONSPO_EARLY = sent;
  const headers = window.CONSPO_TOKEN ? { Authorization: `Bearer ${window.CONSPO_TOKEN}` } : {};
  const send = (path) =>
    sent.set(
      path,
      fetch(path, { headers }).catch(() => null),
    );
  const run = /^\/runs\/(\d+)$/.exec(location.pathname);
  if (run) {
    // run_state.js: the run, its logged keys and the charted keys' series (loadMetrics)
    const base = `/api/runs/${run[1]}`;
    send(base);
    send(`${base}/metrics/keys`);
    const charted = window.CONSPO_CATALOGUE?.charted_keys || [];
    send(`${base}/metrics?${new URLSearchParams({ keys: charted.join(","), max_points: "1000" })}`);
  }
  const study = /^\/studies\/(\d+)$/.exec(location.pathname);
  if (study) send(`/api/studies/${study[1]}`); // study.js
  if (location.pathname === "/compare") {
    // compare_state.js: the run picker, each chosen run's keys and their series (loadData, the
    // keys of the URL or the catalogue's key metrics)
    const url = new URLSearchParams(location.search);
    const list = (name) =>
      (url.get(name) || "")
        .split(",")
        .map((s) => s.trim())
        .filter(Boolean);
    send("/api/runs?limit=200&sort=-created_at");
    const ids = list("runs").map(Number).filter(Number.isFinite).slice(0, 50);
    for (const id of ids) send(`/api/runs/${id}/metrics/keys`);
    const chosen = list("keys").length ? list("keys") : window.CONSPO_CATALOGUE?.key_metrics || [];
    const axis = url.get("x") === "rollouts" ? [window.CONSPO_CATALOGUE?.rollouts_axis] : [];
    const keys = [...new Set([...chosen, ...axis])].slice(0, 50);
    if (ids.length && keys.length && !url.get("group_id")) {
      send(`/api/compare?${new URLSearchParams({ runs: ids.join(","), keys: keys.join(","), max_points: "1000" })}`);
    }
  }
})();
