// The dashboard's page: state.json every second, and the tap as
// Server-Sent Events while it runs. No dependency, no network but the
// dashboard's own handler.
"use strict";

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function fill(tbody, rows) {
  const frag = document.createDocumentFragment();
  for (const cells of rows) {
    const tr = document.createElement("tr");
    for (const c of cells) tr.appendChild(c);
    frag.appendChild(tr);
  }
  tbody.replaceChildren(frag);
}

function pct(x) { return (100 * x).toFixed(1) + "%"; }
function ms(x) { return x.toFixed(1); }

function list(dl, pairs) {
  const frag = document.createDocumentFragment();
  for (const [k, v] of pairs) {
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = v;
    frag.appendChild(dt); frag.appendChild(dd);
  }
  dl.replaceChildren(frag);
}

function render(s) {
  document.getElementById("name").textContent = s.name || "";
  document.getElementById("updated").textContent = "updated " + new Date(s.time).toLocaleTimeString();
  fill(document.querySelector("#routes tbody"), s.routes.map(r => [
    cell(r.direction), cell(r.authority), cell(r.route || "default"),
    cell(pct(r.successRate), r.successRate < 0.99 ? "num bad" : "num ok"),
    cell(r.rps.toFixed(1), "num"), cell(ms(r.p50Millis), "num"), cell(ms(r.p95Millis), "num"),
    cell(ms(r.p99Millis), "num"), cell(String(r.requests), "num"), cell(String(r.retries), "num"), cell(String(r.hedges), "num"),
  ]));
  const eps = [];
  for (const a of s.endpoints) {
    for (const e of a.endpoints) {
      eps.push([cell(a.authority), cell(e.addr), cell(e.state, e.state === "ready" ? "ok" : "bad"),
        cell(e.zone || ""), cell(e.identity || ""), cell(ms(1000 * e.load_seconds), "num"),
        cell(String(e.pending), "num"), cell(String(e.weight), "num")]);
    }
  }
  fill(document.querySelector("#endpoints tbody"), eps);
  fill(document.querySelector("#decisions tbody"), s.decisions.map(d => [
    cell(d.route || "default"), cell(d.client || "(no identity)"),
    cell(d.decision, d.decision === "allowed" ? "ok" : "bad"), cell(String(d.count), "num"),
  ]));
  if (s.identity) {
    const exp = s.identity.expiry && !s.identity.expiry.startsWith("0001") ? new Date(s.identity.expiry).toLocaleString() : "no certificate yet";
    list(document.getElementById("identity"), [["identity", s.identity.name], ["certificate expires", exp], ["issuer", s.identity.issuer || ""]]);
  }
  if (s.controlPlane) {
    const c = s.controlPlane;
    list(document.getElementById("control"), [["address", c.addr || ""], ["profile watches", c.profileWatches],
      ["endpoint watches", c.endpointWatches], ["policy watches", c.policyWatches],
      ["inbound watches", c.inboundWatches], ["refused watches", c.rejectedWatches]]);
  }
}

async function poll() {
  try {
    const r = await fetch("state.json", { cache: "no-store" });
    if (r.ok) render(await r.json());
  } catch (e) {
    document.getElementById("updated").textContent = "disconnected";
  }
  setTimeout(poll, 1000);
}

let source = null;
const maxRows = 200;

function stopTap() {
  if (source) source.close();
  source = null;
  document.getElementById("tap-start").disabled = false;
  document.getElementById("tap-stop").disabled = true;
  document.getElementById("tap-state").textContent = "stopped";
}

function startTap(ev) {
  ev.preventDefault();
  stopTap();
  const params = new URLSearchParams();
  for (const [k, v] of new FormData(ev.target)) if (v) params.set(k, v);
  source = new EventSource("tap?" + params.toString());
  const tbody = document.querySelector("#tap tbody");
  document.getElementById("tap-start").disabled = true;
  document.getElementById("tap-stop").disabled = false;
  document.getElementById("tap-state").textContent = "connecting";
  source.onopen = () => { document.getElementById("tap-state").textContent = "running"; };
  source.onmessage = (m) => {
    const e = JSON.parse(m.data);
    const tr = document.createElement("tr");
    for (const c of [cell(new Date(e.time).toLocaleTimeString()), cell(e.direction), cell(e.method), cell(e.authority),
      cell(e.path), cell(e.route || ""), cell(e.error ? "error" : String(e.status), e.error || e.status >= 500 ? "bad" : ""),
      cell(ms(e.latencyMillis), "num"), cell(e.clientId || ""), cell(String(e.retries), "num"), cell(String(e.hedges), "num"), cell(e.decision || "")]) {
      tr.appendChild(c);
    }
    tbody.prepend(tr);
    while (tbody.rows.length > maxRows) tbody.deleteRow(-1);
  };
  source.onerror = () => { document.getElementById("tap-state").textContent = "reconnecting"; };
}

document.getElementById("tap-form").addEventListener("submit", startTap);
document.getElementById("tap-stop").addEventListener("click", stopTap);
poll();
