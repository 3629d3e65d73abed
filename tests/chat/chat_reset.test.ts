/**
 * `/reset` in `k3 chat --history FILE.jsonl` goes on recording: the new conversation is
 * written to FILE-2.jsonl (then FILE-3.jsonl, ...) beside the first, named on stderr at once,
 * with its own state file; the first file keeps the earlier conversation as it was. Recording
 * that silently stopped would lose the turns a user asked to keep.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { nextHistoryFile } from "../../lib/chat/history.ts";
import { ChatChild } from "../support/chat_child.ts";
import { tempDir, tinyModel } from "../support/helpers.ts";

const read = async (file: string) =>
  (await Deno.readTextFile(file)).split("\n").filter((l) => l !== "").map((l) => JSON.parse(l));

Deno.test("k3 chat: /reset records the new conversation to a new history file it names", async () => {
  const dir = await tinyModel({ seed: 11 });
  const folder = tempDir();
  const first = path.join(folder, "talk.jsonl");
  const child = new ChatChild([
    dir,
    "--history",
    first,
    "--system",
    "Be brief.",
    "--thinking",
    "off",
    "--max-tokens",
    "4",
  ]);
  for (const line of ["Hello there!", "/reset", "What is 2+2?", "/reset", "Bye"]) {
    await child.send(line);
  }
  assert.equal(await child.finish(), 0, child.stderr);
  const second = path.join(folder, "talk-2.jsonl"), third = path.join(folder, "talk-3.jsonl");
  assert.match(
    child.stderr,
    new RegExp(
      `new conversation \\(the system prompt is kept\\), recorded to ${second}; ${first} keeps ` +
        `the earlier one \\(continue this one later with --history ${second}\\)`,
    ),
  );
  assert.ok(child.stderr.includes(`recorded to ${third}; ${second} keeps`), child.stderr);
  const roles = (messages: { role: string; content: string }[]) =>
    messages.map((m) => m.role === "assistant" ? "assistant" : `${m.role}: ${m.content}`);
  assert.deepEqual(roles(await read(first)), [
    "system: Be brief.",
    "user: Hello there!",
    "assistant",
  ]);
  assert.deepEqual(roles(await read(second)), [
    "system: Be brief.",
    "user: What is 2+2?",
    "assistant",
  ]);
  assert.deepEqual(roles(await read(third)), ["system: Be brief.", "user: Bye", "assistant"]);
  // Each conversation's state is beside its own history.
  for (const file of [first, second, third]) assert.ok((await Deno.stat(`${file}.state`)).size > 0);
});

Deno.test("the next history file: numbered beside the first, past names taken; locked", async () => {
  const folder = tempDir();
  const talk = path.join(folder, "talk.jsonl");
  await Deno.writeTextFile(path.join(folder, "talk-2.jsonl"), "");
  const a = await nextHistoryFile(talk);
  assert.equal(a.file, path.join(folder, "talk-3.jsonl"));
  const b = await nextHistoryFile(path.join(folder, "talk-3.jsonl"));
  assert.equal(b.file, path.join(folder, "talk-4.jsonl"));
  const c = await nextHistoryFile(path.join(folder, "notes"));
  assert.equal(c.file, path.join(folder, "notes-2"));
  // Unused, they go with their locks: nothing is left behind.
  for (const { lock } of [a, b, c]) await lock.release();
  assert.deepEqual([...Deno.readDirSync(folder)].map((e) => e.name), ["talk-2.jsonl"]);
});
