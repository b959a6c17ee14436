// /docs: the API reference rendered from /openapi.json with no third-party script, so it works
// offline (Swagger UI would load its JS and CSS from a CDN). One section per tag, one entry per
// operation: method, path, summary, parameters, the request body's schema name, the statuses it
// answers (each one's meaning on hover) and whether it needs a token.
import { get } from "/static/api.js";
import { $, h } from "/static/util.js";

const METHODS = ["get", "post", "put", "patch", "delete"];

function schemaName(content) {
  const schema = content?.["application/json"]?.schema;
  if (!schema) return "";
  return (schema.$ref || "").split("/").pop() || schema.type || "";
}

/** "token required", "token optional" or "no token", from the operation's `security`. */
function tokenText(security) {
  if (!security?.length) return "no token";
  return security.some((s) => Object.keys(s).length === 0) ? "token optional" : "token required";
}

function answers(op) {
  const codes = Object.entries(op.responses || {}).map(([code, r]) => h("code", { title: r.description || "" }, code));
  return h("p.small", {}, "answers ", ...codes.flatMap((c) => [c, " "]), `· ${tokenText(op.security)}`);
}

function operation(path, method, op) {
  const params = (op.parameters || []).map((p) =>
    h(
      "tr",
      {},
      h("td.mono", {}, p.name),
      h("td", {}, p.in),
      h("td", {}, p.required ? "required" : ""),
      h("td", {}, p.description || p.schema?.description || ""),
    ),
  );
  const body = schemaName(op.requestBody?.content);
  return h(
    "details.api-op",
    { id: op.operationId || `${method}-${path}` },
    h(
      "summary",
      {},
      h(`span.api-method.m-${method}`, {}, method.toUpperCase()),
      " ",
      h("code", {}, path),
      " ",
      h("span.muted", {}, op.summary || ""),
    ),
    op.description ? h("p.api-desc", {}, op.description) : null,
    params.length ? h("table.grid", {}, h("tbody", {}, params)) : null,
    body ? h("p.small", {}, "body: ", h("code", {}, body)) : null,
    answers(op),
  );
}

async function render() {
  const spec = await get("/openapi.json");
  const byTag = new Map();
  for (const [path, item] of Object.entries(spec.paths || {})) {
    for (const method of METHODS) {
      const op = item[method];
      if (!op) continue;
      const tag = (op.tags || ["other"])[0];
      if (!byTag.has(tag)) byTag.set(tag, []);
      byTag.get(tag).push(operation(path, method, op));
    }
  }
  $("#api-docs").replaceChildren(
    h("p", {}, `${spec.info?.title || "API"} ${spec.info?.version || ""}: ${spec.info?.description || ""}`),
    ...[...byTag].map(([tag, ops]) => h("section.api-tag", {}, h("h2", {}, tag), ...ops)),
  );
}
render().catch((err) => {
  $("#api-docs").textContent = `Could not load /openapi.json: ${err}`;
});
