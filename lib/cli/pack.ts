/**
 * `k3 pack MODEL_DIR TRUNK_DIR`: packs the trunk (every non-expert tensor, one 4096-aligned
 * run per layer) for streaming with `k3 run --trunk TRUNK_DIR`. See lib/checkpoint/pack.ts.
 */
import { parseArgs } from "node:util";
import { openCheckpoint } from "../checkpoint/checkpoint.ts";
import { packTrunk } from "../checkpoint/pack.ts";
import { badInput, ExitCode } from "../errors.ts";
import { ProgressBar } from "../io/progress.ts";
import { formatBytes } from "../report.ts";
import { helpAsked } from "./flags.ts";

const HELP = `usage: k3 pack MODEL_DIR TRUNK_DIR

Copies every non-expert tensor of each layer into TRUNK_DIR/trunk.bin, one 4096-aligned
run per layer in the engine's block layout, and writes TRUNK_DIR/trunk.json (offsets, sizes,
SHA-256 per layer, source shard sizes and mtimes). An interrupted pack resumes from the
last completed layer. Then run with: k3 run MODEL_DIR --trunk TRUNK_DIR ...`;

export async function packCommand(args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args,
    allowPositionals: true,
    strict: true,
    options: { help: { type: "boolean", short: "h" } },
  });
  if (helpAsked(values, HELP)) return ExitCode.ok;
  if (positionals.length !== 2) {
    throw badInput(`usage: k3 pack MODEL_DIR TRUNK_DIR (see k3 pack --help)`);
  }
  const [modelDir, trunkDir] = positionals;
  const ckpt = await openCheckpoint(modelDir);
  const bar = new ProgressBar("pack", 1);
  // Test hook: stop after N layers as if the process had been killed.
  const stop = Deno.env.get("K3_PACK_STOP_AFTER");
  const index = await packTrunk(ckpt, trunkDir, (p) => {
    const gbps = p.seconds > 0 ? p.bytesThisRun / p.seconds / 1e9 : 0;
    const from = p.resumedFrom ? ` (resumed at layer ${p.resumedFrom})` : "";
    bar.update(
      p.layer,
      p.layers,
      `layers ${formatBytes(p.bytesDone)}/${formatBytes(p.bytesTotal)} ${
        gbps.toFixed(2)
      } GB/s${from}`,
    );
  }, stop === undefined ? undefined : Number(stop));
  const largest = Math.max(...index.layers.map((l) => l.bytes));
  console.log(
    `pack: wrote ${trunkDir}/trunk.bin, ${
      formatBytes(index.total_bytes)
    } in ${index.layers.length} layers ` +
      `(largest run ${formatBytes(largest)}, the streaming slot size)`,
  );
  return ExitCode.ok;
}
