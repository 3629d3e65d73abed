/**
 * The README's "Serving" section runs as written: every curl command in it is sent (its path,
 * headers and body, as the shell would pass them) and every TypeScript client example is
 * type-checked and run, each against a server like `k3 serve` with the README's model name and
 * key. The engine is scripted (fixed token lists), so the examples' large max_tokens cost
 * nothing and the tool examples get the tool calls they expect; each client example then runs
 * once more on the tiny model (random answers, no tool call unless forced) and must end with 0.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { CLOSE, OPEN, SEP } from "../../lib/text/chat.ts";
import { tempDir } from "../support/helpers.ts";
import { withServer, xtmlIds } from "../support/serve_helpers.ts";

const repo = path.resolve(import.meta.dirname!, "..", "..");
const README_URL = "http://127.0.0.1:8080";
const KEY = "s3cret";
/** `k3 serve`'s defaults for what the examples touch: the name kimi-k3, a 32768-token context. */
const LIKE_K3_SERVE = { modelNames: ["kimi-k3"], apiKey: KEY, contextTokens: 32768 };

/** The README's Serving section: its fenced code blocks, with their language. */
async function servingBlocks(): Promise<{ lang: string; code: string }[]> {
  const readme = await Deno.readTextFile(path.join(repo, "README.md"));
  const start = readme.indexOf("\n## Serving\n");
  assert.ok(start >= 0, "README.md has a Serving section");
  const end = readme.indexOf("\n## ", start + 1);
  const section = readme.slice(start, end < 0 ? undefined : end);
  return [...section.matchAll(/```(\w+)\n([\s\S]*?)```/g)].map((m) => ({ lang: m[1], code: m[2] }));
}

/**
 * The words of each shell command in `code`, as sh splits them: single quotes literal, double
 * quotes with $VAR expanded from `env`, backslash-newline joins lines, # starts a comment.
 */
function shellCommands(code: string, env: Record<string, string>): string[][] {
  const commands: string[][] = [];
  let words: string[] = [], word: string | null = null, i = 0;
  const endWord = () => {
    if (word !== null) words.push(word);
    word = null;
  };
  const expand = (s: string) => s.replace(/\$(\w+)/g, (_, name) => env[name] ?? "");
  while (i < code.length) {
    const c = code[i];
    if (c === "\\" && code[i + 1] === "\n") i += 2;
    else if (c === "'") {
      const close = code.indexOf("'", i + 1);
      word = (word ?? "") + code.slice(i + 1, close);
      i = close + 1;
    } else if (c === '"') {
      const close = code.indexOf('"', i + 1);
      word = (word ?? "") + expand(code.slice(i + 1, close));
      i = close + 1;
    } else if (c === "#" && word === null) {
      while (i < code.length && code[i] !== "\n") i++;
    } else if (c === "\n") {
      endWord();
      if (words.length > 0) commands.push(words);
      words = [];
      i++;
    } else if (c === " " || c === "\t") {
      endWord();
      i++;
    } else {
      word = (word ?? "") + (c === "$" ? "" : c);
      if (c === "$") {
        const name = /^\w+/.exec(code.slice(i + 1))![0];
        word += env[name] ?? "";
        i += name.length;
      }
      i++;
    }
  }
  endWord();
  if (words.length > 0) commands.push(words);
  return commands;
}

/** A curl command line as a fetch: URL, headers, body (curl -d means POST, form type). */
function curlRequest(words: string[]): { url: string; init: RequestInit } {
  const headers = new Headers();
  let url = "", body: string | undefined;
  for (let i = 1; i < words.length; i++) {
    const w = words[i];
    if (w === "-H") {
      const h = words[++i];
      headers.set(h.slice(0, h.indexOf(":")).trim(), h.slice(h.indexOf(":") + 1).trim());
    } else if (w === "-d") body = words[++i];
    else if (w.startsWith("http")) url = w;
    else assert.match(w, /^-[sN]+$/, `a curl option the test does not know: ${w}`);
  }
  if (body !== undefined && !headers.has("content-type")) {
    headers.set("content-type", "application/x-www-form-urlencoded"); // what curl -d sends
  }
  return { url, init: { method: body === undefined ? "GET" : "POST", headers, body } };
}

Deno.test("README: every curl command of the Serving section is answered 200", async () => {
  const commands = (await servingBlocks()).filter((b) => b.lang === "sh")
    .flatMap((b) => shellCommands(b.code, { K3_API_KEY: KEY }))
    .filter((words) => words[0] === "curl");
  const answer = await xtmlIds(
    `Short.${CLOSE}think${SEP}${OPEN}response${SEP}Paris.<|end_of_msg|>`,
  );
  await withServer({ script: [answer], ...LIKE_K3_SERVE }, async (s) => {
    const paths = new Set<string>();
    for (const words of commands) {
      const { url, init } = curlRequest(words);
      assert.ok(url.startsWith(README_URL), url);
      paths.add(new URL(url).pathname);
      const headers = new Headers(init.headers);
      if (!headers.has("authorization") && !headers.has("x-api-key")) {
        // The README's key-less lines are for a server started without a key.
        headers.set("authorization", `Bearer ${KEY}`);
      }
      const r = await fetch(s.url + url.slice(README_URL.length), { ...init, headers });
      const text = await r.text();
      assert.equal(r.status, 200, `${words.join(" ")}\n-> ${text}`);
      const body = init.body ? JSON.parse(init.body as string) : {};
      if (body.stream) {
        assert.match(text, /data: \[DONE\]\n\n$|event: (response\.completed|message_stop)\n/);
      } else {
        assert.equal(JSON.parse(text).error ?? null, null, text);
      }
    }
    for (const p of ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"]) {
      assert.ok(paths.has(p), `the README shows ${p} with curl`);
    }
  });
});

Deno.test("README: the official-client examples of the Serving section type-check and run", async () => {
  const examples = (await servingBlocks()).filter((b) => b.lang === "ts").map((b) => b.code);
  const dir = tempDir();
  const files = examples.map((code, i) => {
    const file = path.join(dir, `example${i}.ts`);
    Deno.writeTextFileSync(file, code);
    return file;
  });
  const deno = (args: string[]) =>
    new Deno.Command(Deno.execPath(), {
      args: [args[0], "--quiet", "--config", path.join(repo, "deno.json"), ...args.slice(1)],
      stdout: "piped",
      stderr: "piped",
    }).output();
  const checked = await deno(["check", ...files]);
  assert.equal(checked.code, 0, new TextDecoder().decode(checked.stderr));

  // The answers each example expects: a forced get_weather call (chat), a call then an answer
  // (responses), a plain answer (messages).
  const scripts: Record<string, number[][]> = {
    "chat.completions": [
      await xtmlIds(
        `${OPEN}argument key="city" type="string"${SEP}Hangzhou${CLOSE}argument${SEP}` +
          `${CLOSE}call${SEP}${CLOSE}tools${SEP}${CLOSE}message${SEP}<|end_of_msg|>`,
      ),
    ],
    "responses": [
      await xtmlIds(
        `Ask the tool.${CLOSE}think${SEP}${OPEN}response${SEP}${CLOSE}response${SEP}` +
          `${OPEN}tools${SEP}${OPEN}call tool="get_weather" index="1"${SEP}` +
          `${OPEN}argument key="city" type="string"${SEP}Paris${CLOSE}argument${SEP}` +
          `${CLOSE}call${SEP}${CLOSE}tools${SEP}${CLOSE}message${SEP}<|end_of_msg|>`,
      ),
      await xtmlIds(`Sunny.${CLOSE}think${SEP}${OPEN}response${SEP}It is sunny.<|end_of_msg|>`),
    ],
    "messages": [
      await xtmlIds(
        `Plan.${CLOSE}think${SEP}${OPEN}response${SEP}Walk by West Lake.<|end_of_msg|>`,
      ),
    ],
  };
  const expected: Record<string, string> = {
    "chat.completions": "",
    "responses": "It is sunny.",
    "messages": "Walk by West Lake.",
  };
  const seen = new Set<string>();
  for (const [i, code] of examples.entries()) {
    const api = /client\.(chat\.completions|responses|messages)\./.exec(code)?.[1];
    assert.ok(api, `example ${i} calls one of the three APIs`);
    seen.add(api);
    await withServer({ script: scripts[api], ...LIKE_K3_SERVE }, async (s) => {
      Deno.writeTextFileSync(files[i], code.replaceAll(README_URL, s.url));
      const run = await deno(["run", "--allow-net", "--allow-env", "--allow-read", files[i]]);
      const stdout = new TextDecoder().decode(run.stdout).trim();
      assert.equal(run.code, 0, `example ${i}: ${new TextDecoder().decode(run.stderr)}`);
      assert.equal(stdout, expected[api], `example ${i} prints the answer`);
    });
    // The same example on the tiny model, whose answers are random: it still runs to the end.
    await withServer(LIKE_K3_SERVE, async (s) => {
      Deno.writeTextFileSync(files[i], code.replaceAll(README_URL, s.url));
      const run = await deno(["run", "--allow-net", "--allow-env", "--allow-read", files[i]]);
      assert.equal(
        run.code,
        0,
        `example ${i} on the tiny model: ${new TextDecoder().decode(run.stderr)}`,
      );
    });
  }
  assert.deepEqual([...seen].sort(), ["chat.completions", "messages", "responses"]);
});
