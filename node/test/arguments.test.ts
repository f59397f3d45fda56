import assert from 'node:assert/strict';
import { inspect } from 'node:util';
import { InvalidArgument, RLock, compat, withLock } from '../src/index.js';
import { suite, waiters, type Admin } from './harness.js';

/** Every rlock command the server ran so far. */
async function rlockCalls(admin: Admin): Promise<number> {
  const info = await admin.info('commandstats');
  let n = 0;
  for (const m of info.matchAll(/cmdstat_r(?:lock|wlock|sem|latch)\.[a-z]+:calls=(\d+)/g)) n += Number(m[1]);
  return n;
}

const isBad = (e: unknown): boolean => e instanceof InvalidArgument && e instanceof TypeError && e.code === 'RLOCK_BAD_ARGUMENT';

suite('arguments', (ctx, test) => {
  test('bad acquire arguments fail at once with InvalidArgument and send nothing', async () => {
    const client = await ctx.client();
    const rl = new RLock(client);
    const lock = rl.lock('b:args');
    const before = await rlockCalls(ctx.admin);
    const bad: unknown[] = [
      { waitMs: NaN }, { waitMs: Infinity }, { waitMs: -1 }, { waitMs: 2 ** 40 }, { waitMs: '100' }, { waitMs: null },
      { leaseMs: 0 }, { leaseMs: -5 }, { leaseMs: NaN }, { leaseMs: -Infinity }, { leaseMs: 1e12 }, { leaseMs: '1000' },
      { leaseMs: 10n }, { signal: {} }, { signal: 'x' }, { wait: 5 }, 'x', 5, null, [],
    ];
    for (const opts of bad) {
      await assert.rejects(lock.acquire(opts as never), isBad, `acquire(${inspect(opts)})`);
      await assert.rejects(lock.tryAcquire(opts as never), isBad, `tryAcquire(${inspect(opts)})`);
      await assert.rejects(withLock(client, 'b:args', opts as never, async () => 1), isBad);
    }
    for (const name of [42, null, undefined, {}, NaN, ['a'], true]) {
      assert.throws(() => rl.lock(name as never), isBad, `lock(${String(name)})`);
      await assert.rejects(withLock(client, name as never, {}, async () => 1), isBad);
    }
    await assert.rejects(withLock(client, 'b:args', {}, 'not a function' as never), isBad);
    for (const o of [{ watchdogMs: 50 }, { watchdogMs: NaN }, { responseTimeoutMs: -1 }, { responseTimeoutMs: Infinity }, { nope: 1 }]) {
      assert.throws(() => new RLock(client, o as never), isBad, JSON.stringify(o));
    }
    for (const c of [{}, null, 'redis://x', 6379]) assert.throws(() => new RLock(c), isBad);
    assert.equal(await rlockCalls(ctx.admin), before, 'nothing was sent');
    await rl.close();
  });

  test('names are strings or Buffers, binary-safe, the empty one included', async () => {
    const rl = new RLock(await ctx.client());
    const bin = Buffer.from([0x62, 0x00, 0xff, 0x3a]);
    const hold = await rl.lock(bin).acquire({ leaseMs: 10000 });
    assert.equal(await ctx.admin.exists(bin), 1);
    await hold.release();
    assert.equal(await ctx.admin.exists(bin), 0);
    const empty = await rl.lock('').acquire({ leaseMs: 10000 });
    await empty.release();
    const fractional = await rl.lock('b:fraction').acquire({ leaseMs: 1500.2, waitMs: 0.5 });
    const pttl = Number(await ctx.admin.sendCommand(['RLOCK.PTTL', 'b:fraction']));
    assert.ok(pttl > 1400 && pttl <= 1501, `pttl ${pttl}`);
    await fractional.release();
    await rl.close();
  });
  test('bad arguments of semaphores, latches, sessions, owners, the compat facades and close() fail at once with InvalidArgument and send nothing', async () => {
    const client = await ctx.client();
    const rl = new RLock(client);
    const sem = rl.semaphore('b:sem');
    const leased = rl.leasedSemaphore('b:leased');
    const latch = rl.latch('b:latch');
    const rw = rl.rwLock('b:rw');
    const owner = rl.owner();
    const before = await rlockCalls(ctx.admin);
    const calls: [string, () => unknown][] = [];
    for (const n of [NaN, Infinity, -Infinity, 2 ** 53 + 1, 1.5, '1', 10n, null, {}]) {
      const v = n as never;
      const s = inspect(n);
      if (n !== 1.5) {
        // durations are rounded up to whole ms: 1.5 is a good one
        calls.push(
          [`rwLock.read.acquire({ leaseMs: ${s} })`, () => rw.read.acquire({ leaseMs: v })],
          [`owner.lock().acquire({ waitMs: ${s} })`, () => owner.lock('b:owned').acquire({ waitMs: v })],
          [`redlock.using(retryDelay ${s})`, () => new compat.Redlock([client]).using(['b:redlock'], 1000, { retryDelay: v }, async () => 1)],
          [`rlock.close(${s})`, () => new RLock(client).close(v)],
        );
      }
      calls.push(
        [`semaphore.acquire({ permits: ${s} })`, () => sem.acquire({ permits: v, waitMs: 0 })],
        [`leasedSemaphore.acquire({ permits: ${s} })`, () => leased.acquire({ permits: v, waitMs: 0 })],
        [`semaphore.release(${s})`, () => sem.release(v)],
        [`semaphore.addPermits(${s})`, () => sem.addPermits(v)],
        [`semaphore.trySetPermits(${s})`, () => sem.trySetPermits(v)],
        [`latch.countDown(${s})`, () => latch.countDown(v)],
        [`latch.trySetCount(${s})`, () => latch.trySetCount(v)],
        [`session({ lockDelayMs: ${s} })`, () => rl.session({ lockDelayMs: v })],
        [`new MultiSemaphore(limit ${s})`, () => new compat.MultiSemaphore(client, 'b:multi', v, 1)],
        [`new MultiSemaphore(permits ${s})`, () => new compat.MultiSemaphore(client, 'b:multi', 3, v)],
        [`new Redlock({ retryCount: ${s} })`, () => new compat.Redlock([client], { retryCount: v })],
      );
    }
    calls.push(
      ['leasedSemaphore.acquire({ permits: 10001 })', () => leased.acquire({ permits: 10001, waitMs: 0 })],
      ['semaphore.acquire({ unknown })', () => sem.acquire({ nope: 1 } as never)],
      ['latch.await({ unknown })', () => latch.await({ nope: 1 } as never)],
      ['session({ unknown })', () => rl.session({ nope: 1 } as never)],
      ['new Mutex({ unknown })', () => new compat.Mutex(client, 'b:mutex', { nope: 1 } as never)],
      ['new Redlock({ unknown })', () => new compat.Redlock([client], { retryCont: 3 } as never)],
      ['redlock.using(retryCount × retryDelay past 2^31-1 ms)', () => new compat.Redlock([client], { retryCount: 2 ** 31, retryDelay: 200 }).using(['b:redlock'], 1000, async () => 1)],
      ['rlock.latch(42)', () => rl.latch(42 as never)],
    );
    for (const [label, call] of calls) {
      let outcome = 'accepted';
      try {
        await call();
      } catch (e) {
        outcome = isBad(e) ? 'InvalidArgument' : `${(e as Error).name}: ${(e as Error).message}`;
      }
      assert.equal(outcome, 'InvalidArgument', label);
    }
    assert.equal(await rlockCalls(ctx.admin), before, 'nothing was sent');
    await rl.close();
  });

  test('an option given as undefined is the default: tryAcquire({ waitMs: undefined }) is one try', async () => {
    const rl = new RLock(await ctx.client());
    const holder = await rl.lock('b:undefined').acquire({ leaseMs: 10000 });
    const sem = rl.semaphore('b:undefined:sem');
    await sem.trySetPermits(0);
    const tries = [
      rl.lock('b:undefined').tryAcquire({ waitMs: undefined }),
      rl.rwLock('b:undefined:rw').write.tryAcquire({ waitMs: undefined, leaseMs: 10000 }).then(() => rl.rwLock('b:undefined:rw').read.tryAcquire({ waitMs: undefined })),
      sem.tryAcquire({ waitMs: undefined }),
    ];
    const outcomes = await Promise.race([
      Promise.all(tries),
      new Promise<'waited'>((r) => setTimeout(() => r('waited'), 1500).unref()),
    ]);
    assert.deepEqual(outcomes, [null, null, null], 'each answered at once: not taken');
    assert.equal(await waiters(ctx.admin, 'b:undefined'), 0, 'nothing queued');
    await holder.release();
    await rl.close();
  });
});
