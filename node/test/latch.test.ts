import assert from 'node:assert/strict';
import { RLock } from '../src/index.js';
import { suite, until, type Admin } from './harness.js';

async function awaiters(admin: Admin): Promise<number> {
  return (String(await admin.sendCommand(['CLIENT', 'LIST'])).match(/cmd=rlatch\.await/g) ?? []).length;
}

suite('latch', (ctx, test) => {
  test('trySetCount sets once, countDown counts to zero, count reads it (Redisson\'s layout)', async () => {
    const rl = new RLock(await ctx.client());
    const latch = rl.latch('c:basic');
    assert.equal(await latch.trySetCount(3), true);
    assert.equal(await latch.trySetCount(5), false);
    assert.equal(await ctx.admin.get('c:basic'), '3');
    assert.equal(await latch.countDown(), 2);
    assert.equal(await latch.count(), 2);
    assert.equal(await latch.await({ waitMs: 0 }), false);
    assert.equal(await latch.countDown(5), 0);
    assert.equal(await ctx.admin.exists('c:basic'), 0);
    assert.equal(await latch.await({ waitMs: 0 }), true);
    await rl.close();
  });

  test('await waits in the server; every awaiter is answered when the latch opens', async () => {
    const rl = new RLock(await ctx.client());
    const latch = rl.latch('c:open');
    await latch.trySetCount(2);
    const waits = [latch.await(), latch.await({ waitMs: 10000 }), rl.latch('c:open').await({ waitMs: 10000 })];
    await until(async () => (await awaiters(ctx.admin)) === 3, 5000, 'three awaiters in the server');
    await latch.countDown();
    assert.equal(await awaiters(ctx.admin), 3, 'still closed at 1');
    await latch.countDown();
    assert.deepEqual(await Promise.all(waits), [true, true, true]);
    await rl.close();
  });

  test('await returns false when waitMs passes first; delete opens the latch', async () => {
    const rl = new RLock(await ctx.client());
    const latch = rl.latch('c:timeout');
    await latch.trySetCount(1);
    const t0 = Date.now();
    assert.equal(await latch.await({ waitMs: 150 }), false);
    assert.ok(Date.now() - t0 >= 140);
    const w = latch.await({ waitMs: 10000 });
    await until(async () => (await awaiters(ctx.admin)) === 1, 5000, 'an awaiter');
    assert.equal(await latch.delete(), true);
    assert.equal(await w, true);
    await rl.close();
  });

  test('an abort rejects with its reason and ends the server\'s wait', async () => {
    const rl = new RLock(await ctx.client());
    const latch = rl.latch('c:abort');
    await latch.trySetCount(1);
    const ac = new AbortController();
    const w = latch.await({ signal: ac.signal });
    await until(async () => (await awaiters(ctx.admin)) === 1, 5000, 'an awaiter');
    ac.abort();
    await assert.rejects(w, { name: 'AbortError' });
    await until(async () => (await awaiters(ctx.admin)) === 0, 3000, 'the server\'s wait ended');
    assert.equal(await latch.count(), 1, 'nothing counted down');
    await latch.delete();
    await rl.close();
  });
});
