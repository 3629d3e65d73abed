/**
 * An open model: checkpoint, weights sources and the forward pass, plus sequence states.
 * This is what mod.ts hands to scripts and what every CLI command drives.
 */
import { type Checkpoint, openCheckpoint } from "../checkpoint/checkpoint.ts";
import type { K3Config } from "../config.ts";
import type { TrunkPack } from "../checkpoint/pack.ts";
import { FileReader } from "../io/reader.ts";
import { IoPool } from "../io/stream.ts";
import { ExpertCache } from "../memory/experts.ts";
import type { MemoryPlan } from "../memory/plan.ts";
import type { EvictionPolicy } from "../memory/policy.ts";
import {
  type ExpertSource,
  type HeadWeights,
  readHead,
  ResidentExperts,
  ResidentTrunk,
  type TrunkSource,
} from "../memory/sources.ts";
import { TracedExperts } from "../memory/trace.ts";
import { ObservedTrunk, PackTrunkStore, ShardTrunkStore, StreamedTrunk } from "../memory/trunk.ts";
import { Forward } from "./forward.ts";
import { SequenceState } from "./state.ts";

/** How to open a model. */
export interface OpenOptions {
  /** Bind only the first N layers (diagnostics; the output is then not the model's). */
  layers?: number;
}

/** How to load an opened checkpoint under a memory plan (lib/memory/plan.ts). */
export interface LoadOptions {
  /** The plan to follow; without one every weight is made resident. */
  plan?: MemoryPlan;
  /** Read the trunk from this pack instead of the shards. */
  pack?: TrunkPack;
  /** Check each packed layer's SHA-256 the first time it is read. */
  verifyPack?: boolean;
  /** Expert-cache eviction policy (LRU by default). */
  policy?: EvictionPolicy;
  /** Record every expert request (for --dump-cache-trace). */
  trace?: boolean;
  /** Called as each pinned trunk layer lands (load progress). */
  onPinned?: (done: number, total: number) => void;
  /** Called each time the forward pass asks for a layer (prefill progress). */
  onLayer?: (i: number) => void;
}

/** The streaming machinery of a model loaded under a plan, for the run report. */
export interface StreamParts {
  pool: IoPool;
  trunk: StreamedTrunk;
  cache?: ExpertCache;
  trace?: TracedExperts;
}

/** Background reader threads: at least 2 reads in flight, more gains little on one disk. */
export const IO_READERS = 4;

export class Model {
  readonly forward: Forward;

  private constructor(
    readonly checkpoint: Checkpoint,
    readonly reader: FileReader,
    readonly head: HeadWeights,
    readonly trunk: TrunkSource,
    readonly experts: ExpertSource,
    /** Present when loaded under a plan. */
    readonly stream?: StreamParts,
  ) {
    this.forward = new Forward(this.config, head, trunk, experts, checkpoint.refs.layers.length);
  }

  /** Opens the checkpoint in `dir` and makes every weight resident. */
  static async open(dir: string, options: OpenOptions = {}): Promise<Model> {
    return Model.load(await openCheckpoint(dir, { layers: options.layers }));
  }

  /** Loads an opened checkpoint: resident, or under `options.plan` (pinned + ring, cache). */
  static load(ckpt: Checkpoint, options: LoadOptions = {}): Model {
    const reader = new FileReader(false);
    const closers: { close(): void }[] = [reader];
    try {
      const head = readHead(ckpt.refs, reader);
      closers.push(head);
      if (!options.plan) {
        const trunk = new ResidentTrunk(ckpt.refs, reader);
        closers.push(trunk);
        return new Model(ckpt, reader, head, trunk, new ResidentExperts(ckpt.refs, reader));
      }
      return Model.#loadPlanned(ckpt, reader, head, options, options.plan, closers);
    } catch (e) {
      for (const c of closers.reverse()) c.close();
      throw e;
    }
  }

  static #loadPlanned(
    ckpt: Checkpoint,
    reader: FileReader,
    head: HeadWeights,
    options: LoadOptions,
    plan: MemoryPlan,
    closers: { close(): void }[],
  ): Model {
    const pool = new IoPool(IO_READERS);
    closers.push(pool);
    const store = options.pack ? new PackTrunkStore(options.pack) : new ShardTrunkStore();
    const streamed = new StreamedTrunk(
      ckpt.refs,
      store,
      pool,
      plan.trunk,
      options.verifyPack ?? false,
      options.onPinned,
    );
    closers.push(streamed);
    const cache = plan.experts.mode === "cache"
      ? new ExpertCache(ckpt.refs, pool, plan.experts.slots, plan.experts.slotBytes, options.policy)
      : undefined;
    const experts: ExpertSource = cache ?? new ResidentExperts(ckpt.refs, reader);
    closers.push(experts);
    const trace = options.trace ? new TracedExperts(experts) : undefined;
    const trunk = options.onLayer ? new ObservedTrunk(streamed, options.onLayer) : streamed;
    return new Model(ckpt, reader, head, trunk, trace ?? experts, {
      pool,
      trunk: streamed,
      cache,
      trace,
    });
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
    this.stream?.pool.close();
    this.reader.close();
  }
}
