import assert from 'node:assert/strict';
import { RLock, RLockClosed } from '../src/index.js';
import { suite, until, waiters } from './harness.js';

suite('RLock.close ends waits', (ctx, test) => {
  test('a wait still on when its RLock closes ends with RLockClosed, holding nothing, never asked again on a new connection; later acquires work', async () => {
    const client = await ctx.client();
    const other = new RLock(client);
    const holder = await other.lock('close:w').acquire({ leaseMs: 20000 });
    const rl = new RLock(client);
    const waiting = rl.lock('close:w').acquire({ leaseMs: 20000 });
    const settled = waiting.then(
      (h) => ({ h }),
      (e: unknown) => ({ e }),
    );
    await other.latch('close:l').trySetCount(1);
    const latchWait = rl.latch('close:l').await().then(
      (v) => v,
      (e: unknown) => e,
    );
    await until(async () => (await waiters(ctx.admin, 'close:w')) === 1, 5000, 'the waiter queued');
    await until(async () => String(await ctx.admin.sendCommand(['CLIENT', 'LIST'])).includes('cmd=rlatch.await'), 5000, 'the latch wait on');
    await rl.close();
    // the wait must not come back on a new connection after the RLock closed
    await new Promise((r) => setTimeout(r, 1500));
    const queued = await waiters(ctx.admin, 'close:w');
    await holder.release();
    const r = await Promise.race([settled, new Promise((res) => setTimeout(() => res('pending'), 3000))]);
    if (typeof r === 'object' && r !== null && 'h' in r) await (r as { h: { release(): Promise<void> } }).h.release();
    assert.equal(queued, 0, 'no wait queued after close');
    assert.ok(typeof r === 'object' && r !== null && 'e' in r, `the acquire rejects once its RLock closed: ${typeof r === 'object' && r !== null && 'h' in r ? 'it was granted' : String(r)}`);
    assert.ok((r as { e: unknown }).e instanceof RLockClosed, `RLockClosed: ${String((r as { e: unknown }).e)}`);
    // nothing held by nobody: the waiter's request was cancelled, the lock is free
    await until(async () => (await ctx.admin.exists('close:w')) === 0, 5000, 'the lock free');
    // a latch wait after close fails at once too
    const latched = await latchWait;
    assert.ok(latched instanceof RLockClosed, `the latch wait ends with RLockClosed: ${String(latched)}`);
    // the RLock stays usable: an acquire begun after the close waits and is granted as ever
    const h2 = await other.lock('close:w2').acquire({ leaseMs: 20000 });
    const later = rl.lock('close:w2').acquire({ waitMs: 5000, leaseMs: 20000 });
    await until(async () => (await waiters(ctx.admin, 'close:w2')) === 1, 5000, 'the later acquire queued');
    await h2.release();
    await (await later).release();
    await rl.close();
    await other.close();
  });
});
