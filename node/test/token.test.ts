import assert from 'node:assert/strict';
import { RLock } from '../src/index.js';
import { suite, until } from './harness.js';

const NEAR = 2n ** 63n - 10n; // far above 2^53: a JavaScript number would round it

suite('fencing tokens above 2^53', (ctx, test) => {
  test('a token near 2^63 is read exactly, granted at once and after a wait', async () => {
    const rl = new RLock(await ctx.client());
    const name = 'big:token';
    await ctx.admin.set(`redisson_lock_token:{${name}}`, NEAR.toString());
    const first = await rl.lock(name).acquire({ waitMs: 0, leaseMs: 10000 });
    assert.equal(first.token, NEAR + 1n);
    const waiting = rl.lock(name).acquire({ waitMs: 5000, leaseMs: 10000 });
    await until(async () => ((await ctx.admin.sendCommand(['RLOCK.INFO', name])) as unknown[])[7] === 1, 3000, 'the waiter queued');
    await first.release();
    const second = await waiting;
    assert.equal(second.token, NEAR + 2n);
    assert.equal(await ctx.admin.get(`redisson_lock_token:{${name}}`), (NEAR + 2n).toString());
    await second.release();
    await rl.close();
  });
  test("a session's token near 2^63 is read exactly", async () => {
    const rl = new RLock(await ctx.client());
    const name = 'big:session';
    await ctx.admin.set(`redisson_lock_token:{${name}}`, NEAR.toString());
    await using session = await rl.session();
    const hold = await session.lock(name).acquire({ waitMs: 0, leaseMs: 10000 });
    assert.equal(hold.token, NEAR + 1n);
    const write = await session.rwLock('big:session:rw').write.acquire({ waitMs: 0, leaseMs: 10000 });
    await hold.release();
    await write.release();
    await rl.close();
  });
});
