/**
 * The safetensors container: an 8-byte little-endian header length, a JSON header mapping
 * tensor names to {dtype, shape, data_offsets}, then the raw tensor bytes. This module reads
 * headers strictly (any inconsistency is bad input naming the file and tensor) and writes
 * whole files atomically for the synthetic checkpoint generator.
 */

import * as fs from "node:fs/promises";
import { badInput, ExitCode, K3Error } from "../errors.ts";
import { writeAll, writeAtomically } from "../io/atomic.ts";
import type { DType } from "./types.ts";

/** Bytes per element of every dtype this project knows. */
export const DTYPE_SIZES: Readonly<Record<DType, number>> = {
  BOOL: 1,
  U8: 1,
  I8: 1,
  I16: 2,
  U16: 2,
  I32: 4,
  U32: 4,
  I64: 8,
  U64: 8,
  F16: 2,
  BF16: 2,
  F32: 4,
  F64: 8,
  F8_E4M3: 1,
  F8_E5M2: 1,
};

/** A header larger than this is refused rather than parsed (the real K3 headers are < 1 MB). */
export const MAX_HEADER_BYTES = 100 * 1024 * 1024;

/** One tensor as described by a header; offsets are relative to the data start. */
export interface HeaderEntry {
  name: string;
  dtype: DType;
  shape: number[];
  /** Byte offset relative to the start of the data section. */
  begin: number;
  end: number;
}

/** A parsed header: where the data section starts, the tensors, and `__metadata__`. */
export interface SafetensorsHeader {
  /** Absolute byte offset of the data section (8 + header length). */
  dataStart: number;
  entries: HeaderEntry[];
  metadata: Record<string, string>;
}

/** True when `s` names a dtype this project knows. */
export function isDType(s: unknown): s is DType {
  return typeof s === "string" && Object.hasOwn(DTYPE_SIZES, s);
}

/** Number of bytes a tensor of this dtype and shape occupies. */
export function tensorBytes(dtype: DType, shape: readonly number[]): number {
  return shape.reduce((n, d) => n * d, DTYPE_SIZES[dtype]);
}

/** Reads the 8-byte little-endian header length, refusing values above MAX_HEADER_BYTES. */
export function readHeaderLength(prefix: Uint8Array, file: string, fileSize: number): number {
  if (prefix.length < 8 || fileSize < 8) {
    throw badInput(`${file}: not a safetensors file (shorter than the 8-byte header length)`);
  }
  const view = new DataView(prefix.buffer, prefix.byteOffset, 8);
  const length = view.getBigUint64(0, true);
  if (length > BigInt(MAX_HEADER_BYTES)) {
    throw badInput(
      `${file}: safetensors header length ${length} exceeds the ${MAX_HEADER_BYTES}-byte limit; ` +
        `the file is corrupt or not safetensors`,
    );
  }
  const n = Number(length);
  if (8 + n > fileSize) {
    throw badInput(
      `${file}: safetensors header length ${n} runs past the end of the file (${fileSize} bytes); ` +
        `the file is truncated or corrupt`,
    );
  }
  return n;
}

/**
 * Parses and validates a safetensors header.
 * @param bytes the start of the file: at least 8 + header length bytes
 * @param file the file's path, used in error messages
 * @param fileSize the file's full size, to check that every tensor lies inside it
 */
export function parseSafetensorsHeader(
  bytes: Uint8Array,
  file: string,
  fileSize: number,
): SafetensorsHeader {
  const length = readHeaderLength(bytes, file, fileSize);
  if (bytes.length < 8 + length) {
    throw badInput(`${file}: only ${bytes.length} bytes given for a ${8 + length}-byte header`);
  }
  const json = decodeHeaderJson(bytes.subarray(8, 8 + length), file);
  const dataStart = 8 + length;
  const entries: HeaderEntry[] = [];
  let metadata: Record<string, string> = {};
  for (const [name, value] of Object.entries(json)) {
    if (name === "__metadata__") metadata = checkMetadata(value, file);
    else entries.push(checkEntry(name, value, file));
  }
  checkNoOverlap(entries, file);
  checkFileComplete(entries, dataStart, file, fileSize);
  return { dataStart, entries, metadata };
}

/** Reads just the header of a safetensors file on disk. */
export async function readSafetensorsHeader(file: string): Promise<SafetensorsHeader> {
  const handle = await openForRead(file);
  try {
    const { size } = await handle.stat();
    const prefix = await readExactly(handle, 0, Math.min(8, size));
    const length = readHeaderLength(prefix, file, size);
    const bytes = await readExactly(handle, 0, 8 + length);
    return parseSafetensorsHeader(bytes, file, size);
  } finally {
    await handle.close();
  }
}

async function openForRead(file: string): Promise<fs.FileHandle> {
  try {
    return await fs.open(file, "r");
  } catch (e) {
    throw badInput(`${file}: cannot open safetensors file (${(e as Error).message})`, { cause: e });
  }
}

async function readExactly(
  handle: fs.FileHandle,
  position: number,
  n: number,
): Promise<Uint8Array> {
  const buf = new Uint8Array(n);
  let done = 0;
  while (done < n) {
    const { bytesRead } = await handle.read(buf, done, n - done, position + done);
    if (bytesRead === 0) break;
    done += bytesRead;
  }
  return buf.subarray(0, done);
}

function decodeHeaderJson(bytes: Uint8Array, file: string): Record<string, unknown> {
  let parsed: unknown;
  try {
    parsed = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
  } catch (e) {
    throw badInput(`${file}: safetensors header is not valid JSON (${(e as Error).message})`, {
      cause: e,
    });
  }
  if (!isPlainObject(parsed)) {
    throw badInput(`${file}: safetensors header must be a JSON object`);
  }
  return parsed;
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function checkMetadata(value: unknown, file: string): Record<string, string> {
  if (!isPlainObject(value) || !Object.values(value).every((v) => typeof v === "string")) {
    throw badInput(`${file}: safetensors __metadata__ must be an object of strings`);
  }
  return value as Record<string, string>;
}

function isNonNegativeInt(v: unknown): v is number {
  return typeof v === "number" && Number.isSafeInteger(v) && v >= 0;
}

function checkEntry(name: string, value: unknown, file: string): HeaderEntry {
  const where = `${file}: tensor ${name}`;
  if (!isPlainObject(value)) throw badInput(`${where}: header entry must be an object`);
  const { dtype, shape, data_offsets: offsets } = value;
  if (!isDType(dtype)) {
    throw badInput(`${where}: unknown dtype ${JSON.stringify(dtype)}`);
  }
  if (!Array.isArray(shape) || !shape.every(isNonNegativeInt)) {
    throw badInput(
      `${where}: shape must be a list of non-negative integers, found ${JSON.stringify(shape)}`,
    );
  }
  if (!Array.isArray(offsets) || offsets.length !== 2 || !offsets.every(isNonNegativeInt)) {
    throw badInput(
      `${where}: data_offsets must be [begin, end] non-negative integers, found ${
        JSON.stringify(offsets)
      }`,
    );
  }
  const [begin, end] = offsets as number[];
  if (end < begin) throw badInput(`${where}: data_offsets end ${end} is before begin ${begin}`);
  const expected = tensorBytes(dtype, shape);
  if (end - begin !== expected) {
    throw badInput(
      `${where}: shape [${shape}] x ${dtype} is ${expected} bytes but data_offsets span ${
        end - begin
      } bytes`,
    );
  }
  return { name, dtype, shape: shape as number[], begin, end };
}

/** Refuses a file shorter than its header says (an interrupted download or copy). */
function checkFileComplete(
  entries: HeaderEntry[],
  dataStart: number,
  file: string,
  fileSize: number,
): void {
  const needed = dataStart + entries.reduce((m, e) => Math.max(m, e.end), 0);
  if (fileSize < needed) {
    throw badInput(
      `${file}: truncated: the file is ${fileSize} bytes but its header needs ${needed} bytes; ` +
        `download or copy it again`,
    );
  }
}

function checkNoOverlap(entries: HeaderEntry[], file: string): void {
  const sorted = [...entries].filter((e) => e.end > e.begin).sort((a, b) => a.begin - b.begin);
  for (let i = 1; i < sorted.length; i++) {
    const prev = sorted[i - 1], cur = sorted[i];
    if (cur.begin < prev.end) {
      throw badInput(
        `${file}: tensors ${prev.name} [${prev.begin}, ${prev.end}) and ${cur.name} ` +
          `[${cur.begin}, ${cur.end}) overlap`,
      );
    }
  }
}

/** A caller bug in the writer (not user input). */
function internalError(message: string): K3Error {
  return new K3Error(message, ExitCode.internal);
}

/**
 * Builds a safetensors header for tensors laid back to back in the given order.
 * @returns the full header (8-byte length + JSON padded with spaces to a multiple of 8) and
 *   each tensor's data offset relative to the start of the data section
 */
export function buildHeader(
  entries: { name: string; dtype: DType; shape: number[]; nbytes: number }[],
  metadata?: Record<string, string>,
): { header: Uint8Array; dataOffsets: number[] } {
  const json: Record<string, unknown> = {};
  if (metadata) json.__metadata__ = metadata;
  const dataOffsets: number[] = [];
  let offset = 0;
  for (const e of entries) {
    if (Object.hasOwn(json, e.name)) throw internalError(`buildHeader: duplicate tensor ${e.name}`);
    const expected = tensorBytes(e.dtype, e.shape);
    if (expected !== e.nbytes) {
      throw internalError(
        `buildHeader: ${e.name} shape [${e.shape}] x ${e.dtype} is ${expected} bytes, given ${e.nbytes}`,
      );
    }
    json[e.name] = { dtype: e.dtype, shape: e.shape, data_offsets: [offset, offset + e.nbytes] };
    dataOffsets.push(offset);
    offset += e.nbytes;
  }
  const text = new TextEncoder().encode(JSON.stringify(json));
  const padded = Math.ceil(text.length / 8) * 8;
  const header = new Uint8Array(8 + padded).fill(0x20, 8);
  new DataView(header.buffer).setBigUint64(0, BigInt(padded), true);
  header.set(text, 8);
  return { header, dataOffsets };
}

/**
 * Writes a safetensors file atomically: a temp file in the same directory, fsync, rename.
 * A crash leaves either the old file or the complete new one, never a half-written file.
 */
export async function writeSafetensors(
  file: string,
  tensors: { name: string; dtype: DType; shape: number[]; data: Uint8Array }[],
  metadata?: Record<string, string>,
): Promise<void> {
  const { header } = buildHeader(
    tensors.map((t) => ({ name: t.name, dtype: t.dtype, shape: t.shape, nbytes: t.data.length })),
    metadata,
  );
  await writeAtomically(file, async (out) => {
    await writeAll(out, header);
    for (const t of tensors) await writeAll(out, t.data);
  });
}
