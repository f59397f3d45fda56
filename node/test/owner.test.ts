import assert from 'node:assert/strict';
import { Deadlock, RLock, UpgradeRefused } from '../src/index.js';
import { free, hash, randomAborts, suite, until, waiters } from './harness.js';

suite('owner', (ctx, test) => {
  test('handles of one owner re-enter each other\'s hold under the one owner id; the server keeps count 1', async () => {
    const rl = new RLock(await ctx.client());
    const owner = rl.owner();
    const a = await owner.lock('o:reenter').acquire({ leaseMs: 10000 });
    const b = await owner.lock('o:reenter').acquire({ waitMs: 0, leaseMs: 10000 });
    assert.equal(a.owner, owner.id);
    assert.equal(b.owner, owner.id);
    assert.equal(a.token, b.token);
    assert.deepEqual(await hash(ctx.admin, 'o:reenter'), { [owner.id]: '1' });
    // another owner (and a plain handle) finds it busy
    assert.equal(await rl.owner().lock('o:reenter').tryAcquire(), null);
    assert.equal(await rl.lock('o:reenter').tryAcquire(), null);
    await a.release();
    assert.deepEqual(await hash(ctx.admin, 'o:reenter'), { [owner.id]: '1' });
    await b.release();
    assert.ok(await free(ctx.admin, 'o:reenter'));
    await rl.close();
  });

  test('a wait that would close a cycle of owners is refused with Deadlock (the cycle), nothing queued', async () => {
    const rl = new RLock(await ctx.client());
    const one = rl.owner();
    const two = rl.owner();
    const h1 = await one.lock('o:k1').acquire({ leaseMs: 10000 });
    const h2 = await two.lock('o:k2').acquire({ leaseMs: 10000 });
    const twoWaits = two.lock('o:k1').acquire({ waitMs: 10000, leaseMs: 10000 });
    await until(async () => (await waiters(ctx.admin, 'o:k1')) === 1, 5000, 'owner two waits for k1');
    const t0 = Date.now();
    await assert.rejects(one.lock('o:k2').acquire({ waitMs: 10000 }), (e) => {
      assert.ok(e instanceof Deadlock, String(e));
      assert.equal(e.code, 'RLOCK_DEADLOCK');
      assert.ok(e.cycle.includes(one.id) && e.cycle.includes(two.id), e.cycle);
      return true;
    });
    assert.ok(Date.now() - t0 < 2000, 'refused at once');
    assert.equal(await waiters(ctx.admin, 'o:k2'), 0, 'nothing queued');
    await h1.release(); // owner two gets k1
    const got = await twoWaits;
    assert.equal(got.owner, two.id);
    await got.release();
    await h2.release();
    assert.ok((await free(ctx.admin, 'o:k1')) && (await free(ctx.admin, 'o:k2')));
    await rl.close();
  });

  test('read-write locks of one owner: write then read re-enters, read then write is an upgrade refused', async () => {
    const rl = new RLock(await ctx.client());
    const owner = rl.owner();
    const w = await owner.rwLock('o:rw').write.acquire({ leaseMs: 10000 });
    const r = await owner.rwLock('o:rw').read.acquire({ waitMs: 0, leaseMs: 10000 });
    assert.equal(w.owner, owner.id);
    assert.equal(r.owner, owner.id);
    await w.release(); // downgraded: the owner reads
    await assert.rejects(owner.rwLock('o:rw').write.acquire({ waitMs: 2000 }), UpgradeRefused);
    await r.release();
    assert.equal(await ctx.admin.sendCommand(['RWLOCK.INFO', 'o:rw']), null);
    await rl.close();
  });

  test('a stale hold of the owner id left on the server is not counted twice: one release frees it', async () => {
    const rl = new RLock(await ctx.client());
    const owner = rl.owner();
    // a hold of this owner id the client does not know of (its lease ended here a moment before
    // the server's, say)
    assert.equal(await ctx.admin.sendCommand(['RLOCK.ACQUIRE', 'o:stale', owner.id, '10000']), null);
    const h = await owner.lock('o:stale').acquire({ leaseMs: 10000 });
    assert.deepEqual(await hash(ctx.admin, 'o:stale'), { [owner.id]: '1' });
    await h.release();
    assert.ok(await free(ctx.admin, 'o:stale'));
    await rl.close();
  });

  test('an aborted acquire of an owner gives back exactly its own grant: the owner\'s other hold stays', async () => {
    const rl = new RLock(await ctx.client());
    const owner = rl.owner();
    const other = rl.owner();
    const blocker = await other.lock('o:cancel').acquire({ leaseMs: 10000 });
    const ac = new AbortController();
    const waiting = owner.lock('o:cancel').acquire({ signal: ac.signal, leaseMs: 10000 });
    await until(async () => (await waiters(ctx.admin, 'o:cancel')) === 1, 5000, 'queued');
    ac.abort();
    await assert.rejects(waiting, { name: 'AbortError' });
    await blocker.release();
    const h = await owner.lock('o:cancel').acquire({ waitMs: 1000, leaseMs: 10000 });
    const again = await owner.lock('o:cancel').acquire({ waitMs: 0, leaseMs: 10000 });
    await again.release();
    assert.deepEqual(await hash(ctx.admin, 'o:cancel'), { [owner.id]: '1' }, 'the first hold stays');
    await h.release();
    assert.ok(await free(ctx.admin, 'o:cancel'));
    await rl.close();
  });

  test('a fresh grant of an owner waits for its earlier release still in flight, within the acquire\'s time', async () => {
    const rl = new RLock(await ctx.client(), { responseTimeoutMs: 150 });
    const owner = rl.owner();
    const h = await owner.lock('o:inflight').acquire({ leaseMs: 10000 });
    await ctx.admin.sendCommand(['CLIENT', 'PAUSE', '1500', 'WRITE']); // the release waits in the server
    const t0 = Date.now();
    await h.release(); // no answer within its time: sent on in the background
    assert.equal(await owner.lock('o:inflight').tryAcquire({ leaseMs: 10000 }), null, 'not taken while the release is in flight');
    assert.ok(Date.now() - t0 < 1200, `a one-try does not wait for the pause (${Date.now() - t0} ms)`);
    const again = await owner.lock('o:inflight').acquire({ waitMs: 5000, leaseMs: 10000 });
    assert.ok(Date.now() - t0 >= 1300, 'granted once the release was applied');
    assert.deepEqual(await hash(ctx.admin, 'o:inflight'), { [owner.id]: '1' }, 'one count: the late release did not take it');
    await again.release();
    assert.ok(await free(ctx.admin, 'o:inflight'));
    await rl.close();
  });

  test('random aborts among the handles of two owners, re-entries included: one owner at a time, nothing held after each round', async () => {
    const rl = new RLock(await ctx.client());
    try {
      // two owners a round, each contender a handle of one of them: an owner's holds re-enter
      await randomAborts(ctx.admin, 'o:random', 'randomized owner test', 12, 6, () => {
        const owners = [rl.owner(), rl.owner()];
        return (i) => ({ party: owners[i % 2]!.id, tryAcquire: (o) => owners[i % 2]!.lock('o:random').tryAcquire(o) });
      });
    } finally {
      await rl.close();
    }
  });
});
