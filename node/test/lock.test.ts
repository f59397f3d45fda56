import assert from 'node:assert/strict';
import { RLock, LockLost, LockTimeout, NotHeld, withLock } from '../src/index.js';
import { free, hash, suite, until } from './harness.js';

suite('lock', (ctx, test) => {
  test('acquire, release: held on the server under the hold owner, then free', async () => {
    const rl = new RLock(await ctx.client());
    const lock = rl.lock('l:basic');
    const hold = await lock.acquire({ leaseMs: 10000 });
    assert.match(hold.owner, new RegExp(`^${rl.id}:\\d+:\\d+$`));
    assert.deepEqual(await hash(ctx.admin, 'l:basic'), { [hold.owner]: '1' });
    assert.ok(lock.isHeld());
    await hold.release();
    assert.ok(await free(ctx.admin, 'l:basic'));
    assert.ok(!lock.isHeld());
    await hold.release(); // idempotent
    await rl.close();
  });

  test('re-entry counts on the client, the server keeps count 1 until the last release', async () => {
    const rl = new RLock(await ctx.client());
    const lock = rl.lock('l:reenter');
    const a = await lock.acquire({ leaseMs: 10000 });
    const b = await lock.acquire({ leaseMs: 10000 });
    assert.equal(a.owner, b.owner);
    assert.equal(a.token, b.token);
    await a.release();
    assert.deepEqual(await hash(ctx.admin, 'l:reenter'), { [b.owner]: '1' });
    await b.release();
    assert.ok(await free(ctx.admin, 'l:reenter'));
    await rl.close();
  });

  test('two handles are two owners: the second finds it busy; tokens grow hold after hold', async () => {
    const rl = new RLock(await ctx.client());
    const one = rl.lock('l:tokens');
    const two = rl.lock('l:tokens');
    const h1 = await one.acquire({ leaseMs: 10000 });
    assert.equal(await two.tryAcquire(), null);
    await h1.release();
    const h2 = await two.acquire({ leaseMs: 10000, waitMs: 1000 });
    assert.ok(h2.token > h1.token, `${h2.token} > ${h1.token}`);
    await h2.release();
    const h3 = await one.acquire({ waitMs: 0 });
    assert.ok(h3.token > h2.token);
    await h3.release();
    await rl.close();
  });

  test('FIFO hand-off: waiters get the lock in the order they queued', async () => {
    const rl = new RLock(await ctx.client());
    const holder = await rl.lock('l:fifo').acquire({ leaseMs: 10000 });
    const order: number[] = [];
    const waits: Promise<void>[] = [];
    for (let i = 0; i < 3; i++) {
      waits.push(
        rl.lock('l:fifo').acquire({ waitMs: 10000 }).then(async (h) => {
          order.push(i);
          await h.release();
        }),
      );
      // queued before the next one asks
      await until(async () => ((await ctx.admin.sendCommand(['RLOCK.INFO', 'l:fifo'])) as unknown[])[7] === i + 1, 5000, `waiter ${i} queued`);
    }
    await holder.release();
    await Promise.all(waits);
    assert.deepEqual(order, [0, 1, 2]);
    assert.ok(await free(ctx.admin, 'l:fifo'));
    await rl.close();
  });

  test('a wait that times out throws LockTimeout and leaves nothing queued or held', async () => {
    const rl = new RLock(await ctx.client());
    const holder = await rl.lock('l:timeout').acquire({ leaseMs: 10000 });
    const t0 = Date.now();
    await assert.rejects(rl.lock('l:timeout').acquire({ waitMs: 200 }), LockTimeout);
    assert.ok(Date.now() - t0 >= 190);
    const info = (await ctx.admin.sendCommand(['RLOCK.INFO', 'l:timeout'])) as unknown[];
    assert.equal(info[1], holder.owner);
    assert.equal(info[7], 0); // no waiter left
    assert.equal(await rl.lock('l:timeout').tryAcquire({ waitMs: 50 }), null);
    await holder.release();
    await rl.close();
  });

  test('the watchdog keeps a hold taken without a lease well past that lease', async () => {
    const rl = new RLock(await ctx.client(), { watchdogMs: 300 });
    const hold = await rl.lock('l:watchdog').acquire();
    const t0 = Date.now();
    await until(async () => Date.now() - t0 > 1000, 2000, 'a second');
    assert.ok(!hold.signal.aborted);
    const pttl = Number(await ctx.admin.sendCommand(['RLOCK.PTTL', 'l:watchdog']));
    assert.ok(pttl > 0 && pttl <= 300, `pttl ${pttl}`);
    assert.ok(hold.validUntil > Date.now());
    await hold.release();
    assert.ok(await free(ctx.admin, 'l:watchdog'));
    await rl.close();
  });

  test('hold.signal aborts with LockLost when the lock is force-released and the renewal fails', async () => {
    const rl = new RLock(await ctx.client(), { watchdogMs: 300 });
    const hold = await rl.lock('l:force').acquire();
    assert.equal(await ctx.admin.sendCommand(['RLOCK.FORCERELEASE', 'l:force']), 1);
    await until(() => hold.signal.aborted, 2000, 'hold.signal aborted');
    assert.ok(hold.signal.reason instanceof LockLost);
    assert.throws(() => hold.check(), LockLost);
    await assert.rejects(hold.release(), LockLost);
    await hold.release(); // the second release does nothing
    await rl.close();
  });

  test('a hold with a lease is lost when the lease ends: its signal aborts', async () => {
    const rl = new RLock(await ctx.client());
    const hold = await rl.lock('l:lease').acquire({ leaseMs: 150 });
    await until(() => hold.signal.aborted, 2000, 'hold.signal aborted');
    assert.ok(hold.lost);
    // the client counts the lease from when it sent the acquire: the server's ends a little later
    await until(() => free(ctx.admin, 'l:lease'), 1000, 'the server lease over');
    await rl.close();
  });

  test('await using releases at the end of the block, also when it throws', async () => {
    const rl = new RLock(await ctx.client());
    const lock = rl.lock('l:using');
    {
      await using hold = await lock.acquire({ leaseMs: 10000 });
      assert.deepEqual(Object.keys(await hash(ctx.admin, 'l:using')), [hold.owner]);
    }
    assert.ok(await free(ctx.admin, 'l:using'));
    const boom = async (): Promise<void> => {
      await using hold = await lock.acquire({ leaseMs: 10000 });
      hold.check();
      throw new Error('boom');
    };
    await assert.rejects(boom(), /boom/);
    assert.ok(await free(ctx.admin, 'l:using'));
    await rl.close();
  });

  test('withLock runs the function holding the lock and releases it', async () => {
    const client = await ctx.client();
    let seen: Record<string, string> = {};
    const out = await withLock(client, 'l:with', { waitMs: 1000 }, async (signal, token) => {
      assert.ok(!signal.aborted);
      assert.equal(typeof token, 'bigint');
      seen = await hash(ctx.admin, 'l:with');
      return 42;
    });
    assert.equal(out, 42);
    assert.equal(Object.keys(seen).length, 1);
    assert.ok(await free(ctx.admin, 'l:with'));
    await assert.rejects(
      withLock(client, 'l:with', {}, async () => {
        throw new Error('inner');
      }),
      /inner/,
    );
    assert.ok(await free(ctx.admin, 'l:with'));
    await RLock.of(client).close();
  });

  test('a release of a hold someone else took throws LockLost, never touches their hold', async () => {
    const rl = new RLock(await ctx.client());
    const hold = await rl.lock('l:stolen').acquire({ leaseMs: 10000 });
    await ctx.admin.sendCommand(['RLOCK.FORCERELEASE', 'l:stolen']);
    const other = await rl.lock('l:stolen').acquire({ leaseMs: 10000, waitMs: 1000 });
    await assert.rejects(hold.release(), (e: unknown) => e instanceof LockLost && e instanceof NotHeld);
    assert.deepEqual(await hash(ctx.admin, 'l:stolen'), { [other.owner]: '1' });
    await other.release();
    await rl.close();
  });

  test('a client made from a URL waits on a duplicate of its own connection', async () => {
    const rl = new RLock(await ctx.urlClient());
    const holder = await rl.lock('l:url').acquire({ leaseMs: 10000 });
    const waiting = rl.lock('l:url').acquire({ waitMs: 5000 });
    await until(async () => ((await ctx.admin.sendCommand(['RLOCK.INFO', 'l:url'])) as unknown[])[7] === 1, 5000, 'the waiter queued');
    await holder.release();
    const hold = await waiting;
    assert.deepEqual(await hash(ctx.admin, 'l:url'), { [hold.owner]: '1' });
    await hold.release();
    assert.ok(await free(ctx.admin, 'l:url'));
    await rl.close();
  });

  test('concurrent acquires of one handle take turns: the second re-enters the first one\'s hold', async () => {
    const rl = new RLock(await ctx.client());
    const lock = rl.lock('l:turns');
    const [a, b] = await Promise.all([lock.acquire({ leaseMs: 10000 }), lock.acquire({ leaseMs: 10000 })]);
    assert.equal(a.owner, b.owner);
    assert.deepEqual(await hash(ctx.admin, 'l:turns'), { [a.owner]: '1' });
    await b.release();
    assert.ok(lock.isHeld());
    await a.release();
    assert.ok(await free(ctx.admin, 'l:turns'));
    await rl.close();
  });
});
