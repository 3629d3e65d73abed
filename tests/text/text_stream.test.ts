/**
 * lib/text/stream.ts: generated ids are split into reasoning, answer and tool calls as they
 * arrive, and stop strings see only the visible text, never markup or a special token's name.
 * References: parseOutput on the decoded text (the string parser), and plain string search.
 */
import assert from "node:assert/strict";
import { CLOSE, END_OF_MSG, OPEN, SEP } from "../../lib/text/chat.ts";
import { parseOutput } from "../../lib/text/parse.ts";
import { type StreamEvent, TextStream, type TextStreamOptions } from "../../lib/text/stream.ts";
import { Tokenizer } from "../../lib/text/tokenizer.ts";
import { tinyModel } from "../support/helpers.ts";

const tokenizer = await Tokenizer.load(await tinyModel({ seed: 5 }));
// The test process keeps one tokenizer; free it when the module's tests are done.
globalThis.addEventListener("unload", () => tokenizer.free());

/** Ids as a model would generate them: control names become special ids, the rest BPE. */
function ids(text: string): number[] {
  return tokenizer.encode(text, { allowSpecial: true });
}

const RESERVED = tokenizer.specialName(tokenizer.vocabSize - 3)!; // "<|reserved_token_…|>"
assert.match(RESERVED, /^<\|reserved_token_\d+\|>$/);

/** Pushes every id; returns the result, the emitted text, the events and the stop flag. */
function run(idList: number[], options: TextStreamOptions) {
  const events: StreamEvent[] = [];
  const stream = new TextStream(tokenizer, { ...options, onEvent: (e) => events.push(e) });
  let emitted = "";
  let stopped = false;
  for (const id of idList) {
    const r = stream.push(id);
    emitted += r.emit;
    if (r.stopped) {
      stopped = true;
      break;
    }
  }
  if (!stopped) emitted += stream.flush();
  return { result: stream.result(), emitted, events, stopped };
}

const TOOLS = `${OPEN}tools${SEP}${OPEN}call tool="get_weather" index="1"${SEP}` +
  `${OPEN}argument key="city" type="string"${SEP}Hangzhou${CLOSE}argument${SEP}` +
  `${OPEN}argument key="days" type="number"${SEP}3${CLOSE}argument${SEP}${CLOSE}call${SEP}` +
  `${CLOSE}tools${SEP}`;

const OUTPUTS = [
  `Let me think.${CLOSE}think${SEP}${OPEN}response${SEP}The answer.${CLOSE}response${SEP}` +
  `${CLOSE}message${SEP}${END_OF_MSG}`,
  `Check.${CLOSE}think${SEP}${OPEN}response${SEP}Calling.${CLOSE}response${SEP}${TOOLS}` +
  `${CLOSE}message${SEP}`,
  `still thinking ${RESERVED} more`,
  `R${CLOSE}think${SEP}${OPEN}response${SEP}a ${OPEN}foo${SEP} b ${RESERVED} c`,
  `R${CLOSE}thi`,
  `R${OPEN}response${SEP}no think close${CLOSE}response${SEP}`,
  `${CLOSE}think${SEP}\n${OPEN}response${SEP}${CLOSE}response${SEP}${TOOLS}`,
  `Grüße 東京 👩‍👩‍👧${CLOSE}think${SEP}${OPEN}response${SEP}مرحبا`,
];

Deno.test("stream: channels and tool calls equal parseOutput of the decoded text", () => {
  for (const text of OUTPUTS) {
    for (const thinking of [true, false]) {
      const { result, emitted, events } = run(ids(text), { chat: { thinking } });
      const expected = parseOutput(text, { thinking });
      assert.equal(emitted, text, "every piece of text comes out, in order");
      assert.equal(result.text, text);
      assert.deepEqual(
        { reasoning: result.reasoning, content: result.content, toolCalls: result.toolCalls },
        {
          reasoning: expected.reasoning,
          content: expected.content,
          toolCalls: expected.toolCalls,
        },
        `${text} / thinking ${thinking}`,
      );
      // The text events of each channel add up to the channel.
      const sum = (channel: string) =>
        events.flatMap((e) => e.type === "text" && e.channel === channel ? [e.text] : []).join("");
      assert.equal(sum("reasoning"), result.reasoning ?? "");
      assert.equal(sum("content"), result.content);
      const calls = events.flatMap((e) => e.type === "toolCall" ? [e.call] : []);
      assert.deepEqual(calls, result.toolCalls);
    }
  }
});

Deno.test("stream: text the model spells with ordinary tokens is never markup", () => {
  // The same characters as a marker, but BPE bytes: part of the answer, not a channel switch.
  const spelled = tokenizer.encode(`${CLOSE}response${SEP} still the answer`, {
    allowSpecial: false,
  });
  const generated = [...ids(`R${CLOSE}think${SEP}${OPEN}response${SEP}A `), ...spelled];
  const { result } = run(generated, { chat: { thinking: true } });
  assert.equal(result.reasoning, "R");
  assert.equal(result.content, `A ${CLOSE}response${SEP} still the answer`);
});

Deno.test("stream: stop strings match the visible answer and reasoning, never markup", () => {
  const chat = { thinking: true };
  const text = `I reason here.${CLOSE}think${SEP}${OPEN}response${SEP}The ${RESERVED} answer` +
    ` is here.${CLOSE}response${SEP}`;
  const cases: { stop: string; content: string; reasoning: string; fired: boolean }[] = [
    // Inside tag names and special-token names: never.
    {
      stop: "spon",
      content: `The ${RESERVED} answer is here.`,
      reasoning: "I reason here.",
      fired: false,
    },
    {
      stop: "think",
      content: `The ${RESERVED} answer is here.`,
      reasoning: "I reason here.",
      fired: false,
    },
    {
      stop: "reserved",
      content: `The ${RESERVED} answer is here.`,
      reasoning: "I reason here.",
      fired: false,
    },
    {
      stop: "|>",
      content: `The ${RESERVED} answer is here.`,
      reasoning: "I reason here.",
      fired: false,
    },
    // Across a marker (end of reasoning + start of the answer): never.
    {
      stop: ".The",
      content: `The ${RESERVED} answer is here.`,
      reasoning: "I reason here.",
      fired: false,
    },
    // In the answer's text and in the reasoning's: yes.
    {
      stop: "is here",
      content: `The ${RESERVED} answer `,
      reasoning: "I reason here.",
      fired: true,
    },
    { stop: "son", content: "", reasoning: "I rea", fired: true },
  ];
  for (const c of cases) {
    const { result, stopped, emitted } = run(ids(text), { chat, stops: [c.stop] });
    assert.equal(stopped, c.fired, c.stop);
    assert.equal(result.content, c.content, c.stop);
    assert.equal(result.reasoning, c.reasoning, c.stop);
    assert.equal(result.stop, c.fired ? c.stop : null);
    assert.equal(result.text, emitted);
    if (c.fired) assert.ok(text.startsWith(emitted) && !emitted.includes(c.stop), c.stop);
  }
  // A stop string split across ordinary tokens still fires.
  const pieces = ["The ans", "wer is", " here"].map((p) => tokenizer.encode(p));
  const split = run(
    [...ids(`R${CLOSE}think${SEP}${OPEN}response${SEP}`), ...pieces.flat()],
    { chat, stops: ["answer is"] },
  );
  assert.equal(split.result.content, "The ");
});

Deno.test("stream: raw output (run, completions): stops never match a special token's name", () => {
  const text = `one ${RESERVED} two${END_OF_MSG}three`;
  const noFire = run(ids(text), { stops: ["reserved", "end_of", "two<", "|"] });
  assert.equal(noFire.stopped, false);
  assert.equal(noFire.result.text, text);
  const fires = run(ids(text), { stops: ["thr"] });
  assert.equal(fires.result.text, `one ${RESERVED} two${END_OF_MSG}`);
  assert.equal(fires.result.stoppedBy, "stop");
});

Deno.test("stream: token roles, reasoning tokens, tool-call limits, cut-off calls, a prefill", () => {
  const generated = ids(
    `R r${CLOSE}think${SEP}${OPEN}response${SEP}A${CLOSE}response${SEP}${TOOLS}`,
  );
  const { events, result } = run(generated, { chat: { thinking: true } });
  const roles = events.flatMap((e) => e.type === "token" ? [e.role] : []);
  assert.equal(roles.length, generated.length);
  const decoded = generated.map((id) => tokenizer.decode([id]));
  roles.forEach((role, i) => {
    if (role === "reasoning" || role === "content") {
      assert.ok(!tokenizer.isSpecial(generated[i]), `token ${i} ${decoded[i]}`);
    }
  });
  assert.equal(
    roles.filter((r) => r === "content").map((_, k) => k).length,
    tokenizer.encode("A").length,
  );
  const thinkClose = ids(`${CLOSE}think${SEP}`).length;
  assert.equal(result.reasoningTokens, tokenizer.encode("R r").length + thinkClose);

  // Stop after the first complete call.
  const twoCalls = ids(
    `${OPEN}tools${SEP}${OPEN}call tool="a" index="1"${SEP}${CLOSE}call${SEP}` +
      `${OPEN}call tool="b" index="2"${SEP}${CLOSE}call${SEP}${CLOSE}tools${SEP}`,
  );
  const one = run(twoCalls, { chat: { thinking: false, maxToolCalls: 1 } });
  assert.equal(one.stopped, true);
  assert.equal(one.result.stoppedBy, "toolCalls");
  assert.deepEqual(one.result.toolCalls.map((c) => c.name), ["a"]);

  // A prefill the prompt ends with: the parser starts inside the call; a cut-off call is kept.
  const prefill = ids(
    `${CLOSE}think${SEP}${OPEN}response${SEP}${CLOSE}response${SEP}${OPEN}tools${SEP}` +
      `${OPEN}call tool="get_weather" index="1"${SEP}`,
  );
  const rest = ids(
    `${OPEN}argument key="city" type="string"${SEP}Paris${CLOSE}argument${SEP}` +
      `${OPEN}argument key="days" type="number"${SEP}2`,
  );
  const events2: StreamEvent[] = [];
  const stream = new TextStream(tokenizer, {
    chat: { thinking: true, keepCutCall: true },
    onEvent: (e) => events2.push(e),
  });
  stream.prime(prefill);
  for (const id of rest) stream.push(id);
  stream.flush();
  const out = stream.result();
  assert.equal(out.reasoning, "");
  assert.equal(out.content, "");
  assert.deepEqual(out.toolCalls, [{
    name: "get_weather",
    arguments: { city: "Paris" },
    index: 0,
  }]);
  assert.match(out.malformed.join("\n"), /cut off/);
  assert.equal(out.text, tokenizer.decode(rest), "the prefill is not output");
  assert.equal(out.reasoningTokens, 0);
});
