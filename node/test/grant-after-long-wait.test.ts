import assert from 'node:assert/strict';
import { RLock } from '../src/index.js';
import { free, suite, until, waiters } from './harness.js';

/** A grant handed over after a wait that lasted longer than its lease: the server holds it for
 * a full lease from the hand-off, so the hold handed to the caller must be live (not lost), held
 * on the server, and freed by its release; its validUntil never later than the server's expiry. */
suite('a grant after a wait longer than its lease', (ctx, test) => {
  const pause = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

  /** The server's lease end of `name` (epoch ms), measured after the reply: a lower bound. */
  const serverEnd = async (name: string): Promise<number> => {
    const pttl = await ctx.admin.pTTL(name);
    return Date.now() + pttl;
  };

  for (const [label, opts] of [['a watchdog hold', {}], ['a hold with leaseMs', { leaseMs: 300 }]] as const) {
    test(`${label}: live, held on the server, freed by its release`, async () => {
      const rl = new RLock(await ctx.client(), { watchdogMs: 300 });
      const name = `long:${label}`;
      const holder = await rl.lock(name).acquire({ leaseMs: 10000 });
      const waiting = rl.lock(name).acquire({ waitMs: 5000, ...opts });
      await until(async () => (await waiters(ctx.admin, name)) === 1, 3000, 'the waiter queued');
      await pause(500); // longer than the waiter's lease (300 ms)
      await holder.release();
      const h = await waiting;
      await pause(30); // a lease-end timer armed in the past would have fired
      assert.equal(h.lost, false, 'the hold handed over is live');
      assert.equal(h.signal.aborted, false);
      assert.deepEqual(Object.keys(await ctx.admin.hGetAll(name)), [h.owner]);
      assert.ok(h.validUntil <= (await serverEnd(name)) + 5, 'validUntil within the server lease');
      await h.release();
      assert.ok(await free(ctx.admin, name), 'its release freed it');
      await rl.close();
    });
  }

  test('a write hold of a read-write lock: live, freed by its release', async () => {
    const rl = new RLock(await ctx.client(), { watchdogMs: 300 });
    const name = 'long:rw';
    const holder = await rl.rwLock(name).write.acquire({ leaseMs: 10000 });
    const waiting = rl.rwLock(name).write.acquire({ waitMs: 5000 });
    await until(async () => ((await ctx.admin.sendCommand(['RWLOCK.WAITERS', name])) as unknown[]).length === 1, 3000, 'the waiter queued');
    await pause(500);
    await holder.release();
    const h = await waiting;
    await pause(30);
    assert.equal(h.lost, false, 'the hold handed over is live');
    await h.release();
    assert.equal(await ctx.admin.exists(name), 0, 'its release freed it');
    await rl.close();
  });

  test('leased permits: live, given back by their release', async () => {
    const rl = new RLock(await ctx.client(), { watchdogMs: 300 });
    const sem = rl.leasedSemaphore('long:sem');
    await sem.trySetPermits(1);
    const first = await sem.acquire({ leaseMs: 10000 });
    const waiting = sem.acquire({ waitMs: 5000 });
    await until(async () => ((await ctx.admin.sendCommand(['RSEM.WAITERS', 'long:sem'])) as unknown[]).length === 1, 3000, 'the waiter queued');
    await pause(500);
    await first.release();
    const p = await waiting;
    await pause(30);
    assert.equal(p.lost, false, 'the permits handed over are live');
    await p.release();
    assert.equal(await sem.available(), 1, 'given back');
    await rl.close();
  });
});
