/**
 * Memory owned by libk3: page-aligned, pre-faulted, freed explicitly. Weights live here so
 * that O_DIRECT reads can land in them and kernels can take them as plain pointers.
 */
import { k3 } from "./library.ts";

/** A block of native memory. Views made from it are invalid after {@link free}. */
export class NativeBuffer {
  #pointer: Deno.PointerObject | null;

  private constructor(pointer: Deno.PointerObject, readonly bytes: number) {
    this.#pointer = pointer;
  }

  /** Allocates `bytes` (rounded up to a page), pre-faulted. Throws when the OS refuses. */
  static alloc(bytes: number): NativeBuffer {
    const p = k3().k3_alloc(BigInt(Math.max(1, bytes)));
    if (p === null) throw new Error(`cannot allocate ${bytes} bytes of native memory`);
    return new NativeBuffer(p, bytes);
  }

  /** Base pointer. Throws after free. */
  get pointer(): Deno.PointerObject {
    if (this.#pointer === null) throw new Error("NativeBuffer used after free");
    return this.#pointer;
  }

  /** Pointer `offset` bytes into the block. */
  at(offset: number): Deno.PointerObject {
    if (offset < 0 || offset > this.bytes) {
      throw new RangeError(`offset ${offset} outside a ${this.bytes}-byte buffer`);
    }
    return offset === 0 ? this.pointer : Deno.UnsafePointer.offset(this.pointer, offset)!;
  }

  /** A zero-copy byte view of [offset, offset + length). */
  view(offset = 0, length = this.bytes - offset): Uint8Array {
    return new Uint8Array(Deno.UnsafePointerView.getArrayBuffer(this.pointer, length, offset));
  }

  /** Returns the memory to the OS. Idempotent. */
  free(): void {
    if (this.#pointer !== null) k3().k3_free(this.#pointer);
    this.#pointer = null;
  }
}

/** Pointer to the start of a typed array's memory (for kernels that take `pointer`). */
export function pointerOf(a: ArrayBufferView): Deno.PointerObject {
  const p = Deno.UnsafePointer.of(a as unknown as BufferSource);
  if (p === null) throw new Error("cannot take the address of an empty array");
  return p;
}
