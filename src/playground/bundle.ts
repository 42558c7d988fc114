// The playground page, assembled at build time: this module runs as a Bun
// macro (src/http/playground.ts imports it `with { type: "macro" }`), so
// the page's TypeScript is bundled for the browser while the server's code
// is transpiled, and the finished page is inlined into it as a string. A
// compiled executable (bun build.ts) thus carries the page; nothing is read
// or fetched when it is served. The bundler is run as a child process
// because a macro may not call Bun.build while the bundler waits on it.
import { readFileSync } from "node:fs";
import { join } from "node:path";

export interface PlaygroundPage {
  /** The whole page: index.html with style.css and the bundled main.ts inline. */
  html: string;
  /** Content-Security-Policy sources for the inline script and style ('sha256-…'). */
  scriptHash: string;
  styleHash: string;
}

function sha256Source(text: string): string {
  return `'sha256-${new Bun.CryptoHasher("sha256").update(text).digest("base64")}'`;
}

export function playgroundPage(): PlaygroundPage {
  const dir = import.meta.dir;
  const build = Bun.spawnSync([process.execPath, "build", join(dir, "main.ts"), "--target=browser", "--format=esm", "--minify"], {
    stdout: "pipe",
    stderr: "pipe",
  });
  if (build.exitCode !== 0) throw new Error(`playground: bundling ${join(dir, "main.ts")} failed:\n${build.stderr.toString()}`);
  const script = build.stdout.toString();
  // Inline, the script must not close its own element.
  if (script.toLowerCase().includes("</script")) throw new Error("playground: the bundled script contains </script");
  const style = readFileSync(join(dir, "style.css"), "utf8");
  const template = readFileSync(join(dir, "index.html"), "utf8");
  for (const marker of ["<!-- style.css -->", "<!-- main.ts -->"])
    if (!template.includes(marker)) throw new Error(`playground: index.html lacks the ${marker} marker`);
  // Replacement functions: the bundle may contain `$&` and the like, which a replacement string would expand.
  const html = template
    .replace("<!-- style.css -->", () => `<style>${style}</style>`)
    .replace("<!-- main.ts -->", () => `<script type="module">${script}</script>`);
  return { html, scriptHash: sha256Source(script), styleHash: sha256Source(style) };
}
