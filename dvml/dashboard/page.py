"""The dvml page's HTML: one static document whose script asks for ``api/state.json`` every
second and redraws its tables (no JavaScript library; Dask's dashboard is the model)."""

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>dvml</title>
<style>
  body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
  h1 { font-size: 1.4em; margin-bottom: 0.2em; }
  h2 { font-size: 1.1em; margin-top: 1.4em; }
  table { border-collapse: collapse; min-width: 40em; }
  th, td { border-bottom: 1px solid #ddd; padding: 0.25em 0.7em; text-align: left; }
  th { background: #f3f3f3; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; }
  .bar { background: #eee; width: 12em; height: 0.8em; display: inline-block; }
  .bar span { background: #4c78a8; height: 100%; display: block; }
  .slow { color: #b00; font-weight: bold; }
  .trainer td:first-child { padding-left: 2em; color: #555; }
  #updated { color: #777; font-size: 0.85em; }
</style>
</head>
<body>
<h1>dvml</h1>
<div id="updated">waiting for the scheduler...</div>
<h2>Workers</h2>
<table id="workers"><thead><tr><th>worker</th><th>host</th><th>GPUs</th>
<th>vineyardd</th><th>used / size</th><th>datasets</th></tr></thead><tbody></tbody></table>
<h2>Datasets</h2>
<table id="datasets"><thead><tr><th>dataset</th><th>kind</th><th>version</th><th>rows</th>
<th>bytes</th><th>rows per worker</th></tr></thead><tbody></tbody></table>
<h2>Memory reserved by running jobs</h2>
<table id="reservations"><thead><tr><th>job</th><th>since</th><th>bytes per machine</th>
<th>total</th></tr></thead><tbody></tbody></table>
<h2>Training jobs</h2>
<table id="jobs"><thead><tr><th>model / trainer</th><th>state</th><th>iteration</th>
<th>steps</th><th>s / step (input + compute)</th><th>s / step waiting</th>
<th>resident (peak)</th><th>elapsed</th><th>ETA</th></tr></thead><tbody></tbody></table>
<h2>Model hopper jobs (fit_multiple, searches)</h2>
<table id="hop_jobs"><thead><tr><th>job / model</th><th>state</th><th>hops</th>
<th>iteration</th><th>worker</th><th>loss</th><th>training s</th><th>elapsed</th></tr></thead>
<tbody></tbody></table>
<h2>Faults</h2>
<table id="faults"><thead><tr><th>when</th><th>model</th><th>what</th></tr></thead>
<tbody></tbody></table>
<h2>Searches (ASHA, Hyperband)</h2>
<table id="searches"><thead><tr><th>search / trial</th><th>state</th><th>rung</th>
<th>iterations</th><th>loss</th><th>worker</th></tr></thead><tbody></tbody></table>
<h2>Models (latest registered)</h2>
<table id="models"><thead><tr><th>model</th><th>registered</th><th>trained by</th>
<th>training data</th><th>validation data</th><th>warm start</th></tr></thead><tbody></tbody>
</table>
<script>
const api = location.pathname.replace(/\\/?$/, "/") + "api/state.json";
function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let k = 0;
  while (n >= 1024 && k < units.length - 1) { n /= 1024; k++; }
  return n.toFixed(k ? 1 : 0) + " " + units[k];
}
function secs(s) { return s === null || s === undefined ? "" : s.toFixed(1) + " s"; }
function loss(v) { return v === null || v === undefined ? "" : v.toFixed(4); }
function data(d) {
  if (!d) return "";
  const v = d.version === null || d.version === undefined ? "" : "@v" + d.version;
  return d.name + v + (d.content_digest ? " " + d.content_digest.slice(0, 12) : "");
}
function step(s) { return s === null || s === undefined ? "" : s.toFixed(4); }
function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}
function row(body, cells, cls) {
  const tr = document.createElement("tr");
  if (cls) tr.className = cls;
  for (const c of cells) tr.appendChild(c);
  body.appendChild(tr);
  return tr;
}
function bar(used, limit) {
  const td = document.createElement("td");
  if (limit) {
    const outer = document.createElement("div");
    outer.className = "bar";
    const inner = document.createElement("span");
    inner.style.width = Math.min(100, 100 * used / limit).toFixed(1) + "%";
    outer.appendChild(inner);
    td.appendChild(outer);
  }
  return td;
}
function draw(state) {
  const w = document.querySelector("#workers tbody");
  w.replaceChildren();
  for (const x of state.workers) {
    const held = Object.entries(x.datasets).map(([n, b]) => n + " " + bytes(b)).join(", ");
    const used = x.vineyard_limit ? bytes(x.vineyard_used) + " / " + bytes(x.vineyard_limit) : "";
    row(w, [cell(x.name), cell(x.host), cell(String(x.gpus), "num"),
            bar(x.vineyard_used, x.vineyard_limit), cell(used, "num"), cell(held)]);
  }
  const d = document.querySelector("#datasets tbody");
  d.replaceChildren();
  for (const x of state.datasets) {
    const per = Object.entries(x.workers).map(([n, v]) => n + ": " + v.rows).join(", ");
    row(d, [cell(x.name), cell(x.kind || ""), cell(String(x.version), "num"),
            cell(String(x.rows), "num"),
            cell(bytes(x.nbytes), "num"), cell(per)]);
  }
  const r = document.querySelector("#reservations tbody");
  r.replaceChildren();
  for (const x of state.reservations) {
    const per = Object.entries(x.machines).map(([m, b]) => m + ": " + bytes(b)).join(", ");
    row(r, [cell(x.job), cell(x.since), cell(per), cell(bytes(x.total), "num")]);
  }
  const j = document.querySelector("#jobs tbody");
  j.replaceChildren();
  for (const x of state.jobs) {
    const of = x.num_iterations ? x.iteration + " / " + x.num_iterations : String(x.iteration);
    const slow = x.straggler ? " (slow: " + x.straggler.worker + " " +
      x.straggler.ratio.toFixed(1) + "x)" : "";
    row(j, [cell((x.model || x.job) + slow, x.straggler ? "slow" : ""), cell(x.state),
            cell(of, "num"), cell(""), cell(""), cell(""), cell(""), cell(secs(x.elapsed), "num"),
            cell(secs(x.eta_seconds), "num")], "job");
    for (const t of x.trainers) {
      const named = x.straggler && x.straggler.worker === t.worker;
      row(j, [cell(t.worker, named ? "slow" : ""), cell(""), cell(String(t.iteration), "num"),
              cell(String(t.steps), "num"), cell(step(t.step_seconds), "num"),
              cell(step(t.waiting_step_seconds), "num"),
              cell(t.peak_resident_bytes == null ? "" : bytes(t.peak_resident_bytes), "num"),
              cell(""), cell("")], "trainer");
    }
  }
  const h = document.querySelector("#hop_jobs tbody");
  h.replaceChildren();
  for (const x of state.hop_jobs) {
    row(h, [cell(x.model || x.job), cell(x.state), cell(String(x.hops), "num"), cell(""),
            cell(x.workers.join(", ")), cell(""), cell(""), cell(secs(x.elapsed), "num")], "job");
    for (const m of x.models) {
      row(h, [cell("model " + m.mst_key), cell(m.state), cell(String(m.hops), "num"),
              cell(String(m.iteration), "num"), cell(m.worker || ""), cell(loss(m.fit_loss), "num"),
              cell(secs(m.train_s), "num"), cell("")], "trainer");
    }
  }
  const f = document.querySelector("#faults tbody");
  f.replaceChildren();
  for (const x of state.faults) {
    row(f, [cell(new Date(x.at * 1000).toLocaleTimeString()), cell(x.model || x.job),
            cell(x.what, "slow")]);
  }
  const s = document.querySelector("#searches tbody");
  s.replaceChildren();
  for (const x of state.searches) {
    const rungs = x.method === "hyperband"
      ? "diagonal " + x.diagonal + " of " + x.diagonals
      : Object.entries(x.rungs).map(([r, n]) => "rung " + r + ": " + n).join(", ");
    const best = x.best ? "best: trial " + x.best.trial + " (" + loss(x.best.loss) + ")" : "";
    row(s, [cell(x.model_output + " (" + rungs + ") " + best), cell(x.state), cell(""), cell(""),
            cell(""), cell("")], "job");
    for (const b of x.brackets || []) {
      row(s, [cell("bracket " + b.s + ": " + b.keys.length + " configuration(s)"),
              cell("round " + (b.round + 1) + " of " + b.rounds), cell(String(b.round), "num"),
              cell(String(b.iterations), "num"), cell(loss(b.loss), "num"), cell("")],
          "trainer");
    }
    for (const t of x.trials) {
      row(s, [cell("trial " + t.trial), cell(t.state), cell(String(t.rung), "num"),
              cell(String(t.iterations), "num"), cell(loss(t.loss), "num"), cell(t.worker || "")],
          "trainer");
    }
  }
  const m = document.querySelector("#models tbody");
  m.replaceChildren();
  for (const x of state.models) {
    row(m, [cell(x.name), cell(new Date(x.at * 1000).toLocaleTimeString()), cell(x.trained_by),
            cell(data(x.training)), cell(data(x.validation)), cell(x.warm_start ? "yes" : "")]);
  }
  document.getElementById("updated").textContent =
    "updated " + new Date(state.time * 1000).toLocaleTimeString();
}
async function refresh() {
  try {
    const r = await fetch(api, {cache: "no-store"});
    if (r.ok) draw(await r.json());
  } catch (e) {
    const m = document.querySelector("#models tbody");
  m.replaceChildren();
  for (const x of state.models) {
    row(m, [cell(x.name), cell(new Date(x.at * 1000).toLocaleTimeString()), cell(x.trained_by),
            cell(data(x.training)), cell(data(x.validation)), cell(x.warm_start ? "yes" : "")]);
  }
  document.getElementById("updated").textContent = "the scheduler does not answer";
  }
}
refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
"""
