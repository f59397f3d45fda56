import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { free, suite, until } from './harness.js';

/** The package's directory (its node_modules resolve the drivers for a child process). */
const PACKAGE_DIR = fileURLToPath(new URL('../../', import.meta.url));

/** Runs `body` (an ES module's text, the driver's client as `client`, the package as `rl`) in a
 * child Node process that exits with `process.exit(0)` right after it; resolves to its stdout. */
function child(driver: string, port: number, body: string): Promise<string> {
  const connect =
    driver === 'ioredis'
      ? `import { Redis } from 'ioredis'; const client = new Redis({ port: ${port}, host: '127.0.0.1' });`
      : `import { createClient } from 'redis'; const client = await createClient({ socket: { port: ${port}, host: '127.0.0.1' } }).connect();`;
  const src = `${connect}\nimport * as rl from './dist/esm/index.js';\n${body}\nprocess.exit(0);\n`;
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, ['--input-type=module', '-e', src], { cwd: PACKAGE_DIR });
    let out = '';
    let err = '';
    p.stdout.on('data', (d: Buffer) => (out += d.toString()));
    p.stderr.on('data', (d: Buffer) => (err += d.toString()));
    p.on('exit', (code) => (code === 0 ? resolve(out) : reject(new Error(`child exited ${code}: ${err}`))));
  });
}

suite('exit', (ctx, test, driver) => {
  test('a process that exits holding locks leaves them to their leases: a watchdog hold ends one watchdog lease later', async () => {
    const out = await child(
      driver.name,
      ctx.server.port,
      `const r = new rl.RLock(client, { watchdogMs: 1000 });
       const w = await r.lock('x:watchdog').acquire();
       const l = await r.lock('x:leased').acquire({ leaseMs: 60000 });
       console.log(w.owner + ' ' + l.owner);`,
    );
    const exited = Date.now();
    const [watchdogOwner, leasedOwner] = out.trim().split(' ');
    // Still there right after the exit (no hook releases them), each under its holder's owner id.
    assert.deepEqual(Object.keys(await ctx.admin.hGetAll('x:leased')), [leasedOwner]);
    const pttl = await ctx.admin.pTTL('x:leased');
    assert.ok(pttl > 50000, `the leased hold keeps its lease: ${pttl} ms`);
    // The watchdog stopped with the process: its hold ends within one watchdog lease.
    await until(async () => free(ctx.admin, 'x:watchdog'), 3000, 'the watchdog hold to end');
    assert.ok(Date.now() - exited <= 2500, 'within the watchdog lease (and some slack)');
    assert.ok(watchdogOwner !== undefined && watchdogOwner.length > 0);
    await ctx.admin.sendCommand(['RLOCK.FORCERELEASE', 'x:leased']);
  });
});
