/**
 * Opens a checkpoint directory: config.json -> K3Config, shard headers -> tensor map,
 * tensor map -> ModelRefs with every shape and dtype checked. No tensor data is read here.
 */

import * as fs from "node:fs/promises";
import * as path from "node:path";
import { type K3Config, readConfig } from "../config.ts";
import { badInput } from "../errors.ts";
import { bindModel } from "./bind.ts";
import { readShards } from "./shards.ts";
import type { ModelRefs, TensorRef } from "./types.ts";

/** An opened checkpoint: its config, bound tensors, every language-model tensor and shard. */
export interface Checkpoint {
  dir: string;
  config: K3Config;
  refs: ModelRefs;
  /** Canonical name -> tensor, for every language-model tensor found (bound or not). */
  tensors: Map<string, TensorRef>;
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
  const absDir = path.resolve(dir);
  await requireDirectory(absDir);
  const configPath = path.join(absDir, "config.json");
  await requireFile(configPath, absDir);
  const config = await readConfig(configPath);
  const { shards, tensors } = await readShards(absDir, config.numLayers);
  const refs = bindModel(config, tensors, options);
  return { dir: absDir, config, refs, tensors, shards };
}

async function requireDirectory(dir: string): Promise<void> {
  const stat = await fs.stat(dir).catch(() => null);
  if (!stat?.isDirectory()) {
    throw badInput(
      `${dir}: checkpoint directory does not exist (pass the folder holding config.json)`,
    );
  }
}

async function requireFile(file: string, dir: string): Promise<void> {
  const stat = await fs.stat(file).catch(() => null);
  if (!stat?.isFile()) {
    throw badInput(`${dir}: no config.json in the checkpoint directory (expected ${file})`);
  }
}
