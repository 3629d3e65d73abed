/**
 * An open model: checkpoint, weights sources and the forward pass, plus sequence states.
 * This is what mod.ts hands to scripts and what every CLI command drives.
 */
import { type Checkpoint, openCheckpoint } from "../checkpoint/checkpoint.ts";
import type { K3Config } from "../checkpoint/config.ts";
import { packCodedSizes, type TrunkPack } from "../layout/pack.ts";
import { FileReader } from "../io/reader.ts";
import { IoPool } from "../io/stream.ts";
import { LoadingExperts } from "../memory/loading_experts.ts";
import { ExpertCache } from "../memory/experts.ts";
import type { MemoryPlan } from "../memory/plan.ts";
import type { EvictionPolicy } from "../memory/policy.ts";
import {
  EmbeddingRows,
  type ExpertSource,
  readBlock,
  ResidentExperts,
  ResidentTrunk,
  trunkBlocks,
  type TrunkSource,
} from "../memory/sources.ts";
import { TracedExperts } from "../memory/trace.ts";
import { ObservedTrunk, PackTrunkStore, ShardTrunkStore, StreamedTrunk } from "../memory/trunk.ts";
import type { ModelRefs } from "../checkpoint/types.ts";
import { Forward, type HeadVectors } from "./forward.ts";
import { SequenceState } from "./state.ts";
import { foldAttnRes, widen } from "./weights.ts";

/** How to open a model. */
interface OpenOptions {
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
  /**
   * Load progress in bytes: the resident trunk blocks (allocated and read), the ring and the
   * expert cache (allocated and pre-faulted), of everything the plan makes resident.
   */
  onLoad?: (done: number, total: number) => void;
  /** Called each time the forward pass starts a layer (prefill progress). */
  onLayer?: (i: number) => void;
}

/** The streaming machinery of a model loaded under a plan, for the run report. */
interface StreamParts {
  pool: IoPool;
  trunk: StreamedTrunk;
  cache?: ExpertCache;
  trace?: TracedExperts;
}

/** Background reader threads: at least 2 reads in flight, more gains little on one disk. */
export const IO_READERS = 4;

/** Reads the final norm and the output AttnRes vectors (a few KB, always resident). */
function readHeadVectors(refs: ModelRefs, reader: FileReader): HeadVectors {
  const small = [refs.norm, refs.outputRes.norm, refs.outputRes.proj];
  const { buffer, offsets } = readBlock(reader, small);
  try {
    const f32 = (i: number) => widen(small[i], buffer.view(offsets[i], small[i].nbytes));
    return { norm: f32(0), outputResSw: foldAttnRes(f32(1), f32(2)) };
  } finally {
    buffer.free();
  }
}

export class Model {
  readonly forward: Forward;

  private constructor(
    readonly checkpoint: Checkpoint,
    readonly reader: FileReader,
    readonly embed: EmbeddingRows,
    readonly trunk: TrunkSource,
    readonly experts: ExpertSource,
    head: HeadVectors,
    /** Present when loaded under a plan. */
    readonly stream?: StreamParts,
    maxTokens?: number,
    chunk?: number,
  ) {
    this.forward = new Forward(
      this.config,
      { trunk, experts, embed, head },
      checkpoint.refs.layers.length,
      maxTokens,
      chunk,
    );
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
      const head = readHeadVectors(ckpt.refs, reader);
      const embed = new EmbeddingRows(ckpt.refs.embed, reader);
      closers.push(embed);
      if (!options.plan) {
        const trunk = new ResidentTrunk(ckpt.refs, reader);
        closers.push(trunk);
        const experts = new ResidentExperts(ckpt.refs, reader);
        return new Model(ckpt, reader, embed, trunk, experts, head);
      }
      return Model.#loadPlanned(ckpt, reader, embed, head, options, options.plan, closers);
    } catch (e) {
      for (const c of closers.reverse()) c.close();
      throw e;
    }
  }

  static #loadPlanned(
    ckpt: Checkpoint,
    reader: FileReader,
    embed: EmbeddingRows,
    head: HeadVectors,
    options: LoadOptions,
    plan: MemoryPlan,
    closers: { close(): void }[],
  ): Model {
    const pool = new IoPool(IO_READERS);
    closers.push(pool);
    // A pack holds its layers in the packed layout: a plan for the shards' would misplace them.
    if (options.pack && plan.placement !== "packed") {
      throw new Error("the memory plan was made for the shards, not for a trunk pack");
    }
    const store = options.pack ? new PackTrunkStore(options.pack) : new ShardTrunkStore();
    const coded = options.pack ? packCodedSizes(options.pack.index) : undefined;
    const blocks = trunkBlocks(ckpt.refs, plan.trunk.pieceBytes, plan.placement, coded);
    const t = plan.trunk, e = plan.experts;
    const resident = blocks.filter((_, b) =>
      b < t.pinned || (b === blocks.length - 1 && t.headResident)
    );
    const total = resident.reduce((a, b) => a + b.bytes, 0) + t.ringSlots * t.slotBytes +
      (e.mode === "cache" ? e.slots * e.slotBytes : 0);
    let done = 0;
    const loaded = (bytes: number) => options.onLoad?.(done += bytes, total);
    const streamed = new StreamedTrunk(
      blocks,
      store,
      pool,
      plan.trunk,
      options.verifyPack ?? false,
      loaded,
    );
    closers.push(streamed);
    const cache = e.mode === "cache"
      ? new ExpertCache(ckpt.refs, pool, e.slots, e.slotBytes, options.policy, loaded)
      : undefined;
    // All experts resident: they load in the background while the first prompt runs.
    const experts: ExpertSource = cache ?? new LoadingExperts(ckpt.refs, pool);
    closers.push(experts);
    const trace = options.trace ? new TracedExperts(experts) : undefined;
    const trunk = options.onLayer ? new ObservedTrunk(streamed, options.onLayer) : streamed;
    return new Model(
      ckpt,
      reader,
      embed,
      trunk,
      trace ?? experts,
      head,
      { pool, trunk: streamed, cache, trace },
      plan.batch,
      plan.chunk,
    );
  }

  /** The checkpoint's configuration. */
  get config(): K3Config {
    return this.checkpoint.config;
  }

  /** Decoder layers this model runs. */
  get layers(): number {
    return this.checkpoint.refs.layers.length;
  }

  /** A fresh sequence (zero KDA state, empty MLA cache) with room for `capacity` positions. */
  newState(capacity = 0): SequenceState {
    return new SequenceState(this.config, capacity);
  }

  /** Frees native memory and closes files. The model is unusable afterwards. */
  close(): void {
    this.embed.close();
    this.trunk.close();
    this.experts.close();
    this.stream?.pool.close();
    this.reader.close();
  }
}
