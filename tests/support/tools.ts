/**
 * System tools some tests drive (tmux, the aarch64 cross tools, qemu-user). `make test` installs
 * nothing on the system: `make deps-test` installs these. Without one, a test prints a line
 * saying it skipped, what is missing and how to install it. .ci/run installs them and sets
 * K3_REQUIRE_TEST_TOOLS=1, so there a missing tool fails its test instead: CI runs every test.
 */

/** A tool a test needs, how to tell it is here, and the Debian package that brings it. */
export interface SystemTool {
  name: string;
  debianPackage: string;
  present: () => boolean;
}

/** A tool found by running `command args` successfully. */
function runnable(name: string, debianPackage: string, args: string[]): SystemTool {
  return {
    name,
    debianPackage,
    present: () => {
      try {
        return new Deno.Command(name, { args, stdout: "null", stderr: "null" }).outputSync()
          .success;
      } catch {
        return false;
      }
    },
  };
}

export const TMUX = runnable("tmux", "tmux", ["-V"]);

/** What `make test-arm` builds and runs the NEON harness with. */
export const ARM_TOOLS: SystemTool[] = [
  runnable("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu", ["--version"]),
  {
    // The harness links statically: the cross C library, not just the compiler.
    name: "the aarch64 C library (/usr/aarch64-linux-gnu/lib/libc.a)",
    debianPackage: "libc6-dev-arm64-cross",
    present: () => {
      try {
        return Deno.statSync("/usr/aarch64-linux-gnu/lib/libc.a").isFile;
      } catch {
        return false;
      }
    },
  },
  runnable("qemu-aarch64", "qemu-user", ["--version"]),
];

/** True when CI asked for every test to run (a missing tool then fails its test). */
function required(): boolean {
  return Deno.env.get("K3_REQUIRE_TEST_TOOLS") === "1";
}

/** The tools of `tools` that are missing, named with their packages; empty when all are here. */
export function missingTools(tools: SystemTool[]): string {
  return tools.filter((t) => !t.present()).map((t) =>
    `${t.name} (Debian package ${t.debianPackage})`
  )
    .join(", ");
}

/**
 * Whether to skip the test `name` (for Deno.test's `ignore`): true when a tool is missing,
 * after printing a line that says so and how to install it. False whenever
 * K3_REQUIRE_TEST_TOOLS=1: the test runs and {@link requireTools} fails it.
 */
export function skipWithout(name: string, tools: SystemTool[]): boolean {
  const missing = missingTools(tools);
  if (missing === "" || required()) return false;
  console.log(
    `SKIPPED "${name}": missing ${missing}; install the test tools with \`make deps-test\``,
  );
  return true;
}

/** Throws, naming what is missing and how to install it, unless every tool is here. */
export function requireTools(tools: SystemTool[]): void {
  const missing = missingTools(tools);
  if (missing !== "") {
    throw new Error(`missing ${missing}; install the test tools with \`make deps-test\``);
  }
}
