import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { createClient } from 'redis';
import { LockLost, LockTimeout, RLock, type Hold } from '../src/index.js';
import { drivers, free, hash, Server, until, waiters, type Admin, type Driver } from './harness.js';

/** A watchdog lease long enough for a restart to fit in it (renewed every 2 s). */
const WATCHDOG_MS = 6000;

/**
 * Runs `fn` against a server of its own started with `args`, with a connected client of
 * `driver` made into an RLock and an admin client (both reconnect after a restart); prints the
 * server's log when it fails, stops everything at the end.
 */
async function withServer(driver: Driver, args: string[], fn: (s: Server, rl: RLock, admin: Admin) => Promise<void>): Promise<void> {
  const server = new Server(args);
  let closeClient = async (): Promise<void> => {};
  let admin: Admin | undefined;
  let rl: RLock | undefined;
  try {
    await server.start();
    const c = await driver.connect(server.port);
    closeClient = c.close;
    rl = new RLock(c.client, { watchdogMs: WATCHDOG_MS, responseTimeoutMs: 500 });
    admin = createClient({ socket: { host: '127.0.0.1', port: server.port } });
    admin.on('error', () => {});
    await admin.connect();
    await fn(server, rl, admin);
  } catch (e) {
    process.stderr.write(`\n--- server log (restart, ${driver.name}) ---\n${server.log()}\n---\n`);
    throw e;
  } finally {
    await rl?.close(1000).catch(() => {});
    await closeClient().catch(() => {});
    if (admin?.isOpen) admin.destroy();
    await server.stop();
  }
}

/** Whether `p` has settled (after the turns of the event loop already due). */
async function settled(p: Promise<unknown>): Promise<boolean> {
  let done = false;
  p.then(() => (done = true), () => (done = true));
  await new Promise((r) => setImmediate(r));
  return done;
}

for (const driver of drivers) {
  describe(`server restart (${driver.name})`, () => {
    it('a watchdog hold whose key survives a restart (AOF) keeps renewing; a waiter is asked again and served within its wait, a short one times out holding nothing', async () => {
      await withServer(driver, ['--appendonly', 'yes', '--appendfsync', 'always'], async (server, rl, admin) => {
        const a = await rl.lock('s:kept').acquire();
        const w = rl.lock('s:kept').acquire({ waitMs: 20000, leaseMs: 20000 });
        const short = rl.lock('s:kept').acquire({ waitMs: 3000, leaseMs: 20000 });
        w.catch(() => {});
        short.catch(() => {});
        await until(async () => (await waiters(admin, 's:kept')) === 2, 5000, 'two waiters');

        await server.crash();
        assert.equal(await settled(w), false, 'the waiter is not answered by a dead server');
        await server.start();
        await until(async () => admin.isReady, 5000, 'the admin client reconnected');
        assert.deepEqual(await hash(admin, 's:kept'), { [a.owner]: '1' }, 'the hold\'s key survived the restart');

        // a renewal after the restart confirms the surviving key: the hold's validity moves on
        const before = a.validUntil;
        await until(() => a.validUntil > before + 1000, 3 * WATCHDOG_MS, 'a renewal after the restart');
        assert.equal(a.lost, false);
        assert.equal(a.signal.aborted, false);

        // the waiters' connections died with the server: they ask again, queued anew
        await until(async () => (await waiters(admin, 's:kept')) >= 1, 5000, 'a waiter queued again');
        await assert.rejects(short, LockTimeout, 'the short waiter times out while the hold lives');
        await until(async () => (await waiters(admin, 's:kept')) === 1, 5000, 'only the long waiter queued');
        assert.deepEqual(await hash(admin, 's:kept'), { [a.owner]: '1' }, 'the timed-out waiter holds nothing');

        await a.release();
        const h: Hold = await w;
        assert.deepEqual(await hash(admin, 's:kept'), { [h.owner]: '1' }, 'the long waiter is served within its wait');
        await h.release();
        assert.ok(await free(admin, 's:kept'));
      });
    });

    it('a watchdog hold whose key a restart lost (no persistence) is aborted with LockLost at its next renewal; the waiter takes the lock, and nobody else holds it', async () => {
      await withServer(driver, [], async (server, rl, admin) => {
        const a = await rl.lock('s:lost').acquire();
        const w = rl.lock('s:lost').acquire({ waitMs: 20000, leaseMs: 20000 });
        w.catch(() => {});
        await until(async () => (await waiters(admin, 's:lost')) === 1, 5000, 'the waiter');

        await server.crash();
        await server.start();
        await until(async () => admin.isReady, 5000, 'the admin client reconnected');

        const h: Hold = await w; // asked again, it finds the lock free
        assert.deepEqual(await hash(admin, 's:lost'), { [h.owner]: '1' }, 'the waiter holds it, alone');
        await until(() => a.lost, WATCHDOG_MS, 'the lost hold found at its next renewal');
        assert.ok(a.signal.aborted);
        assert.ok(a.signal.reason instanceof LockLost, String(a.signal.reason));
        assert.match((a.signal.reason as Error).message, /renewal found it gone/);
        await assert.rejects(a.release(), LockLost, 'releasing the lost hold says so');
        assert.deepEqual(await hash(admin, 's:lost'), { [h.owner]: '1' }, 'and leaves the waiter\'s hold alone');
        await h.release();
        assert.ok(await free(admin, 's:lost'));
      });
    });
  });
}
