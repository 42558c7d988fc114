// The shipped nginx example (deploy/nginx.conf) really spreads requests over
// two loopserve instances and fails over when one goes away: two real
// servers, a real nginx on loopback, one server stopped, 50 of 50 requests
// still answered 200.
//
// The example is used as shipped except for its addresses: the instance
// ports 8001/8002 and `listen 80` are replaced by free loopback ports, and
// it is wrapped in the minimal main configuration nginx needs to run
// unprivileged from a temp directory (pid, logs, temp paths).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
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

describe.skipIf(skipReason !== null)("nginx in front of two instances", () => {
  let dir = "";
  let a: TestServer;
  let b: TestServer;
  let proxy: ReturnType<typeof Bun.spawn> | null = null;
  let base = "";
  const log: string[] = [];

  beforeAll(async () => {
    [a, b] = await Promise.all([startServer(), startServer()]);
    const portOf = (s: TestServer) => Number(new URL(s.url).port);
    dir = mkdtempSync(join(tmpdir(), "loopserve-nginx-"));
    chmodSync(dir, 0o755); // nginx's workers (nobody) create their temp dirs here
    const listen = freePort();
    const site = localizeNginxConf(readFileSync(NGINX_CONF, "utf8"), [portOf(a), portOf(b)], listen);
    const conf = join(dir, "nginx.conf");
    writeFileSync(conf, mainConf(dir, site));

    const check = Bun.spawnSync([nginx as string, "-t", "-p", dir, "-e", join(dir, "error.log"), "-c", conf], { stderr: "pipe" });
    if (check.exitCode !== 0) throw new Error(`nginx -t rejects deploy/nginx.conf:\n${check.stderr.toString()}`);

    proxy = Bun.spawn([nginx as string, "-p", dir, "-e", join(dir, "error.log"), "-c", conf], { stdout: "pipe", stderr: "pipe" });
    void (async () => {
      for await (const chunk of proxy.stderr as ReadableStream<Uint8Array>) log.push(new TextDecoder().decode(chunk));
    })();
    base = `http://127.0.0.1:${listen}`;
    const deadline = Date.now() + 10_000;
    for (;;) {
      try {
        if ((await fetch(`${base}/healthz`)).status === 200) break;
      } catch {}
      if (proxy.exitCode !== null || Date.now() > deadline) {
        const errors = existsSync(join(dir, "error.log")) ? readFileSync(join(dir, "error.log"), "utf8") : "";
        throw new Error(`nginx did not start:\n${log.join("")}\n${errors}`);
      }
      await Bun.sleep(50);
    }
  });

  afterAll(async () => {
    if (proxy && proxy.exitCode === null) {
      proxy.kill("SIGQUIT"); // graceful nginx shutdown
      await proxy.exited;
    }
    await Promise.all([a?.stop(), b?.stop()]);
    if (dir) rmSync(dir, { recursive: true, force: true });
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

  test("with one instance stopped, all of 50 requests still succeed", async () => {
    expect(await b.stop()).toBe(0);
    const statuses: number[] = [];
    // Five waves of ten concurrent requests, so several land on the dead
    // instance before nginx marks it failed (and again after fail_timeout).
    for (let wave = 0; wave < 5; wave++) {
      const batch = await Promise.all(Array.from({ length: 10 }, () => generate()));
      for (const r of batch) {
        statuses.push(r.status);
        const body = (await r.json()) as { tokens?: number[] };
        expect(Array.isArray(body.tokens)).toBe(true);
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
