// The files of a checkpoint directory, read as untrusted input: a checkpoint
// is often downloaded, and `model import-hf` copies what it reads into the
// model file it writes. A name resolves to a file only when, links followed,
// it is a regular file inside the directory: a link out of it, a device
// (/dev/zero grows without end), a FIFO (whose open waits forever for a
// writer), a directory or a link loop is an error naming the file, and a
// missing file is reported as missing, never confused with those. A file is
// opened without following links or waiting (O_NOFOLLOW | O_NONBLOCK, so a
// swap after the check cannot make it block or leave the directory),
// checked again on its descriptor, and read only when its size is within
// the cap its kind has.
import { closeSync, constants, fstatSync, lstatSync, openSync, readSync, realpathSync, type Stats, statSync } from "node:fs";
import { join, sep } from "node:path";
import { ModelFormatError } from "./safetensors.ts";

/** Size caps by file kind, far above any published checkpoint's. */
export const FILE_CAPS = {
  /** config.json, tokenizer_config.json, generation_config.json: a few KiB in practice (chat templates inside, tens). */
  config: 16 * 2 ** 20,
  /** tokenizer.json: 7 MiB for Qwen 2, 33 MiB for the largest vocabularies. */
  tokenizer: 128 * 2 ** 20,
  /** model.safetensors.index.json: a few MiB for the largest sharded models. */
  index: 64 * 2 ** 20,
  /** chat_template.jinja. */
  template: 4 * 2 ** 20,
} as const;

function kindOf(st: Stats): string {
  if (st.isDirectory()) return "a directory";
  if (st.isFIFO()) return "a FIFO";
  if (st.isCharacterDevice() || st.isBlockDevice()) return "a device";
  if (st.isSocket()) return "a socket";
  return "not a regular file";
}

export class CheckpointDir {
  /** The directory with its own links resolved: what "inside" means. */
  private readonly real: string;

  /** ModelFormatError when `dir` is not a directory that can be read. */
  constructor(readonly dir: string) {
    let st: Stats;
    try {
      this.real = realpathSync(dir);
      st = statSync(this.real);
    } catch (e) {
      throw ModelFormatError.about(dir, `cannot open: ${(e as Error).message}`);
    }
    if (!st.isDirectory()) throw ModelFormatError.about(dir, "not a directory (give the checkpoint's directory)");
  }

  /**
   * The path of the regular file `name` in the directory, or null when there
   * is no such entry; ModelFormatError naming it when it is anything else.
   */
  locate(name: string): string | null {
    const path = join(this.dir, name);
    try {
      lstatSync(path);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT") return null;
      throw ModelFormatError.about(path, `cannot open: ${(e as Error).message}`);
    }
    let target: string;
    try {
      target = realpathSync(path);
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code === "ELOOP") throw ModelFormatError.about(path, "is a loop of symbolic links");
      if (code === "ENOENT") throw ModelFormatError.about(path, "is a symbolic link to a file that does not exist");
      throw ModelFormatError.about(path, `cannot open: ${(e as Error).message}`);
    }
    if (!target.startsWith(this.real + sep))
      throw ModelFormatError.about(path, `links outside the checkpoint directory (to ${target}): only files inside it are read`);
    const st = statSync(target);
    if (!st.isFile()) throw ModelFormatError.about(path, `is ${kindOf(st)}, not a regular file`);
    return target;
  }

  /** The text of the regular file `name` (null when there is none), refused unread past `cap` bytes. */
  readText(name: string, cap: number): string | null {
    const path = this.locate(name);
    if (path === null) return null;
    const where = join(this.dir, name);
    let fd: number;
    try {
      fd = openSync(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
    } catch (e) {
      throw ModelFormatError.about(where, `cannot open: ${(e as Error).message}`);
    }
    try {
      const st = fstatSync(fd);
      if (!st.isFile()) throw ModelFormatError.about(where, `is ${kindOf(st)}, not a regular file`);
      if (st.size > cap) throw ModelFormatError.about(where, `is ${st.size} bytes, more than the ${cap} bytes a file of its kind may have`);
      // One byte more than the size it had: a file still growing is caught, not read on and on.
      const buf = Buffer.alloc(st.size + 1);
      let got = 0;
      for (let n = 1; n > 0 && got < buf.length; got += n) n = readSync(fd, buf, got, buf.length - got, got);
      if (got > st.size) throw ModelFormatError.about(where, "grew while it was read");
      try {
        return new TextDecoder("utf-8", { fatal: true }).decode(buf.subarray(0, got));
      } catch {
        throw ModelFormatError.about(where, "is not valid UTF-8 text");
      }
    } finally {
      closeSync(fd);
    }
  }
}
