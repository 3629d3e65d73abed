/**
 * `k3 serve` as a child process, for the tests that need the real executable (signals, exit
 * codes, what it prints) rather than the server in this process.
 */
import assert from "node:assert/strict";
import * as path from "node:path";

const repo = path.resolve(import.meta.dirname!, "..", "..");

/** A running `k3 serve`: its base URL (without /v1) and its stderr, whole once it exits. */
export interface ServeChild {
  child: Deno.ChildProcess;
  url: string;
  stderr: Promise<string>;
}

/**
 * Starts `k3 serve ARGS --port 0` (a free loopback port) and resolves once it says where it
 * listens. Its stdout is read on in the background from then on, so a full pipe never blocks
 * it; fails the test, with the child's stderr, when it ends without listening.
 */
export async function startServe(args: string[]): Promise<ServeChild> {
  const child = new Deno.Command(path.join(repo, "k3"), {
    args: ["serve", ...args, "--port", "0"],
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const stderr = new Response(child.stderr).text();
  const stdout = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let out = "";
  while (!/listening on (\S+)\/v1/.test(out)) {
    const { value, done } = await stdout.read();
    if (done) break;
    out += value;
  }
  const url = /listening on (\S+)\/v1/.exec(out)?.[1];
  (async () => {
    while (!(await stdout.read()).done);
  })();
  if (!url) assert.fail(`k3 serve did not start: ${out}${await stderr}`);
  return { child, url, stderr };
}
