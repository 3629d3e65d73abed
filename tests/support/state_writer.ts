/**
 * Helper process for tests/model/state.test.ts (not a test): writes two large synthetic states
 * to one file, A then B then A..., forever, saying "writing X" before and "wrote X" after
 * each write, until it is killed.
 *
 *     deno run -A tests/support/state_writer.ts MODEL_DIR FILE POSITIONS
 */
import { readConfig } from "../../lib/checkpoint/config.ts";
import { SequenceState } from "../../lib/model/state.ts";
import { writeStateFile } from "../../lib/model/state_file.ts";

/** A state whose every value is `mark` and whose tokens are all `mark` (a token id). */
export function markedState(
  config: Awaited<ReturnType<typeof readConfig>>,
  positions: number,
  mark: number,
): SequenceState {
  const s = new SequenceState(config, positions);
  for (const k of s.kda.values()) for (const a of [k.S, k.histQ, k.histK, k.histV]) a.fill(mark);
  for (const m of s.mla.values()) m.cache.fill(mark);
  s.position = positions;
  s.tokens.push(...new Array(positions).fill(mark));
  return s;
}

if (import.meta.main) {
  const [dir, file, positions] = Deno.args;
  const config = await readConfig(`${dir}/config.json`);
  const states = [1, 2].map((mark) => markedState(config, Number(positions), mark));
  const say = (s: string) => Deno.stdout.writeSync(new TextEncoder().encode(s + "\n"));
  for (let i = 0;; i++) {
    const which = i % 2;
    say(`writing ${which + 1}`);
    await writeStateFile(file, states[which], "test-identity");
    say(`wrote ${which + 1}`);
  }
}
