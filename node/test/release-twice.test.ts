import assert from 'node:assert/strict';
import { RLock, WrongType } from '../src/index.js';
import { suite } from './harness.js';

/** A second release() while the first is in flight must not report success before the first
 * settles: when the server refuses the release, both calls reject (nothing was given back). */
suite('a release called again while one is in flight', (ctx, test) => {
  const both = async (release: () => Promise<void>): Promise<string[]> => {
    const out = await Promise.allSettled([release(), release()]);
    return out.map((r) => (r.status === 'fulfilled' ? 'released' : (r.reason as Error).name));
  };

  test("a lock's hold: both calls get the refusal", async () => {
    const rl = new RLock(await ctx.client());
    const h = await rl.lock('twice:lock').acquire({ leaseMs: 10000 });
    await ctx.admin.del('twice:lock');
    await ctx.admin.set('twice:lock', 'another kind of value');
    assert.deepEqual(await both(() => h.release()), [WrongType.name, WrongType.name]);
    assert.equal(h.released, false);
    await ctx.admin.del('twice:lock');
    await rl.close();
  });

  test('counted permits: both calls get the refusal', async () => {
    const rl = new RLock(await ctx.client());
    const sem = rl.semaphore('twice:sem');
    await sem.trySetPermits(1);
    const p = await sem.acquire({ waitMs: 0 });
    await ctx.admin.del('twice:sem');
    await ctx.admin.hSet('twice:sem', 'f', 'v');
    assert.deepEqual(await both(() => p.release()), [WrongType.name, WrongType.name]);
    await ctx.admin.del('twice:sem');
    await rl.close();
  });

  test('leased permits: both calls get the refusal', async () => {
    const rl = new RLock(await ctx.client());
    const sem = rl.leasedSemaphore('twice:leased');
    await sem.trySetPermits(1);
    const p = await sem.acquire({ waitMs: 0, leaseMs: 10000 });
    await ctx.admin.del('{twice:leased}:timeout');
    await ctx.admin.set('{twice:leased}:timeout', 'another kind of value');
    assert.deepEqual(await both(() => p.release()), [WrongType.name, WrongType.name]);
    await ctx.admin.del(['twice:leased', '{twice:leased}:timeout']);
    await rl.close();
  });
});
