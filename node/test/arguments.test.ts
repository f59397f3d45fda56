import assert from 'node:assert/strict';
import { inspect } from 'node:util';
import { InvalidArgument, RLock, withLock } from '../src/index.js';
import { suite, type Admin } from './harness.js';

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
});
