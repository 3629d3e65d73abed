/**
 * Opens a checkpoint directory: config.json -> K3Config, shard headers -> compact tensor
 * index, index -> ModelRefs with every shape and dtype checked. No tensor data is read here.
 * At full size (497,052 tensors) this costs well under 150 MB and 2 s (tests/memory/full.test.ts).
 */

import * as path from "node:path";
import { type K3Config, readConfig } from "./config.ts";
import { bindModel } from "./bind.ts";
import { checkModelFile, openModelDir } from "./files.ts";
import { readShards } from "./shards.ts";
import type { ModelRefs } from "./types.ts";

/** An opened checkpoint: its config, bound tensors and shards. */
export interface Checkpoint {
  dir: string;
  config: K3Config;
  refs: ModelRefs;
  /** Language-model tensors found in the shards (bound or not). */
  tensorCount: number;
  /** Absolute paths of the shards read. */
  shards: string[];
}

/**
 * Opens the checkpoint in `dir`.
 * @param options.layers bind only the first N decoder layers
 * @throws K3Error (exit 2) when the directory, config, shards or tensors are not usable
 */
export async function openCheckpoint(
  dir: string,
  options: { layers?: number } = {},
): Promise<Checkpoint> {
  const model = await openModelDir(dir);
  const configPath = path.join(model.dir, "config.json");
  await checkModelFile(model, configPath, "config.json").catch(async (e) => {
    if (await Deno.lstat(configPath).then(() => false, () => true)) {
      (e as Error).message = `${model.dir}: no config.json in the checkpoint directory ` +
        `(expected ${configPath})`;
    }
    throw e;
  });
  const config = await readConfig(configPath);
  const set = await readShards(model, config);
  const refs = bindModel(config, set, options);
  return { dir: model.dir, config, refs, tensorCount: set.count, shards: set.shards };
}
