/**
 * Files the user names: output paths are checked before the
 * run, a full or read-only disk is exit 2 naming the path and the OS error, never a trace or
 * a torn history line; a FIFO, /dev/zero or a symlink loop where a file is read is a named
 * error, never a hang; a chat history line that is not a usable message names file and line;
 * one chat at a time per history.
 *
 * Disk faults come from build/libk3fault.so (csrc/tests/fault.c), LD_PRELOADed into the k3
 * child: writes to paths containing K3_FAULT_MATCH fail with K3_FAULT_ERRNO after
 * K3_FAULT_AFTER bytes (checked by hand against a real full tmpfs: the same messages).
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { HistoryWriter, loadHistory, lockHistory } from "../../lib/chat/history.ts";
import { K3Error } from "../../lib/errors.ts";
import { readUserText } from "../../lib/io/files.ts";
import { runK3, tempDir, tinyModel } from "../support/helpers.ts";

const REPO = path.resolve(import.meta.dirname!, "..", "..");
const FAULT = path.join(REPO, "build", "libk3fault.so");
const RUN = ["--ids", "5,17", "--gen", "2"];

/** Env for a k3 child whose writes under `match` fail with `errno` after `after` bytes. */
function faults(match: string, errno = "ENOSPC", after = 0, open = false) {
  return {
    LD_PRELOAD: FAULT,
    K3_FAULT_MATCH: match,
    K3_FAULT_ERRNO: errno,
    K3_FAULT_AFTER: String(after),
    K3_FAULT_OPEN: open ? "1" : "0",
  };
}

/** `k3 ARGS` with `input` on stdin, killed after `ms` (a hang fails the test, not CI). */
async function k3Bounded(args: string[], input = "", ms = 60_000) {
  const child = new Deno.Command(path.join(REPO, "k3"), {
    args,
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(ms),
  }).spawn();
  const w = child.stdin.getWriter();
  await w.write(new TextEncoder().encode(input)).catch(() => {});
  await w.close().catch(() => {});
  const out = await child.output();
  return {
    code: out.code,
    signal: out.signal,
    stderr: new TextDecoder().decode(out.stderr),
  };
}

/** Exit 2 with one `k3:` line matching `says`, and no stack trace. */
function assertBadInput(r: { code: number; stderr: string }, says: RegExp, label: string) {
  assert.equal(r.code, 2, `${label}: ${r.stderr}`);
  assert.match(r.stderr, says, label);
  assert.doesNotMatch(r.stderr, /^\s+at /m, `${label}: a stack trace`);
}

async function entries(dir: string): Promise<string[]> {
  const names: string[] = [];
  for await (const e of Deno.readDir(dir)) names.push(e.name);
  return names.sort();
}

Deno.test("output paths are checked before the run: exit 2 naming the path", async () => {
  const model = await tinyModel({ seed: 5 });
  const dir = tempDir();
  const out = path.join(dir, "out");
  await Deno.mkdir(out);
  await Deno.writeTextFile(path.join(dir, "plain"), "");
  const cases: [string[], RegExp, Record<string, string>?][] = [
    [["--out", "/nonexistent/k3/r.json"], /--out .*: the folder \/nonexistent\/k3 does not exist/],
    [["--out", out], /--out .*out: is a directory; give a file name/],
    [["--dump-logits", "/dev/null"], /--dump-logits \/dev\/null: is not a regular file/],
    [
      ["--dump-cache-trace", path.join(dir, "plain", "sub")],
      /--dump-cache-trace .*plain is not a directory/,
    ],
    [
      ["--out", path.join(out, "r.json")],
      /--out .*r\.json: cannot write in .*out \(No space left on device/,
      faults(`${out}/`),
    ],
    [
      ["--dump-logits", path.join(out, "l.bin")],
      /--dump-logits .*: cannot write in .*\(Read-only file system/,
      faults(`${out}/`, "EROFS", 0, true),
    ],
    [
      ["--save-state", path.join(out, "s.state")],
      /--save-state .*: cannot write in .*\(Permission denied/,
      faults(`${out}/`, "EACCES", 0, true),
    ],
    [
      ["--dump-cache-trace", path.join(out, "trace")],
      /--dump-cache-trace .*: cannot write in .*\(No space left on device/,
      faults(`${out}/`),
    ],
  ];
  for (const [flags, says, env] of cases) {
    const r = await runK3(["run", model, ...RUN, ...flags], env);
    assertBadInput(r, new RegExp(`^k3: ${says.source}.*; nothing was run$`, "m"), flags.join(" "));
    assert.doesNotMatch(r.stderr, /tokens in/, `${flags.join(" ")}: the run happened`);
  }
  assert.deepEqual(await entries(out), [], "no probe or temp file is left");
});

Deno.test("a disk that fills during the run: exit 2 naming the file, no temp file", async () => {
  const model = await tinyModel({ seed: 5 });
  const out = tempDir();
  // The 64 KiB probe before the run passes; the write after it does not.
  const env = faults(`${out}/`, "ENOSPC", 66_000);
  for (const flags of [["--out", "r.json"], ["--dump-logits", "l.bin"], ["--save-state", "s"]]) {
    const file = path.join(out, flags[1]);
    const r = await runK3(["run", model, ...RUN, flags[0], file], env);
    assertBadInput(
      r,
      new RegExp(`^k3: cannot write ${file}: No space left on device`, "m"),
      flags[0],
    );
    assert.match(r.stderr, /tokens in/, "the run itself completed");
  }
  const trace = await runK3(
    ["run", model, ...RUN, "--dump-cache-trace", path.join(out, "t")],
    faults(`${out}/`, "ENOSPC", 65_600),
  );
  assertBadInput(trace, /^k3: cannot write .*expert_trace\.jsonl: No space left/m, "trace");
  assert.deepEqual(await entries(out), ["t"], "no temp file is left");
  assert.deepEqual(await entries(path.join(out, "t")), []);
});

Deno.test("pack and make-tiny on a full disk: exit 2 naming the folder", async () => {
  const model = await tinyModel({ seed: 5 });
  const dir = tempDir();
  const trunk = path.join(dir, "trunk");
  const pack = await runK3(["pack", model, trunk], faults(`${dir}/`, "ENOSPC", 100_000));
  assertBadInput(
    pack,
    new RegExp(`^k3: cannot write ${trunk}(/[^:]+)?: No space left on device`, "m"),
    "pack",
  );
  const tiny = path.join(dir, "tiny");
  const made = await runK3(["make-tiny", tiny], faults(`${dir}/`, "ENOSPC", 100_000));
  assertBadInput(made, /^k3: cannot write .*tiny\/.*: No space left on device/m, "make-tiny");
  for (const d of [trunk, tiny]) {
    assert.deepEqual((await entries(d)).filter((n) => n.endsWith(".tmp")), [], `${d}: temp files`);
  }
});

Deno.test("chat --history on a full disk leaves no torn line", async () => {
  const model = await tinyModel({ seed: 5 });
  const dir = tempDir();
  const history = path.join(dir, "c.jsonl");
  const before = '{"role":"user","content":"a"}\n{"role":"assistant","content":"b"}\n';
  await Deno.writeTextFile(history, before);
  // The write of the new user line is cut after 10 bytes, then the disk is full.
  const r = await k3Bounded(
    ["chat", model, "--history", history, "--max-tokens", "2"],
    "hello there\n",
  );
  assert.equal(r.code, 0, r.stderr); // without faults the turn is recorded
  const grown = await Deno.readTextFile(history);
  await Deno.writeTextFile(history, before);
  const child = new Deno.Command(path.join(REPO, "k3"), {
    args: ["chat", model, "--history", history, "--max-tokens", "2"],
    env: faults(`${dir}/`, "ENOSPC", 10),
    stdin: "piped",
    stderr: "piped",
    stdout: "null",
    signal: AbortSignal.timeout(60_000),
  }).spawn();
  const w = child.stdin.getWriter();
  await w.write(new TextEncoder().encode("hello there\n"));
  await w.close();
  const full = await child.output();
  const stderr = new TextDecoder().decode(full.stderr);
  assertBadInput(
    { code: full.code, stderr },
    /^k3: cannot write .*c\.jsonl: No space left on device .*the message was not recorded/m,
    "history",
  );
  assert.equal(await Deno.readTextFile(history), before, "the history is byte for byte as before");
  assert.ok(grown.startsWith(before) && grown.length > before.length);
});

Deno.test("FIFOs, /dev/zero and symlink loops where k3 reads a file: named errors, no hang", async () => {
  const model = await tinyModel({ seed: 5 });
  const dir = tempDir();
  const fifo = path.join(dir, "fifo");
  const mk = await new Deno.Command("mkfifo", { args: [fifo] }).output();
  assert.equal(mk.code, 0, "mkfifo");
  const loop = path.join(dir, "loop");
  await Deno.symlink(path.join(dir, "loop2"), loop);
  await Deno.symlink(loop, path.join(dir, "loop2"));
  const bad: [string, RegExp][] = [
    [fifo, /is a FIFO \(named pipe\), not a regular file/],
    ["/dev/zero", /is a character device, not a regular file/],
    [loop, /is a symlink loop/],
  ];
  // A copy of the model whose tiktoken.model is each of them.
  const copy = path.join(dir, "model");
  await Deno.mkdir(copy);
  for await (const e of Deno.readDir(model)) {
    if (e.name !== "tiktoken.model") {
      await Deno.copyFile(path.join(model, e.name), path.join(copy, e.name));
    }
  }
  const rank = path.join(copy, "tiktoken.model");
  for (const [target, says] of bad) {
    await Deno.remove(rank).catch(() => {});
    await Deno.symlink(target, rank);
    const r = await k3Bounded(["run", copy, "--prompt", "hi", "--gen", "1"]);
    assertBadInput(
      r,
      new RegExp(`^k3: .*tiktoken\\.model: tokenizer file ${says.source}`, "m"),
      target,
    );

    const p = await k3Bounded(["run", model, "--prompt-file", target, "--gen", "1"]);
    assertBadInput(p, new RegExp(`^k3: ${target}: --prompt-file ${says.source}`, "m"), target);

    const h = await k3Bounded(["chat", model, "--history", target], "hi\n");
    assertBadInput(h, new RegExp(`^k3: ${target}: chat history ${says.source}`, "m"), target);

    const s = await k3Bounded(["run", model, ...RUN, "--load-state", target]);
    assert.equal(s.code, 0, s.stderr);
    assert.match(s.stderr, /warning: --load-state .* not used: /, target);
  }
  // In process: the same refusal, and a file over its limit is refused before it is read.
  const big = path.join(dir, "big.txt");
  await Deno.writeTextFile(big, "x".repeat(2000));
  await assert.rejects(
    readUserText(big, "test file", { limit: 1000 }),
    /big\.txt: test file is 2 KiB, over the 1000 bytes k3 reads for it/,
  );
  assert.equal(
    await readUserText(path.join(dir, "absent"), "x", { limit: 9, missingOk: true }),
    null,
  );
});

Deno.test("history lines that are not usable messages name the file and line", async () => {
  const file = path.join(tempDir(), "h.jsonl");
  const first = '{"role":"user","content":"a"}\n';
  const cases: [string, RegExp][] = [
    ['{"role":"assistant","content":"x","tool_calls":"abc"}', /"tool_calls" must be a list/],
    ['{"role":"assistant","content":"x","tool_calls":[null]}', /tool_calls\[0\] must be an object/],
    ['{"role":"assistant","tool_calls":[{"function":{"name":""}}]}', /function\.name must be/],
    [
      '{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":7}}]}',
      /arguments must be an object or a JSON string/,
    ],
    [
      '{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"[1]"}}]}',
      /arguments must encode a JSON object/,
    ],
    ['{"role":"user","content":5}', /"content" must be a string, a list of parts or null/],
    ['{"role":"user","content":[{"type":"text"}]}', /content\[0\] must be a text part/],
    ['{"role":"user","content":[{"type":"image_url"}]}', /content\[0\] is an image/],
    ['{"role":"user","content":"a","name":3}', /"name" must be a string/],
    ['{"role":"system","content":"a","tools":"x"}', /"tools" must be a list/],
    ['{"role":"assistant","content":"a","interrupted":"yes"}', /"interrupted" must be true/],
    ['{"role":"tool","content":"r"}', /tool message #1 has no "name"/],
    [`{"role":"user","content":${"[".repeat(10_000)}${"]".repeat(10_000)}}`, /deeper than 64/],
    ['{"role":"wizard"}', /"role" must be one of/],
    [`{"role":"user","content":"${"x".repeat(50_000_000)}"}`, /47\.7 MiB, over the 16 MiB/],
  ];
  for (const [line, says] of cases) {
    // Last or not, a whole-JSON line that is not a usable message is an error.
    for (const text of [first + line + "\n", first + line + "\n" + first]) {
      await Deno.writeTextFile(file, text);
      await assert.rejects(loadHistory(file), (e: unknown) => {
        assert.ok(e instanceof K3Error && e.exitCode === 2, String(e));
        assert.match(e.message, /h\.jsonl:2: not a chat message k3 can use \(/, line.slice(0, 60));
        assert.match(e.message, says, line.slice(0, 60));
        return true;
      });
    }
  }
  // From the CLI: exit 2, the file and line, no trace, before the model is loaded.
  const model = await tinyModel({ seed: 5 });
  await Deno.writeTextFile(file, first + cases[1][0] + "\n");
  const r = await k3Bounded(["chat", model, "--history", file], "hi\n");
  assertBadInput(r, /^k3: .*h\.jsonl:2: not a chat message k3 can use/m, "cli");
  assert.doesNotMatch(r.stderr, /memory plan/);
  // A tool message named by its call is fine.
  await Deno.writeTextFile(
    file,
    '{"role":"assistant","tool_calls":[{"id":"c1","function":{"name":"f","arguments":{}}}]}\n' +
      '{"role":"tool","tool_call_id":"c1","content":"r"}\n',
  );
  assert.equal((await loadHistory(file)).messages.length, 2);
});

Deno.test("one chat per history: a second is refused, and the lock goes with the first", async () => {
  const model = await tinyModel({ seed: 5 });
  const dir = tempDir();
  const file = path.join(dir, "h.jsonl");
  // In process: the lock is exclusive across open files, and a file it created is removed
  // again when nothing was written.
  const lock = await lockHistory(file);
  await assert.rejects(lockHistory(file), /another k3 chat is using this history/);
  const r = await k3Bounded(["chat", model, "--history", file], "hi\n");
  assertBadInput(r, /^k3: .*h\.jsonl: another k3 chat is using this history/m, "second chat");
  await lock.release();
  assert.deepEqual(await entries(dir), [], "the empty file made by the lock is gone");

  const held = await lockHistory(file);
  await HistoryWriter.continuing(file, await loadHistory(file)).append({
    role: "user",
    content: "kept",
  });
  await held.release();
  assert.equal((await loadHistory(file)).messages.length, 1, "a written history stays");

  const ok = await k3Bounded(["chat", model, "--history", file, "--max-tokens", "2"], "hi\n");
  assert.equal(ok.code, 0, ok.stderr);
  assert.equal((await loadHistory(file)).messages.length, 3);
});
