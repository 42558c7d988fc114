// bench:peer outlives a crashing llama.cpp (bench/peer/llama.ts firstThatRuns):
// a tool killed by a signal is run the next way (repack off), and one that
// fails every way becomes a marked cell instead of ending the benchmark.
import { expect, test } from "bun:test";
import { firstThatRuns } from "../../bench/peer/llama.ts";
import { PeerBenchError, run } from "../../bench/peer/system.ts";

const segv = () => run(["sh", "-c", "kill -SEGV $$"]).stdout;
const ok = () => run(["sh", "-c", "echo 123"]).stdout.trim();

test("a crash is taken the next way, and every way crashing is a marked result naming each way's signal", () => {
  const logged: string[] = [];
  const log = (s: string) => logged.push(s);
  expect(firstThatRuns("tool", [["", ok], ["repack off", segv]], log)).toEqual({ value: "123", way: "" });
  expect(firstThatRuns("tool", [["", segv], ["repack off", ok]], log)).toEqual({ value: "123", way: "repack off" });
  expect(logged).toEqual(["tool failed (default: signal SIGSEGV)"]);
  expect(firstThatRuns("tool", [["", segv], ["repack off", segv]], log)).toEqual({ crashed: "default: signal SIGSEGV, repack off: signal SIGSEGV" });
  // Anything but a tool's failure is a bug of the benchmark and still throws.
  expect(() =>
    firstThatRuns("tool", [["", () => { throw new TypeError("bug"); }]], log),
  ).toThrow(TypeError);
  expect(() => run(["sh", "-c", "exit 3"])).toThrow(PeerBenchError);
});
