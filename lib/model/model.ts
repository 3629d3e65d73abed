/**
 * An open model: checkpoint, weights sources and the forward pass, plus sequence states.
 * This is what mod.ts hands to scripts and what every CLI command drives.
 */
import { type Checkpoint, openCheckpoint } from "../checkpoint/checkpoint.ts";
import type { K3Config } from "../config.ts";
import { FileReader } from "../io/reader.ts";
import {
  type ExpertSource,
  type HeadWeights,
  readHead,
  ResidentExperts,
  ResidentTrunk,
  type TrunkSource,
} from "../memory/sources.ts";
import { Forward } from "./forward.ts";
import { SequenceState } from "./state.ts";

/** How to open a model. */
export interface OpenOptions {
  /** Bind only the first N layers (diagnostics; the output is then not the model's). */
  layers?: number;
}

export class Model {
  readonly forward: Forward;

  private constructor(
    readonly checkpoint: Checkpoint,
    readonly reader: FileReader,
    readonly head: HeadWeights,
    readonly trunk: TrunkSource,
    readonly experts: ExpertSource,
  ) {
    this.forward = new Forward(this.config, head, trunk, experts, checkpoint.refs.layers.length);
  }

  /** Opens the checkpoint in `dir` and makes every weight resident. */
  static async open(dir: string, options: OpenOptions = {}): Promise<Model> {
    return Model.load(await openCheckpoint(dir, { layers: options.layers }));
  }

  /** Makes an already opened checkpoint's weights resident. */
  static load(ckpt: Checkpoint): Model {
    const reader = new FileReader(false);
    try {
      const head = readHead(ckpt.refs, reader);
      const trunk = new ResidentTrunk(ckpt.refs, reader);
      const experts = new ResidentExperts(ckpt.refs, reader);
      return new Model(ckpt, reader, head, trunk, experts);
    } catch (e) {
      reader.close();
      throw e;
    }
  }

  /** The checkpoint's configuration. */
  get config(): K3Config {
    return this.checkpoint.config;
  }

  /** A fresh sequence (zero KDA state, empty MLA cache) with room for `capacity` positions. */
  newState(capacity = 0): SequenceState {
    return new SequenceState(this.config, capacity);
  }

  /** Frees native memory and closes files. The model is unusable afterwards. */
  close(): void {
    this.head.close();
    this.trunk.close();
    this.experts.close();
    this.reader.close();
  }
}
