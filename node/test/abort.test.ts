import assert from 'node:assert/strict';
import { adapt, LockTimeout, RLock, type Arg, type Connection } from '../src/index.js';
import { calls, free, randomAborts, suite, until, waiters } from './harness.js';

/** A connection that calls `onGrant` when a reply granting an `RLOCK.ACQUIRE` comes in, before
 * the client reads it (its duplicates too). */
function spying(inner: Connection, onGrant: () => void): Connection {
  return {
    async send(args: readonly Arg[]) {
      const reply = await inner.send(args);
      if (String(args[0]).toUpperCase() === 'RLOCK.ACQUIRE' && Array.isArray(reply) && Number(reply[0]) === 1) onGrant();
      return reply;
    },
    async duplicate() {
      return spying(await inner.duplicate(), onGrant);
    },
    close: () => inner.close(),
    onDeath: (l) => inner.onDeath(l),
  };
}

suite('abort', (ctx, test) => {
  test('an acquire whose signal is already aborted rejects with its reason and sends nothing', async () => {
    const rl = new RLock(await ctx.client());
    const before = await calls(ctx.admin, 'rlock.acquire');
    const ac = new AbortController();
    const reason = new Error('stop');
    ac.abort(reason);
    await assert.rejects(rl.lock('a:before').acquire({ signal: ac.signal }), (e) => e === reason);
    await assert.rejects(rl.lock('a:before').tryAcquire({ signal: ac.signal }), (e) => e === reason);
    assert.equal(await calls(ctx.admin, 'rlock.acquire'), before);
    assert.ok(await free(ctx.admin, 'a:before'));
    await rl.close();
  });

  test('an abort during the wait leaves the queue at once and never gets the lock', async () => {
    const rl = new RLock(await ctx.client());
    const holder = await rl.lock('a:during').acquire({ leaseMs: 10000 });
    const ac = new AbortController();
    const waiting = rl.lock('a:during').acquire({ signal: ac.signal });
    await until(async () => (await waiters(ctx.admin, 'a:during')) === 1, 5000, 'the waiter queued');
    const cancels = await calls(ctx.admin, 'rlock.cancel');
    ac.abort();
    await assert.rejects(waiting, { name: 'AbortError' });
    assert.equal(await waiters(ctx.admin, 'a:during'), 0);
    assert.ok((await calls(ctx.admin, 'rlock.cancel')) > cancels);
    await holder.release();
    assert.ok(await free(ctx.admin, 'a:during'));
    await rl.close();
  });

  test('an abort landing with the grant gives the grant back: nothing held afterwards', async () => {
    const ac = new AbortController();
    const rl = new RLock(spying(adapt(await ctx.client()), () => ac.abort()));
    const plain = new RLock(await ctx.client());
    const holder = await plain.lock('a:after').acquire({ leaseMs: 10000 });
    const waiting = rl.lock('a:after').acquire({ signal: ac.signal, leaseMs: 10000 });
    await until(async () => (await waiters(ctx.admin, 'a:after')) === 1, 5000, 'the waiter queued');
    await holder.release(); // hands it over to the waiter, whose reply aborts its signal
    await assert.rejects(waiting, { name: 'AbortError' });
    assert.ok(await free(ctx.admin, 'a:after'));
    // and a one-try acquire the same way
    const ac2 = new AbortController();
    const rl2 = new RLock(spying(adapt(await ctx.client()), () => ac2.abort()));
    await assert.rejects(rl2.lock('a:after').tryAcquire({ signal: ac2.signal }), { name: 'AbortError' });
    assert.ok(await free(ctx.admin, 'a:after'));
    await rl.close();
    await rl2.close();
    await plain.close();
  });

  test('a wait whose connection is killed asks again and gets the lock when it is freed', async () => {
    const rl = new RLock(await ctx.client());
    const holder = await rl.lock('a:killed').acquire({ leaseMs: 10000 });
    const waiting = rl.lock('a:killed').acquire({ waitMs: 10000, leaseMs: 10000 });
    await until(async () => (await waiters(ctx.admin, 'a:killed')) === 1, 5000, 'the waiter queued');
    const list = await ctx.admin.sendCommand(['CLIENT', 'LIST']);
    const id = /id=(\d+) [^\n]*cmd=rlock\.acquire/.exec(String(list))?.[1];
    assert.ok(id, 'the wait connection is listed');
    await ctx.admin.sendCommand(['CLIENT', 'KILL', 'ID', id]);
    await until(async () => /cmd=rlock\.acquire/.test(String(await ctx.admin.sendCommand(['CLIENT', 'LIST']))) && (await waiters(ctx.admin, 'a:killed')) === 1, 5000, 'the wait sent again');
    await holder.release();
    const hold = await waiting;
    assert.equal(Object.keys({ ...(await ctx.admin.hGetAll('a:killed')) })[0], hold.owner);
    await hold.release();
    assert.ok(await free(ctx.admin, 'a:killed'));
    await rl.close();
  });

  test('an acquire whose reply does not come in time cancels its request: nothing held once the server answers', async () => {
    const rl = new RLock(await ctx.client(), { responseTimeoutMs: 150 });
    const cancels = await calls(ctx.admin, 'rlock.cancel');
    await ctx.admin.sendCommand(['CLIENT', 'PAUSE', '2000', 'WRITE']); // writes wait: no reply in time
    const t0 = Date.now();
    await assert.rejects(rl.lock('a:stalled').tryAcquire({ leaseMs: 10000 }), { name: 'Stalled' });
    await assert.rejects(rl.lock('a:stalled').acquire({ waitMs: 100, leaseMs: 10000 }), LockTimeout);
    assert.ok(Date.now() - t0 < 2000, 'both ended before the pause did');
    await rl.close(); // the cancels, sent on until answered
    assert.ok((await calls(ctx.admin, 'rlock.cancel')) > cancels, 'cancels answered');
    assert.ok((await calls(ctx.admin, 'rlock.acquire')) > 0);
    assert.ok(await free(ctx.admin, 'a:stalled'), 'nothing held after the server ran it all');
  });

  test('random aborts at random times among contenders: one holder at a time, nothing held after each round', async () => {
    const rls = [new RLock(await ctx.client()), new RLock(await ctx.client())];
    try {
      // every contender a handle (and a party) of its own: one holder at a time
      await randomAborts(ctx.admin, 'a:random', 'randomized cancellation test', 15, 5, (round) => (i) => ({
        party: `${round}:${i}`,
        tryAcquire: (o) => rls[i % 2]!.lock('a:random').tryAcquire(o),
      }));
    } finally {
      for (const rl of rls) await rl.close();
    }
  });
});
