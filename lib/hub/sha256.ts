/**
 * SHA-256 whose state can be saved and resumed in another process (libk3's sha256.c): a
 * download hashes each file in order as its pieces land and keeps the state with its progress
 * record, so a resume hashes only bytes it has not hashed before. Block compression runs on
 * a libk3 thread (a nonblocking FFI call), off the JS thread that drives the sockets.
 */
import { cString, k3 } from "../../ffi/library.ts";

/** A running SHA-256: `bytes` compressed so far (a multiple of 64) and the state words. */
export class Sha256 {
  readonly #state = new Uint32Array(8);
  #bytes = 0;

  private constructor() {}

  /** A hash of nothing yet. */
  static fresh(): Sha256 {
    const h = new Sha256();
    k3().k3_sha256_init(h.#state);
    return h;
  }

  /** A hash resumed from {@link saved}; null when the saved form is malformed. */
  static resume(saved: { state: string; bytes: number }): Sha256 | null {
    const words = saved.state.match(/^[0-9a-f]{64}$/) ? saved.state.match(/.{8}/g)! : null;
    if (!words || !Number.isSafeInteger(saved.bytes) || saved.bytes < 0 || saved.bytes % 64) {
      return null;
    }
    const h = new Sha256();
    words.forEach((w, i) => h.#state[i] = parseInt(w, 16));
    h.#bytes = saved.bytes;
    return h;
  }

  /** Bytes compressed so far. */
  get bytes(): number {
    return this.#bytes;
  }

  /** The state to persist: eight words as hex, and the byte count. */
  saved(): { state: string; bytes: number } {
    const state = [...this.#state].map((w) => w.toString(16).padStart(8, "0")).join("");
    return { state, bytes: this.#bytes };
  }

  /** Compresses `data`, whose length must be a multiple of 64 (every piece but a file's last). */
  async update(data: Uint8Array): Promise<void> {
    if (data.length % 64 !== 0) throw new Error(`sha256: ${data.length} is not a multiple of 64`);
    const rc = await k3().k3_sha256_blocks(this.#state, data, BigInt(data.length));
    if (rc !== 0) throw new Error("sha256: k3_sha256_blocks refused its input");
    this.#bytes += data.length;
  }

  /** The hex digest of everything compressed plus `tail` (any length). Spends the hash. */
  digest(tail: Uint8Array = new Uint8Array(0)): string {
    const out = new Uint8Array(32);
    const total = BigInt(this.#bytes + tail.length);
    if (k3().k3_sha256_final(this.#state, tail, BigInt(tail.length), total, out) !== 0) {
      throw new Error("sha256: k3_sha256_final refused its input");
    }
    return [...out].map((b) => b.toString(16).padStart(2, "0")).join("");
  }
}

/** The compressor libk3 uses: "sha-ni" or "scalar". */
export function sha256Impl(): string {
  return cString(k3().k3_sha256_impl());
}
