/**
 * Fixtures too costly to make once per test file, made once per `make test` run and shared by
 * every test file that needs them: the 4-layer full-size layout writes 4.5 GB (the random
 * embedding, lm_head and routers) and takes half a minute of a loaded machine to make.
 *
 * scripts/test.sh names a folder for them in K3_TEST_FIXTURES, outside the run's $TMPDIR, and
 * removes it when the run ends. Without it (one test file run by hand) a fixture is made in a
 * temp folder that goes when the test module's runtime ends, as tests/support/helpers.ts does.
 *
 * A shared fixture is read only: a test that writes into its model folder must make its own.
 */
import * as path from "node:path";
import { makeFull } from "../../lib/synth/full.ts";

const made = new Map<string, Promise<string>>();

/** The folder shared fixtures live in: the run's, or this module's own temp folder. */
function fixtureRoot(): string {
  const shared = Deno.env.get("K3_TEST_FIXTURES");
  if (shared) return shared;
  const own = Deno.makeTempDirSync({ prefix: "k3-test-fixtures-" });
  globalThis.addEventListener("unload", () => Deno.removeSync(own, { recursive: true }));
  return own;
}

let root: string | undefined;

/**
 * Makes the fixture `name` with `make(dir)` unless this run already has it. It is made in a
 * folder of its own and renamed into place when complete, so a test file never sees half of
 * one, and two test files making it at once (deno test --parallel) both end with the same one.
 */
async function shared(name: string, make: (dir: string) => Promise<unknown>): Promise<string> {
  root ??= fixtureRoot();
  const final = path.join(root, name);
  try {
    await Deno.stat(final);
    return final;
  } catch (e) {
    if (!(e instanceof Deno.errors.NotFound)) throw e;
  }
  const building = await Deno.makeTempDir({ dir: root, prefix: `${name}.partial-` });
  try {
    await make(building);
    await Deno.rename(building, final);
  } catch (e) {
    await Deno.remove(building, { recursive: true });
    // Another test file finished the same fixture first: use that one.
    if (await exists(final)) return final;
    throw e;
  }
  return final;
}

async function exists(p: string): Promise<boolean> {
  try {
    await Deno.stat(p);
    return true;
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return false;
    throw e;
  }
}

/**
 * The full-size layout cut to `layers` layers (`make-tiny --shape full --layers N --data
 * sparse`): every tensor with its released name, shape and dtype; the trunk and the experts
 * are sparse holes, the embedding, lm_head and routers random.
 */
export function sharedFullSparse(layers: number): Promise<string> {
  const name = `full-${layers}-sparse`;
  let dir = made.get(name);
  if (!dir) {
    dir = shared(name, (d) => makeFull(d, { layers, data: "sparse" }));
    made.set(name, dir);
  }
  return dir;
}
