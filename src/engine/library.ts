// Where the kernel library comes from (docs/architecture.md#start-up-and-shutdown).
//
// 1. SERVICE_BUILD_DIR (the caller passes it: src/config.ts owns the
//    environment) holding libloopserve.so: used as is. This is the repo case
//    (`bun run`, `bun test`) and an operator's override.
// 2. Otherwise the copy embedded in the compiled executable (build.ts passes
//    build/*.so to `bun build --compile` as extra entry points, so they show
//    up in Bun.embeddedFiles) is extracted once to a cache directory under a
//    content-hashed name and that file is dlopened.
//
// Why extract ourselves instead of dlopening the embedded path (which Bun
// supports by writing $TMPDIR/.bun-<uid>-<hash>.so): that copy lands in a
// shared, possibly noexec or unwritable TMPDIR on every start, and an
// unwritable TMPDIR fails with a misleading "No such file" from dlopen.
// A cache directory we choose is written once per library version and
// checked here with a clear message.
//
// Two processes starting at once (the templated systemd unit starts several)
// each write a private temp file and rename(2) it over the final name; rename
// is atomic, both files hold the same bytes, so either winner is right and no
// process ever sees a half-written library. An existing file is used only when
// its bytes hash to its name: a truncated or tampered copy is replaced.
//
// No FFI here: this module only finds files; src/engine/binding.ts opens them.
import { createHash, randomBytes } from "node:crypto";
import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, statSync, unlinkSync, writeFileSync } from "node:fs";
import { homedir, tmpdir } from "node:os";
import { join, resolve } from "node:path";

export const CPU_LIBRARY_NAME = "libloopserve.so";
export const CUDA_LIBRARY_NAME = "libloopserve_cuda.so";

export class KernelLibraryError extends Error {}

export type LibrarySource = "build-dir" | "cache" | "extracted";

export interface LocatedLibrary {
  /** Absolute path to dlopen. */
  path: string;
  /** build-dir: found in SERVICE_BUILD_DIR; cache: an earlier extraction; extracted: written now. */
  source: LibrarySource;
}

// ---- cache directories ----

export interface CacheDirOptions {
  /** $XDG_CACHE_HOME, when set (read by src/config.ts). */
  xdgCacheHome?: string | null;
  /** Home directory; default os.homedir(). null skips ~/.cache. */
  home?: string | null;
  /** Last resort; default os.tmpdir() (honours $TMPDIR). */
  tmpDir?: string;
}

/**
 * Cache directories to try, best first: $XDG_CACHE_HOME/loopserve,
 * ~/.cache/loopserve, then $TMPDIR/loopserve-<uid> for hosts where HOME is
 * missing or read-only (systemd's DynamicUser gets HOME=/).
 */
export function cacheDirCandidates(opts: CacheDirOptions = {}): string[] {
  const dirs: string[] = [];
  if (opts.xdgCacheHome) dirs.push(join(resolve(opts.xdgCacheHome), "loopserve"));
  const home = opts.home === undefined ? safeHomedir() : opts.home;
  if (home) dirs.push(join(resolve(home), ".cache", "loopserve"));
  const uid = typeof process.getuid === "function" ? process.getuid() : 0;
  dirs.push(join(resolve(opts.tmpDir ?? tmpdir()), `loopserve-${uid}`));
  return [...new Set(dirs)];
}

function safeHomedir(): string | null {
  try {
    return homedir() || null;
  } catch {
    return null;
  }
}

// ---- embedded copies (compiled executable only) ----

// Inside a compiled executable, embedded files live under this virtual root
// and node:fs reads them synchronously. Under `bun run` the list is empty.
const EMBEDDED_ROOT = "/$bunfs/root";

/** The bytes of the embedded library `name`, or null when not embedded. */
export function embeddedLibraryBytes(name: string): Uint8Array | null {
  const stem = name.replace(/\.so$/, "");
  // build.ts keeps names with --asset-naming=[name].[ext]; accept Bun's
  // default hashed form (libloopserve-1a2b3c4d.so) as well.
  const hashed = new RegExp(`^${stem.replace(/[^A-Za-z0-9]/g, "\\$&")}-[A-Za-z0-9]+\\.so$`);
  const blob = (Bun.embeddedFiles as Array<Blob & { name?: string }>).find(
    (b) => b.name === name || (b.name !== undefined && hashed.test(b.name)),
  );
  if (!blob?.name) return null;
  const path = `${EMBEDDED_ROOT}/${blob.name}`;
  try {
    return new Uint8Array(readFileSync(path));
  } catch (e) {
    throw new KernelLibraryError(`cannot read the embedded ${name} at ${path}: ${(e as Error).message}`);
  }
}

// ---- extraction ----

function sha256(bytes: Uint8Array): string {
  return createHash("sha256").update(bytes).digest("hex");
}

/** Content-hashed file name: libloopserve.so → libloopserve-<16 hex>.so. */
export function cachedLibraryName(name: string, bytes: Uint8Array): string {
  return `${name.replace(/\.so$/, "")}-${sha256(bytes).slice(0, 16)}.so`;
}

/**
 * Makes `dir` (mode 0700 when created) and checks it is ours and not
 * writable by others: whatever is in it gets dlopened. Returns null when
 * usable, else why not.
 */
function unusableDir(dir: string): string | null {
  try {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const st = statSync(dir);
    if (!st.isDirectory()) return "not a directory";
    const uid = typeof process.getuid === "function" ? process.getuid() : st.uid;
    if (st.uid !== uid) return `owned by uid ${st.uid}, not by this process (uid ${uid})`;
    if ((st.mode & 0o022) !== 0) return `writable by group or others (mode ${(st.mode & 0o777).toString(8)})`;
    return null;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code ?? (e as Error).message;
  }
}

/** True when `path` holds exactly `bytes` (same length, same hash). */
function holds(path: string, bytes: Uint8Array, hash: string): boolean {
  try {
    if (statSync(path).size !== bytes.length) return false;
    return sha256(readFileSync(path)) === hash;
  } catch {
    return false;
  }
}

/**
 * Writes `bytes` as `dir/<content-hashed name>` unless an intact copy is
 * already there. Safe against concurrent callers (temp file + rename).
 */
export function extractLibrary(name: string, bytes: Uint8Array, cacheDirs: string[]): LocatedLibrary {
  const fileName = cachedLibraryName(name, bytes);
  const hash = sha256(bytes);
  const tried: string[] = [];
  for (const dir of cacheDirs) {
    const why = unusableDir(dir);
    if (why) {
      tried.push(`${dir} (${why})`);
      continue;
    }
    const path = join(dir, fileName);
    if (holds(path, bytes, hash)) return { path, source: "cache" };
    const tmp = join(dir, `.${fileName}.${process.pid}.${randomBytes(6).toString("hex")}.tmp`);
    try {
      writeFileSync(tmp, bytes, { flag: "wx", mode: 0o755 });
      chmodSync(tmp, 0o755); // the umask may have narrowed the mode
      renameSync(tmp, path);
      return { path, source: "extracted" };
    } catch (e) {
      try {
        unlinkSync(tmp);
      } catch {}
      tried.push(`${dir} (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`);
    }
  }
  throw new KernelLibraryError(
    `cannot extract the embedded ${name}: no writable cache directory (tried ${tried.join("; ")}). ` +
      "Set XDG_CACHE_HOME or TMPDIR to a writable directory on a filesystem that allows executables " +
      "(an unwritable TMPDIR otherwise shows up as a misleading 'No such file' error), " +
      `or SERVICE_BUILD_DIR to a directory holding ${name}.`,
  );
}

// ---- resolution ----

/**
 * Finds `name`: SERVICE_BUILD_DIR first, then the embedded copy (extracted to
 * the first usable cache directory). Null when neither exists; throws
 * KernelLibraryError when an embedded copy exists but cannot be extracted.
 */
export function findKernelLibrary(
  buildDir: string,
  name: string = CPU_LIBRARY_NAME,
  cacheDirs: string[] = cacheDirCandidates(),
): LocatedLibrary | null {
  const inBuildDir = resolve(buildDir, name);
  if (existsSync(inBuildDir)) return { path: inBuildDir, source: "build-dir" };
  const bytes = embeddedLibraryBytes(name);
  if (!bytes) return null;
  return extractLibrary(name, bytes, cacheDirs);
}

/**
 * Path of the kernel library to dlopen: `buildDir/name` when it exists,
 * else the copy embedded in the executable, extracted once to a cache
 * directory. Throws KernelLibraryError saying what was looked for.
 */
export function resolveKernelLibrary(
  buildDir: string,
  name: string = CPU_LIBRARY_NAME,
  cacheDirs: string[] = cacheDirCandidates(),
): string {
  const found = findKernelLibrary(buildDir, name, cacheDirs);
  if (found) return found.path;
  throw new KernelLibraryError(
    `kernel library ${name} not found: SERVICE_BUILD_DIR (${resolve(buildDir)}) has none and this process ` +
      "has no embedded copy (only the compiled dist/loopserve carries one). Build it with `bun run build:lib`, " +
      `or set SERVICE_BUILD_DIR to a directory holding ${name}.`,
  );
}

/**
 * The CUDA library when this build has one (build dir or embedded), else
 * null. Whether a GPU is usable is for the caller to ask the library
 * (ls_cuda_device_count through src/engine/binding.ts).
 */
export function resolveCudaLibrary(buildDir: string, cacheDirs: string[] = cacheDirCandidates()): string | null {
  return findKernelLibrary(buildDir, CUDA_LIBRARY_NAME, cacheDirs)?.path ?? null;
}
