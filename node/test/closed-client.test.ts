import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { suite, until, waiters } from './harness.js';

const PACKAGE_DIR = fileURLToPath(new URL('../../', import.meta.url));

/** Runs `body` in a child Node process that ends on its own (no process.exit): resolves to
 * how long (ms) it lived after printing `done`. */
function lifetimeAfterDone(driver: string, port: number, body: string): Promise<number> {
  const connect =
    driver === 'ioredis'
      ? `import { Redis } from 'ioredis'; const client = new Redis({ port: ${port}, host: '127.0.0.1' }); client.on('error', () => {}); const closeClient = () => client.disconnect();`
      : `import { createClient } from 'redis'; const client = createClient({ socket: { port: ${port}, host: '127.0.0.1' } }); client.on('error', () => {}); await client.connect(); const closeClient = () => client.destroy();`;
  const src = `${connect}\nimport * as rl from './dist/esm/index.js';\n${body}\nconsole.log('done');\n`;
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, ['--unhandled-rejections=strict', '--input-type=module', '-e', src], { cwd: PACKAGE_DIR });
    let doneAt = 0;
    let err = '';
    p.stdout.on('data', (d: Buffer) => {
      if (d.toString().includes('done')) doneAt = Date.now();
    });
    p.stderr.on('data', (d: Buffer) => (err += d.toString()));
    const killer = setTimeout(() => p.kill('SIGKILL'), 20000);
    p.on('exit', (code, sig) => {
      clearTimeout(killer);
      if (doneAt === 0) return reject(new Error(`child exited ${code ?? sig} before done: ${err}`));
      resolve(Date.now() - doneAt);
    });
  });
}

suite('after the client is closed', (ctx, test, driver) => {
  test('an acquire aborted after the user closed the client leaves no timer keeping the process alive once rlock.close() returns', async () => {
    await ctx.admin.sendCommand(['RLOCK.ACQUIRE', 'cc:held', 'someone', '30000']);
    const lived = lifetimeAfterDone(
      driver.name,
      ctx.server.port,
      `const r = new rl.RLock(client, { responseTimeoutMs: 100 });
       const ac = new AbortController();
       const waiting = r.lock('cc:held').acquire({ waitMs: 30000, signal: ac.signal });
       await new Promise((res) => setTimeout(res, 500));
       closeClient();
       ac.abort();
       await waiting.catch(() => {});
       await r.close(200);`,
    );
    await until(async () => (await waiters(ctx.admin, 'cc:held')) === 1, 3000, 'the child waiting').catch(() => {});
    const ms = await lived;
    assert.ok(ms < 3000, `the process ended ${ms} ms after rlock.close() returned`);
    assert.equal(await waiters(ctx.admin, 'cc:held'), 0, 'its wait left the queue');
    await ctx.admin.sendCommand(['RLOCK.FORCERELEASE', 'cc:held']);
  });

  test('a release after the user closed the client leaves no timer keeping the process alive once rlock.close() returns', async () => {
    const lived = lifetimeAfterDone(
      driver.name,
      ctx.server.port,
      `const r = new rl.RLock(client, { responseTimeoutMs: 100 });
       const h = await r.lock('cc:released').acquire({ leaseMs: 30000 });
       closeClient();
       await h.release().catch(() => {});
       await r.close(200);`,
    );
    const ms = await lived;
    assert.ok(ms < 3000, `the process ended ${ms} ms after rlock.close() returned`);
    await ctx.admin.sendCommand(['RLOCK.FORCERELEASE', 'cc:released']);
  });
});
