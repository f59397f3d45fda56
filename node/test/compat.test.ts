import assert from 'node:assert/strict';
import { compat, LockLost, LockTimeout, WrongType } from '../src/index.js';
import { free, suite, until } from './harness.js';

const { Mutex, Semaphore, MultiSemaphore, Redlock } = compat;

suite('migration facades', (ctx, test) => {
  const waiters = async (name: string): Promise<number> => {
    const info = (await ctx.admin.sendCommand(['RLOCK.INFO', name])) as unknown[] | null;
    return info === null ? 0 : Number(info[7]);
  };

  test('Mutex (redis-semaphore shape): tryAcquire, an acquire that waits in the server, release, isAcquired', async () => {
    const client = await ctx.client();
    const a = new Mutex(client, 'c:mutex', { lockTimeout: 2000 });
    const b = new Mutex(client, 'c:mutex', { lockTimeout: 2000, acquireTimeout: 5000 });
    await a.acquire();
    assert.ok(a.isAcquired);
    assert.equal(await b.tryAcquire(), false);
    const waiting = b.acquire();
    await until(async () => (await waiters('c:mutex')) === 1, 3000, 'b waiting in the server');
    assert.ok(!b.isAcquired);
    await a.release();
    assert.ok(!a.isAcquired);
    await waiting;
    assert.ok(b.isAcquired);
    await b.release();
    await b.release(); // nothing held: nothing done
    assert.ok(await free(ctx.admin, 'c:mutex'));
  });

  test('Mutex: acquireTimeout ends a wait with LockTimeout; onLockLost is called when the hold is taken away', async () => {
    const client = await ctx.client();
    const lost: Error[] = [];
    const a = new Mutex(client, 'c:lost', { lockTimeout: 300, onLockLost: (e) => lost.push(e) });
    await a.acquire();
    const b = new Mutex(client, 'c:lost', { acquireTimeout: 150 });
    await assert.rejects(b.acquire(), LockTimeout);
    assert.equal(await waiters('c:lost'), 0);
    await ctx.admin.sendCommand(['RLOCK.FORCERELEASE', 'c:lost']);
    await until(() => lost.length === 1, 3000, 'onLockLost');
    assert.ok(lost[0] instanceof LockLost);
    assert.ok(!a.isAcquired);
    await a.release(); // lost: nothing to give back, no error
    assert.ok(await free(ctx.admin, 'c:lost'));
  });

  test('Semaphore and MultiSemaphore (redis-semaphore shape): the limit is kept, the next one waits in the server', async () => {
    const client = await ctx.client();
    const s1 = new Semaphore(client, 'c:sem', 2, { acquireTimeout: 5000 });
    const s2 = new Semaphore(client, 'c:sem', 2, { acquireTimeout: 5000 });
    const s3 = new Semaphore(client, 'c:sem', 2, { acquireTimeout: 5000 });
    await s1.acquire();
    await s2.acquire();
    assert.equal(await s3.tryAcquire(), false);
    const waiting = s3.acquire();
    await until(async () => Number(await ctx.admin.sendCommand(['RSEM.AVAILABLE', 'c:sem'])) === 0 && !s3.isAcquired, 1000, 'all taken');
    await s1.release();
    await waiting;
    assert.ok(s3.isAcquired);
    await s2.release();
    await s3.release();
    assert.equal(Number(await ctx.admin.sendCommand(['RSEM.AVAILABLE', 'c:sem'])), 2);

    const m1 = new MultiSemaphore(client, 'c:multi', 3, 2);
    const m2 = new MultiSemaphore(client, 'c:multi', 3, 2);
    await m1.acquire();
    assert.equal(await m2.tryAcquire(), false);
    await m1.release();
    assert.equal(await m2.tryAcquire(), true);
    await m2.release();
    assert.equal(Number(await ctx.admin.sendCommand(['RSEM.AVAILABLE', 'c:multi'])), 3);
  });

  test('Redlock.using (redlock shape): routines on the same resources run one after the other; the signal aborts on loss', async () => {
    const client = await ctx.client();
    const redlock = new Redlock([client], { retryCount: 50, retryDelay: 100 });
    let inside = 0;
    let most = 0;
    const run = (): Promise<void> =>
      redlock.using(['c:r1', 'c:r2'], 2000, async () => {
        most = Math.max(most, ++inside);
        await new Promise((r) => setTimeout(r, 50));
        inside--;
      });
    await Promise.all([run(), run(), run()]);
    assert.equal(most, 1);
    assert.ok(await free(ctx.admin, 'c:r1'));
    assert.ok(await free(ctx.admin, 'c:r2'));
    const out = await redlock.using(['c:r3'], 300, async (signal) => {
      await ctx.admin.sendCommand(['RLOCK.FORCERELEASE', 'c:r3']);
      await until(() => signal.aborted, 3000, 'the signal aborted');
      assert.ok(signal.error instanceof LockLost);
      return 7;
    });
    assert.equal(out, 7);
    assert.throws(() => new Redlock([client, client]), TypeError);
  });
  test('Redlock.using: a release refused by the server still releases the other resources, then throws', async () => {
    const client = await ctx.client();
    const redlock = new Redlock([client]);
    await assert.rejects(
      redlock.using(['c:rl:a', 'c:rl:b'], 2000, async () => {
        // the last resource released first is made another kind of value: its release is refused
        await ctx.admin.del('c:rl:b');
        await ctx.admin.set('c:rl:b', 'not a lock');
        return 1;
      }),
      WrongType,
    );
    // the other resource is released, not left to a watchdog that renews it for ever
    assert.ok(await free(ctx.admin, 'c:rl:a'), 'c:rl:a released');
    await ctx.admin.del('c:rl:b');
  });
});
