/** Whether the cross tools a platform check needs are installed (make deps-platforms). */

/** True when every named program is on PATH. */
export function havePrograms(...names: string[]): boolean {
  const dirs = (Deno.env.get("PATH") ?? "").split(":").filter((d) => d);
  return names.every((name) =>
    dirs.some((d) => {
      try {
        return Deno.statSync(`${d}/${name}`).isFile;
      } catch {
        return false;
      }
    })
  );
}

/** Prints the line that says a check was skipped and why, and returns `ignore` for Deno.test. */
export function skipUnless(available: boolean, what: string, install: string): boolean {
  if (!available) console.log(`SKIPPED: ${what}: tools missing (${install})`);
  return !available;
}
