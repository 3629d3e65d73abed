/**
 * `k3 pack MODEL_DIR TRUNK_DIR`: packs the trunk (every non-expert tensor, one 4096-aligned
 * run per layer) for streaming with `k3 run --trunk TRUNK_DIR`. See lib/checkpoint/pack.ts.
 */
import { openCheckpoint } from "../checkpoint/checkpoint.ts";
import { existsSync } from "node:fs";
import * as path from "node:path";
import {
  openTrunkPack,
  PACK_CODECS,
  type PackCodec,
  packCodec,
  packTrunk,
} from "../layout/pack.ts";
import { badInput, ExitCode, K3Error } from "../errors.ts";
import { ProgressBar } from "../io/progress.ts";
import { formatBytes } from "../io/sizes.ts";
import { parseCommand } from "./flags.ts";

/** The codec a pack uses unless --codec says otherwise. */
const DEFAULT_CODEC: PackCodec = "k3c1";

const HELP = `usage: k3 pack [--codec k3c1|none] MODEL_DIR TRUNK_DIR

Copies every non-expert tensor of each layer into TRUNK_DIR/trunk.bin, one 4096-aligned
run per layer in the engine's block layout, and writes TRUNK_DIR/trunk.json (offsets, sizes,
SHA-256 per layer, source shard sizes and mtimes). An interrupted pack resumes from the
last completed layer; a complete pack of the same shards is left as it is ("up to date").
Then run with: k3 run MODEL_DIR --trunk TRUNK_DIR ...

  --codec C   how the BF16 matrices are stored: k3c1 (coded without loss, about 0.70x the
              bytes; docs/CODEC.md) or none (as they are). Default: ${DEFAULT_CODEC}`;

/** The flags `k3 pack` parses (docs/CLI.md lists each; tests/repo/cli_docs.test.ts checks). */
export const OPTIONS = {
  help: { type: "boolean", short: "h" },
  codec: { type: "string" },
} as const;

export async function packCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(args, OPTIONS, HELP);
  if (!parsed) return ExitCode.ok;
  const { positionals, values } = parsed;
  const codec = (values.codec ?? DEFAULT_CODEC) as PackCodec;
  if (!PACK_CODECS.includes(codec)) {
    throw badInput(`--codec ${values.codec}: not one of ${PACK_CODECS.join(", ")}`);
  }
  if (positionals.length !== 2) {
    throw badInput(`usage: k3 pack MODEL_DIR TRUNK_DIR (see k3 pack --help)`);
  }
  const [modelDir, trunkDir] = positionals;
  const ckpt = await openCheckpoint(modelDir);
  // A complete pack of these very shards: nothing to do (a stale or broken one is redone).
  if (existsSync(path.join(trunkDir, "trunk.json"))) {
    try {
      const pack = await openTrunkPack(trunkDir, ckpt);
      if (packCodec(pack.index) !== codec) {
        throw badInput(`${trunkDir} is packed with codec ${packCodec(pack.index)}, not ${codec}`);
      }
      console.log(
        `pack: ${trunkDir} is up to date (${pack.index.layers.length} layers, ` +
          `${formatBytes(pack.index.total_bytes)}, from the same shards); nothing to do`,
      );
      return ExitCode.ok;
    } catch (e) {
      if (!(e instanceof K3Error)) throw e;
      console.error(`pack: ${trunkDir} is not usable, packing again: ${e.message}`);
    }
  }
  const bar = new ProgressBar("pack", 1);
  // Test hook: stop after N layers as if the process had been killed.
  const stop = Deno.env.get("K3_PACK_STOP_AFTER");
  const index = await packTrunk(
    ckpt,
    trunkDir,
    (p) => {
      const gbps = p.seconds > 0 ? p.bytesThisRun / p.seconds / 1e9 : 0;
      const from = p.resumedFrom ? ` (resumed at layer ${p.resumedFrom})` : "";
      bar.update(
        p.layer,
        p.layers,
        `layers ${formatBytes(p.bytesDone)}/${formatBytes(p.bytesTotal)} ${
          gbps.toFixed(2)
        } GB/s${from}`,
      );
    },
    stop === undefined ? undefined : Number(stop),
    codec,
  );
  const largest = Math.max(...index.layers.map((l) => l.bytes));
  console.log(
    `pack: wrote ${trunkDir}/trunk.bin, ${
      formatBytes(index.total_bytes)
    } in ${index.layers.length} layers, codec ${codec} ` +
      `(largest run ${formatBytes(largest)}, the streaming slot size)`,
  );
  return ExitCode.ok;
}
