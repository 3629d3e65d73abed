/**
 * k3 command line. `./k3 --help` lists the commands; docs/CLI.md documents flags and exit
 * codes.
 */
import { main } from "./lib/cli/main.ts";

if (import.meta.main) Deno.exit(await main(Deno.args));
