/**
 * Subcommand dispatch and the one place where errors become exit codes.
 */
import { ExitCode, K3Error } from "../errors.ts";
import { LibraryLoadError } from "../../ffi/library.ts";
import { VERSION } from "../version.ts";

type Command = (args: string[]) => Promise<number>;

/** Subcommands, loaded on demand so `--help` never touches libk3. */
const commands: Record<string, { summary: string; load: () => Promise<Command> }> = {
  run: {
    summary: "generate from a prompt (--ids, --prompt, --prompt-file)",
    load: async () => (await import("./run.ts")).runCommand,
  },
  chat: {
    summary: "chat on the XTML format, with durable history (--history FILE.jsonl)",
    load: async () => (await import("./chat.ts")).chatCommand,
  },
  "make-tiny": {
    summary: "write a random-weight checkpoint in the released layout",
    load: async () => (await import("./make_tiny.ts")).makeTinyCommand,
  },
  pack: {
    summary: "pack the trunk into one aligned run per layer (for run --trunk)",
    load: async () => (await import("./pack.ts")).packCommand,
  },
  "sim-cache": {
    summary: "replay an expert trace under LRU, Belady and pinned+LRU at several sizes",
    load: async () => (await import("./sim_cache.ts")).simCacheCommand,
  },
  bench: {
    summary: "kernel and model speed against the measured memory bandwidth",
    load: async () => (await import("./bench.ts")).benchCommand,
  },
  doctor: {
    summary: "this machine, and which memory presets fit a checkpoint here",
    load: async () => (await import("./doctor.ts")).doctorCommand,
  },
  demo: {
    summary: "text in, text out on the built-in tiny model",
    load: async () => (await import("./demo.ts")).demoCommand,
  },
  serve: {
    summary: "an OpenAI-compatible HTTP server (chat, completions, streaming, tools)",
    load: async () => (await import("./serve.ts")).serveCommand,
  },
};

export const USAGE = `k3 ${VERSION}: Kimi K3 on the machine you own

usage: k3 <command> [options]        k3 <command> --help for its options

commands:
${Object.entries(commands).map(([n, c]) => `  ${n.padEnd(12)} ${c.summary}`).join("\n")}

exit codes: 0 ok, 1 internal error, 2 bad input or config, 3 over the memory budget,
            4 run invalid (a read or integrity failure), 130 interrupted
`;

/** Runs the CLI; returns the process exit code. */
export async function main(args: string[]): Promise<number> {
  const [name, ...rest] = args;
  if (name === undefined || name === "--help" || name === "-h" || name === "help") {
    console.log(USAGE);
    return name === undefined ? ExitCode.badInput : ExitCode.ok;
  }
  if (name === "--version" || name === "-V") {
    console.log(`k3 ${VERSION}`);
    return ExitCode.ok;
  }
  const command = Object.hasOwn(commands, name) ? commands[name] : undefined;
  if (!command) {
    console.error(`k3: unknown command '${name}'\n\n${USAGE}`);
    return ExitCode.badInput;
  }
  try {
    return await (await command.load())(rest);
  } catch (e) {
    return reportError(e);
  }
}

/** Prints an error the way users should see it and returns its exit code. */
export function reportError(e: unknown): number {
  if (e instanceof K3Error) {
    console.error(`k3: ${e.message}`);
    return e.exitCode;
  }
  if (e instanceof LibraryLoadError) {
    console.error(`k3: ${e.message}`);
    return ExitCode.badInput;
  }
  // parseArgs errors: unknown flags, missing values.
  if (e instanceof TypeError && "code" in e && String(e.code).startsWith("ERR_PARSE_ARGS")) {
    console.error(`k3: ${e.message}`);
    return ExitCode.badInput;
  }
  console.error("k3: internal error (please report):", e);
  return ExitCode.internal;
}
