/**
 * C never reads past the buffer it is given, whatever TypeScript asks: libk3 checks every
 * read against its own registry of k3_alloc blocks (csrc/k3.h) and refuses with -EFAULT.
 * These calls go straight through the FFI, as a TypeScript bug would.
 */
import assert, { deepStrictEqual as assertEquals } from "node:assert/strict";
import * as path from "node:path";
import { k3 } from "../../ffi/library.ts";
import { NativeBuffer } from "../../ffi/native.ts";
import { tempDir } from "../support/helpers.ts";

const EFAULT = -14n, EINVAL = -22n;

async function fileOf(bytes: number): Promise<string> {
  const file = path.join(tempDir(), "data.bin");
  await Deno.writeFile(file, new Uint8Array(bytes).map((_, i) => i & 0xff));
  return file;
}

function open(file: string, direct = 0): number {
  const fd = k3().k3_open_read(new TextEncoder().encode(file + "\0"), direct);
  assert(fd >= 0, `open ${file}: ${fd}`);
  return fd;
}

Deno.test("k3_pread_full refuses any read that does not fit one k3_alloc block", async () => {
  const lib = k3();
  const fd = open(await fileOf(64 << 10));
  const a = NativeBuffer.alloc(8192), b = NativeBuffer.alloc(8192);
  try {
    // Fits exactly: read. One byte over the block (rounded to its pages): refused, nothing read.
    assertEquals(lib.k3_pread_full(fd, a.pointer, 0n, 8192n), 8192n);
    a.view().fill(0xee);
    assertEquals(lib.k3_pread_full(fd, a.pointer, 0n, 8193n), EFAULT);
    assertEquals(lib.k3_pread_full(fd, a.at(4096), 0n, 4097n), EFAULT);
    assertEquals(lib.k3_pread_full(fd, a.at(8192), 0n, 1n), EFAULT);
    assert(a.view().every((x) => x === 0xee), "a refused read wrote nothing");
    // A whole file into a small block (what a tampered trunk.json asked for).
    assertEquals(lib.k3_pread_full(fd, a.pointer, 0n, 64n << 10n), EFAULT);
    // Memory that libk3 did not allocate, or no longer owns.
    const js = new Uint8Array(8192);
    assertEquals(lib.k3_pread_full(fd, Deno.UnsafePointer.of(js), 0n, 16n), EFAULT);
    assertEquals(lib.k3_pread_full(fd, null, 0n, 16n), EFAULT);
    const freed = NativeBuffer.alloc(4096);
    const stale = freed.pointer;
    freed.free();
    assertEquals(lib.k3_pread_full(fd, stale, 0n, 16n), EFAULT);
    // Negative sizes and offsets, and an end that wraps around the address space.
    assertEquals(lib.k3_pread_full(fd, a.pointer, 0n, -1n), EINVAL);
    assertEquals(lib.k3_pread_full(fd, a.pointer, -4096n, 16n), EINVAL);
    assertEquals(lib.k3_pread_full(fd, a.pointer, 0n, (1n << 63n) - 1n), EFAULT);
    // The next block is not room for the first one's read.
    assertEquals(lib.k3_pread_full(fd, b.at(4096), 0n, 8192n), EFAULT);
  } finally {
    a.free();
    b.free();
    lib.k3_close(fd);
  }
});

Deno.test("k3_io_submit refuses a read past its buffer before queueing it", async () => {
  const lib = k3();
  const file = await fileOf(1 << 20);
  const fd = open(file), direct = open(file, 1);
  const pool = lib.k3_io_pool_new(2)!;
  const buf = NativeBuffer.alloc(3 * 4096);
  try {
    for (const f of [fd, direct]) {
      assertEquals(lib.k3_io_submit(pool, 0, f, buf.pointer, 0n, 4n * 4096n), EFAULT);
      assertEquals(lib.k3_io_submit(pool, 1, f, buf.at(8192), 0n, 8192n), EFAULT);
      assertEquals(
        lib.k3_io_submit(pool, 0, f, Deno.UnsafePointer.of(new Uint8Array(64)), 0n, 8n),
        EFAULT,
      );
      const t = lib.k3_io_submit(pool, 0, f, buf.at(4096), 4096n, 8192n);
      assert(t >= 0n, `a read that fits is queued (${t})`);
      assertEquals(lib.k3_io_wait(pool, t), 8192n);
      assertEquals(buf.view(4096, 1)[0], 0);
    }
    // Tickets that were never handed out.
    assertEquals(lib.k3_io_wait(pool, -1n), EINVAL);
    assertEquals(lib.k3_io_poll(pool, -5n), Number(EINVAL));
    assertEquals(lib.k3_io_wait(pool, 1n << 40n), EINVAL);
  } finally {
    lib.k3_io_pool_free(pool);
    buf.free();
    lib.k3_close(fd);
    lib.k3_close(direct);
  }
});

Deno.test("k3_free waits for reads still landing in the block", async () => {
  const lib = k3();
  const fd = open(await fileOf(4 << 20));
  const pool = lib.k3_io_pool_new(1)!;
  try {
    for (let round = 0; round < 20; round++) {
      const buf = NativeBuffer.alloc(4 << 20);
      const tickets = [0, 1, 2, 3].map((i) =>
        lib.k3_io_submit(pool, 0, fd, buf.at(i << 20), BigInt(i << 20), 1n << 20n)
      );
      buf.free(); // must not return while a queued or running read can still land in it
      for (const t of tickets) assert(lib.k3_io_wait(pool, t) === 1n << 20n);
    }
  } finally {
    lib.k3_io_pool_free(pool);
    lib.k3_close(fd);
  }
});
