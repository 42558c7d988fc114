// The shipped nginx example (deploy/nginx.conf) really spreads requests over
// two loopserve instances and fails over when one goes away: two real
// servers, a real nginx on loopback, one server stopped, 50 of 50 requests
// still answered 200. The instances run with the settings of the shipped
// environment file (deploy/loopserve.env: bound to 127.0.0.1, the public name
// in SERVICE_ALLOWED_HOSTS), so the pair is shown to work under the browser
// protection defaults; a second pair adds an API key.
//
// The example is used as shipped except for its addresses: the instance
// ports 8001/8002 and `listen 80` are replaced by free loopback ports, and
// it is wrapped in the minimal main configuration nginx needs to run
// unprivileged from a temp directory (pid, logs, temp paths).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import OpenAI from "openai";
import { ErrorBody, GenerateResponse } from "../../src/wire/responses.ts";
import { shippedEnv, shippedInstanceEnv } from "../helpers/deploy.ts";
import { expectSchema, jsonBody } from "../helpers/http.ts";
import { startServer, type TestServer } from "../helpers/server.ts";

const ROOT = resolve(import.meta.dir, "../..");
const NGINX_CONF = join(ROOT, "deploy/nginx.conf");

const nginx = Bun.which("nginx") ?? ["/usr/sbin/nginx", "/usr/local/sbin/nginx"].find((p) => existsSync(p)) ?? null;
const skipReason = nginx ? null : "nginx is not installed (.ci/system-deps.sh installs the Debian package)";
if (skipReason) console.warn(`skipping nginx failover test: ${skipReason}`);

function freePort(): number {
  const probe = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
  const port = probe.port;
  probe.stop(true);
  return port;
}

/** deploy/nginx.conf with its example addresses replaced. */
export function localizeNginxConf(conf: string, instancePorts: [number, number], listenPort: number): string {
  const out = conf
    .replace(/127\.0\.0\.1:8001\b/g, `127.0.0.1:${instancePorts[0]}`)
    .replace(/127\.0\.0\.1:8002\b/g, `127.0.0.1:${instancePorts[1]}`)
    .replace(/^(\s*)listen 80;/m, `$1listen 127.0.0.1:${listenPort};`);
  if (out.includes(":8001") || out.includes(":8002") || !out.includes(`listen 127.0.0.1:${listenPort};`))
    throw new Error("deploy/nginx.conf no longer has the example addresses this test substitutes");
  return out;
}

/** The first name of SERVICE_ALLOWED_HOSTS in the shipped file: what clients use. */
const PUBLIC_NAME = (shippedEnv().SERVICE_ALLOWED_HOSTS ?? "").split(",")[0].trim();

function mainConf(dir: string, site: string): string {
  // Workers of a root master run as `nobody`; elsewhere `user` is ignored.
  const group = /^nogroup:/m.test(readFileSync("/etc/group", "utf8")) ? "nogroup" : "nobody";
  const user = process.getuid?.() === 0 ? `user nobody ${group};\n` : "";
  return `${user}worker_processes 1;
daemon off;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections 256; }
http {
    access_log ${dir}/access.log;
    client_body_temp_path ${dir}/client_body;
    proxy_temp_path ${dir}/proxy;
    fastcgi_temp_path ${dir}/fastcgi;
    uwsgi_temp_path ${dir}/uwsgi;
    scgi_temp_path ${dir}/scgi;
${site}
}
`;
}

interface Proxied {
  a: TestServer;
  b: TestServer;
  /** nginx's address, http://127.0.0.1:<port>. */
  base: string;
  dir: string;
  stop(): Promise<void>;
}

/** Two instances started with `env`, behind a real nginx running deploy/nginx.conf. */
async function behindNginx(env: Record<string, string>): Promise<Proxied> {
  const [a, b] = await Promise.all([startServer({ env }), startServer({ env })]);
  const portOf = (s: TestServer) => Number(new URL(s.url).port);
  const dir = mkdtempSync(join(tmpdir(), "loopserve-nginx-"));
  chmodSync(dir, 0o755); // nginx's workers (nobody) create their temp dirs here
  const listen = freePort();
  const site = localizeNginxConf(readFileSync(NGINX_CONF, "utf8"), [portOf(a), portOf(b)], listen);
  const conf = join(dir, "nginx.conf");
  writeFileSync(conf, mainConf(dir, site));

  const check = Bun.spawnSync([nginx as string, "-t", "-p", dir, "-e", join(dir, "error.log"), "-c", conf], { stderr: "pipe" });
  if (check.exitCode !== 0) throw new Error(`nginx -t rejects deploy/nginx.conf:\n${check.stderr.toString()}`);

  const proxy = Bun.spawn([nginx as string, "-p", dir, "-e", join(dir, "error.log"), "-c", conf], { stdout: "pipe", stderr: "pipe" });
  const log: string[] = [];
  void (async () => {
    for await (const chunk of proxy.stderr as ReadableStream<Uint8Array>) log.push(new TextDecoder().decode(chunk));
  })();
  const base = `http://127.0.0.1:${listen}`;
  const stop = async () => {
    if (proxy.exitCode === null) {
      proxy.kill("SIGQUIT"); // graceful nginx shutdown
      await proxy.exited;
    }
    await Promise.all([a.stop(), b.stop()]);
    rmSync(dir, { recursive: true, force: true });
  };
  // nginx's own /healthz location must pass loopserve's Host check too.
  const deadline = Date.now() + 10_000;
  for (;;) {
    try {
      if ((await fetch(`${base}/healthz`)).status === 200) break;
    } catch {}
    if (proxy.exitCode !== null || Date.now() > deadline) {
      const errors = existsSync(join(dir, "error.log")) ? readFileSync(join(dir, "error.log"), "utf8") : "";
      const health = await fetch(`${base}/healthz`).then((r) => r.text(), (e) => String(e));
      await stop();
      throw new Error(`nginx did not start or /healthz through it is not 200:\n${log.join("")}\n${errors}\n${health}`);
    }
    await Bun.sleep(50);
  }
  return { a, b, base, dir, stop };
}

describe.skipIf(skipReason !== null)("nginx in front of two instances", () => {
  let a: TestServer;
  let b: TestServer;
  let base = "";
  let dir = "";
  let proxied: Proxied | null = null;

  beforeAll(async () => {
    proxied = await behindNginx(shippedInstanceEnv());
    ({ a, b, base, dir } = proxied);
  });

  afterAll(async () => {
    await proxied?.stop();
  });

  const generate = () =>
    fetch(`${base}/generate`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "Hello", max_tokens: 2, temperature: 0 }),
    });

  test("requests through nginx reach both instances", async () => {
    const statuses = await Promise.all(Array.from({ length: 8 }, () => generate().then((r) => r.status)));
    expect(statuses).toEqual(Array(8).fill(200));
    // Both instances served some: least_conn with 8 concurrent requests.
    const completed = async (s: TestServer) => {
      const text = await (await fetch(`${s.url}/metrics`)).text();
      return Number(/^service_requests_completed_total(?:\{[^}]*\})? ([0-9.e+]+)$/m.exec(text)?.[1] ?? 0);
    };
    const [ca, cb] = await Promise.all([completed(a), completed(b)]);
    expect(ca + cb).toBeGreaterThanOrEqual(8);
    expect(ca).toBeGreaterThan(0);
    expect(cb).toBeGreaterThan(0);
  });

  test("the shipped public name is served through nginx; other names are refused (DNS-rebinding guard)", async () => {
    expect(PUBLIC_NAME).not.toBe("");
    const post = (headers: Record<string, string>) =>
      fetch(`${base}/generate`, {
        method: "POST",
        headers: { "content-type": "application/json", ...headers },
        body: JSON.stringify({ prompt: "Hello", max_tokens: 2, temperature: 0 }),
      });
    expect((await post({ host: PUBLIC_NAME })).status).toBe(200);
    expect((await fetch(`${base}/healthz`, { headers: { host: PUBLIC_NAME } })).status).toBe(200);
    const refused = await post({ host: "rebind.evil.example" });
    expect((await jsonBody(refused, ErrorBody, 403)).error.code).toBe("host_not_allowed");
    // A page of the site on a non-default port calling the API: nginx passes
    // the Host with its port, so the Origin is recognized as the server's own.
    const site = `${PUBLIC_NAME}:${new URL(base).port}`;
    const own = await post({ host: site, origin: `http://${site}` });
    expect(own.status).toBe(200);
    expect(own.headers.get("access-control-allow-origin")).toBe(`http://${site}`);
    expect((await post({ host: site, origin: "https://evil.example" })).status).toBe(403);
  });

  test("nginx's request id is the instance's request id, in the response and the instance's log line", async () => {
    const res = await generate();
    expect(res.status).toBe(200);
    const id = res.headers.get("x-request-id") as string;
    expect(id).toMatch(/^[0-9a-f]{32}$/);
    await res.text();
    const logged = () => [a, b].some((s) => s.output().includes(`request request_id=${id} method=POST path=/generate status=200`));
    for (let i = 0; i < 100 && !logged(); i++) await Bun.sleep(20);
    expect(logged()).toBe(true);
  });

  test("with one instance stopped, all of 50 requests still succeed", async () => {
    expect(await b.stop()).toBe(0);
    const statuses: number[] = [];
    // Five waves of ten concurrent requests, so several land on the dead
    // instance before nginx marks it failed (and again after fail_timeout).
    for (let wave = 0; wave < 5; wave++) {
      const batch = await Promise.all(Array.from({ length: 10 }, () => generate()));
      for (const r of batch) {
        statuses.push(r.status);
        const body: unknown = await r.json();
        expectSchema(GenerateResponse, body);
      }
    }
    expect(statuses.length).toBe(50);
    expect(statuses.filter((s) => s !== 200)).toEqual([]);
    // Some of them did go to the stopped instance and were retried.
    expect(readFileSync(join(dir, "error.log"), "utf8")).toContain("Connection refused");
    // Non-streaming bodies were proxied whole and the stream path was not
    // buffered: an SSE request also comes through.
    const sse = await fetch(`${base}/generate`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "Hello", max_tokens: 2, temperature: 0, stream: true }),
    });
    expect(sse.status).toBe(200);
    expect(await sse.text()).toContain("data:");
  });
});

describe.skipIf(skipReason !== null)("nginx in front of two instances with an API key", () => {
  const KEY = "sk-nginx-test-key";
  let proxied: Proxied | null = null;

  beforeAll(async () => {
    const keyDir = mkdtempSync(join(tmpdir(), "loopserve-key-"));
    const keyFile = join(keyDir, "api-key");
    writeFileSync(keyFile, `${KEY}\n`, { mode: 0o600 });
    proxied = await behindNginx(shippedInstanceEnv({ SERVICE_API_KEY_FILE: keyFile }));
  });

  afterAll(async () => {
    await proxied?.stop();
  });

  test("the openai client through nginx: works with the key (plain and streamed), AuthenticationError without it", async () => {
    const { base } = proxied as Proxied;
    const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: KEY, maxRetries: 0 });
    const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: "user", content: "Hello" }];
    const plain = await client.chat.completions.create({ model: "m", messages, max_tokens: 3, temperature: 0 });
    expect(plain.usage?.completion_tokens).toBe(3);
    let streamed = "";
    for await (const c of await client.chat.completions.create({ model: "m", messages, max_tokens: 3, temperature: 0, stream: true }))
      streamed += c.choices[0]?.delta.content ?? "";
    expect(streamed).toBe(plain.choices[0].message.content as string);
    const wrong = new OpenAI({ baseURL: `${base}/v1`, apiKey: "sk-wrong", maxRetries: 0 });
    expect(await wrong.chat.completions.create({ model: "m", messages, max_tokens: 3 }).catch((e) => e)).toBeInstanceOf(OpenAI.AuthenticationError);
    // A 401 is an answer, not an instance failure: nginx does not retry it elsewhere.
    const unauthenticated = await fetch(`${base}/generate`, { method: "POST", body: JSON.stringify({ prompt: "Hello", max_tokens: 2 }) });
    expect(unauthenticated.status).toBe(401);
  });

  test("health checks through nginx need no key", async () => {
    const { base } = proxied as Proxied;
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
    expect((await fetch(`${base}/healthz`, { headers: { host: PUBLIC_NAME } })).status).toBe(200);
  });
});
