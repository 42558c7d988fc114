// Where a worker thread's entry point is: the path of its file under src/,
// resolved against this module's URL. Run from source, that is the file
// itself; inside the compiled executable every module's import.meta.url is
// the executable's, at the root of its embedded files, and build.ts embeds
// each worker's entry point there under the same path (--root src).

/** The URL of the worker entry point at `path` under src/ ("tokenizer/worker.ts"). */
export function workerUrl(path: string): URL {
  return new URL(`./${path}`, import.meta.url);
}
