// Thin client of the REST API (docs/api.md). Every mutating call carries the bearer token
// when the page was given one (window.CONSPO_TOKEN).

export class ApiError extends Error {
  constructor(status, detail) {
    super(typeof detail === "string" ? detail : `HTTP ${status}`);
    this.status = status;
    this.detail = detail;
  }
}

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  if (window.CONSPO_TOKEN) h.Authorization = `Bearer ${window.CONSPO_TOKEN}`;
  return h;
}

/** The answer to a GET the page's <head> already sent (early.js), once; or null. */
function takeEarly(path) {
  const sent = window.CONSPO_EARLY?.get(path);
  if (!sent) return null;
  window.CONSPO_EARLY.delete(path);
  return sent;
}

// A 503 that carries Retry-After is the server's back-pressure (a full pool, busy task-check
// helpers): the API promises nothing was done (docs/api.md), so asking again is safe, after the
// wait it names, a few times before the error reaches the page.
const BUSY_RETRIES = 4;
const BUSY_WAIT_MAX_S = 10;

function busyWait(resp) {
  const header = resp.headers.get("Retry-After");
  if (resp.status !== 503 || header === null || header.trim() === "") return null;
  const seconds = Number(header);
  return Number.isFinite(seconds) && seconds >= 0 ? Math.min(seconds, BUSY_WAIT_MAX_S) : null;
}

export async function request(method, path, body) {
  const init = { method, headers: headers(body !== undefined) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const early = method === "GET" ? await takeEarly(path) : null;
  let resp = early || (await fetch(path, init));
  for (let tries = 0; tries < BUSY_RETRIES; tries++) {
    const wait = busyWait(resp);
    if (wait === null) break;
    await new Promise((done) => setTimeout(done, Math.max(wait, 0.5) * 1000));
    resp = await fetch(path, init);
  }
  if (resp.status === 204) return null;
  let data = null;
  const text = await resp.text();
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = text;
    }
  }
  if (!resp.ok) throw new ApiError(resp.status, data && data.detail !== undefined ? data.detail : data);
  return data;
}

export const get = (path) => request("GET", path);
export const post = (path, body = {}) => request("POST", path, body);
export const del = (path) => request("DELETE", path);
export const patch = (path, body) => request("PATCH", path, body);

export function qs(params) {
  const u = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v === undefined || v === null || v === "") continue;
    u.set(k, Array.isArray(v) ? v.join(",") : String(v));
  }
  const s = u.toString();
  return s ? `?${s}` : "";
}

/** Human message of an ApiError (a validation list is joined). */
export function errorText(err) {
  if (!(err instanceof ApiError)) return String(err?.message ? err.message : err);
  const d = err.detail;
  if (Array.isArray(d)) return d.map((e) => `${(e.loc || []).join(".")}: ${e.msg}`).join("; ");
  if (typeof d === "string") return d;
  return `HTTP ${err.status}`;
}

/**
 * Server-Sent Events with named handlers. EventSource reconnects by itself and sends
 * Last-Event-ID, so the server resumes from the cursor. `onState(open)` reports the link.
 */
export function stream(path, handlers, onState) {
  const es = new EventSource(path);
  for (const [name, fn] of Object.entries(handlers)) {
    es.addEventListener(name, (ev) => {
      let data = ev.data;
      try {
        data = data ? JSON.parse(data) : null;
      } catch {
        /* keep the raw text */
      }
      fn(data, ev);
    });
  }
  es.onopen = () => onState?.(true);
  es.onerror = () => onState?.(es.readyState === EventSource.OPEN);
  return es;
}
