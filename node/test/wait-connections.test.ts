import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { RLock } from '../src/index.js';
import { suite, until, waiters, type Admin } from './harness.js';

/** The package's directory (its node_modules resolve the drivers for a child process). */
const PACKAGE_DIR = fileURLToPath(new URL('../../', import.meta.url));

async function clients(admin: Admin): Promise<number> {
  return Number(/connected_clients:(\d+)/.exec(String(await admin.sendCommand(['INFO', 'clients'])))![1]);
}

/** The client ids of connections blocked in `RLOCK.ACQUIRE`. */
async function blockedIds(admin: Admin): Promise<string[]> {
  const list = String(await admin.sendCommand(['CLIENT', 'LIST']));
  return list
    .split('\n')
    .filter((l) => / cmd=rlock\.acquire\b/.test(l) && / flags=b\b/.test(l))
    .map((l) => /\bid=(\d+)/.exec(l)![1]!);
}

/** The ids of every connection. */
async function ids_(admin: Admin): Promise<string[]> {
  return [...String(await admin.sendCommand(['CLIENT', 'LIST'])).matchAll(/\bid=(\d+)/g)].map((m) => m[1]!);
}

suite('wait connections', (ctx, test, driver) => {
  test('an uncontended acquire opens no wait connection; a wait runs on a kept connection, which the next wait reuses', async () => {
    const rl = new RLock(await ctx.client());
    const a = rl.lock('p:reuse');
    const other = rl.lock('p:reuse');
    await (await a.acquire({ waitMs: 5000 })).release(); // a driver's own lazy connections made
    const base = await clients(ctx.admin);
    for (let i = 0; i < 20; i++) await (await a.acquire({ waitMs: 5000, leaseMs: 10000 })).release();
    assert.equal(await clients(ctx.admin), base, 'twenty uncontended acquires opened no connection');
    assert.equal(rl.idleWaits, 0);

    const ids: string[] = [];
    for (let round = 0; round < 3; round++) {
      const h = await other.acquire({ leaseMs: 10000 });
      const waiting = a.acquire({ waitMs: 10000, leaseMs: 10000 });
      await until(async () => (await blockedIds(ctx.admin)).length === 1, 5000, 'the waiter blocked in the server');
      ids.push((await blockedIds(ctx.admin))[0]!);
      await h.release();
      await (await waiting).release();
      assert.equal(rl.idleWaits, 1, 'the wait connection is kept');
    }
    assert.equal(new Set(ids).size, 1, `one connection served the three waits: ${ids.join(', ')}`);
    assert.equal(await clients(ctx.admin), base + 1);
    await rl.close();
    assert.equal(rl.idleWaits, 0);
    await until(async () => !(await ids_(ctx.admin)).includes(ids[0]!), 5000, 'the kept connection closed with the RLock');
  });

  test('a wait ended by an abort or a timeout closes its connection, ending its wait in the server; it is never kept', async () => {
    const rl = new RLock(await ctx.client());
    const holder = await rl.lock('p:abort').acquire({ leaseMs: 20000 });
    const base = await clients(ctx.admin);
    const ac = new AbortController();
    const waiting = rl.lock('p:abort').acquire({ signal: ac.signal });
    await until(async () => (await waiters(ctx.admin, 'p:abort')) === 1, 5000, 'the waiter queued');
    ac.abort();
    await assert.rejects(waiting);
    assert.equal(rl.idleWaits, 0, 'not kept');
    await until(async () => (await clients(ctx.admin)) === base, 5000, 'its connection closed');
    assert.equal(await waiters(ctx.admin, 'p:abort'), 0);
    // a wait whose time runs out in the server replies: that connection is clean, and kept
    assert.equal(await rl.lock('p:abort').tryAcquire({ waitMs: 50 }), null);
    assert.equal(rl.idleWaits, 1);
    await holder.release();
    await rl.close();
  });

  test('a kept connection killed while idle leaves the pool; the next wait opens another', async () => {
    const rl = new RLock(await ctx.client());
    const holder = await rl.lock('p:kill').acquire({ leaseMs: 20000 });
    const tried = rl.lock('p:kill').tryAcquire({ waitMs: 500 });
    await until(async () => (await blockedIds(ctx.admin)).length === 1, 5000, 'the wait blocked in the server');
    const id = (await blockedIds(ctx.admin))[0]!;
    assert.equal(await tried, null);
    assert.equal(rl.idleWaits, 1);
    await ctx.admin.sendCommand(['CLIENT', 'KILL', 'ID', id]);
    await until(() => rl.idleWaits === 0, 5000, 'the dead connection to leave the pool');
    const waiting = rl.lock('p:kill').acquire({ waitMs: 10000, leaseMs: 10000 });
    await until(async () => (await waiters(ctx.admin, 'p:kill')) === 1, 5000, 'the next wait queued');
    await holder.release();
    await (await waiting).release();
    await rl.close();
  });

  test('kept wait connections do not keep the process alive once the user closes the client', async () => {
    const connect =
      driver.name === 'ioredis'
        ? `import { Redis } from 'ioredis'; const client = new Redis({ port: ${ctx.server.port}, host: '127.0.0.1' }); const end = () => client.disconnect();`
        : `import { createClient } from 'redis'; const client = await createClient({ socket: { port: ${ctx.server.port}, host: '127.0.0.1' } }).connect(); const end = () => client.destroy();`;
    // a wait (kept afterwards), then the user's client closed and no RLock.close(): the
    // process must end by itself
    const src = `${connect}
      import { RLock } from './dist/esm/index.js';
      const rl = new RLock(client);
      const h = await rl.lock('p:exit').acquire({ leaseMs: 10000 });
      const w = rl.lock('p:exit').acquire({ waitMs: 10000, leaseMs: 10000 });
      setTimeout(() => h.release(), 100);
      await (await w).release();
      console.log('kept ' + rl.idleWaits);
      end();`;
    const t0 = Date.now();
    const out = await new Promise<string>((resolve, reject) => {
      const p = spawn(process.execPath, ['--input-type=module', '-e', src], { cwd: PACKAGE_DIR });
      let o = '';
      let e = '';
      const timer = setTimeout(() => p.kill('SIGKILL'), 8000);
      p.stdout.on('data', (d: Buffer) => (o += d.toString()));
      p.stderr.on('data', (d: Buffer) => (e += d.toString()));
      p.on('exit', (code, sig) => {
        clearTimeout(timer);
        if (code === 0) resolve(o);
        else reject(new Error(`child ended ${code ?? sig} (still alive after 8 s when SIGKILL): ${e}`));
      });
    });
    assert.equal(out.trim(), 'kept 1');
    assert.ok(Date.now() - t0 < 8000);
  });
});
