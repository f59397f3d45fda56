import assert from 'node:assert/strict';
import { adapt, InvalidArgument, LockLost, LockTimeout, RLock, type Arg, type Connection } from '../src/index.js';
import { calls, suite, until, type Admin } from './harness.js';

async function info(admin: Admin, name: string): Promise<Record<string, number>> {
  const flat = (await admin.sendCommand(['RSEM.INFO', name])) as unknown[] | null;
  const out: Record<string, number> = {};
  for (let i = 0; flat !== null && i < flat.length; i += 2) out[String(flat[i])] = Number(flat[i + 1]);
  return out;
}

/** A connection that aborts `ac` when an `RSEM.ACQUIRE` grant comes in, before the client reads it. */
function abortingOnGrant(inner: Connection, ac: AbortController): Connection {
  return {
    async send(args: readonly Arg[], options) {
      const reply = await inner.send(args, options);
      if (String(args[0]) === 'RSEM.ACQUIRE' && (reply === 1 || Array.isArray(reply))) ac.abort();
      return reply;
    },
    async duplicate() {
      return abortingOnGrant(await inner.duplicate(), ac);
    },
    close: () => inner.close(),
    onDeath: (l) => inner.onDeath(l),
  };
}

suite('semaphore', (ctx, test) => {
  test('counted permits: set once, taken, refused when short, given back exactly once', async () => {
    const rl = new RLock(await ctx.client());
    const sem = rl.semaphore('s:counted');
    assert.equal(await sem.trySetPermits(3), true);
    assert.equal(await sem.trySetPermits(5), false);
    const two = await sem.acquire({ permits: 2 });
    assert.equal(await sem.available(), 1);
    assert.equal(await sem.tryAcquire({ permits: 2 }), null);
    await assert.rejects(sem.acquire({ permits: 2, waitMs: 100 }), LockTimeout);
    await two.release();
    await two.release(); // idempotent: nothing more given back
    assert.equal(await sem.available(), 3);
    {
      await using one = await sem.acquire();
      assert.equal(one.permits, 1);
      assert.equal(await sem.available(), 2);
    }
    assert.equal(await sem.available(), 3);
    const taken = await sem.acquire({ permits: 3 });
    assert.equal(await sem.release(1), 1); // ownerless, as Redisson's release(n)
    assert.equal(await sem.addPermits(-1), 0);
    await taken.release();
    assert.equal(await sem.available(), 3);
    await rl.close();
  });

  test('counted permits are handed to a waiter in the server when given back', async () => {
    const rl = new RLock(await ctx.client());
    const sem = rl.semaphore('s:handoff');
    await sem.trySetPermits(1);
    const held = await sem.acquire();
    const waiting = sem.acquire({ waitMs: 5000 });
    await until(async () => (await info(ctx.admin, 's:handoff')).waiters === 1, 5000, 'the waiter queued');
    await held.release();
    const got = await waiting;
    assert.equal(await sem.available(), 0);
    await got.release();
    assert.equal(await sem.available(), 1);
    await rl.close();
  });

  test('an aborted counted acquire takes nothing: during the wait, and landing with the grant', async () => {
    const rl = new RLock(await ctx.client());
    const sem = rl.semaphore('s:abort');
    await sem.trySetPermits(1);
    const held = await sem.acquire();
    const ac = new AbortController();
    const waiting = sem.acquire({ signal: ac.signal });
    await until(async () => (await info(ctx.admin, 's:abort')).waiters === 1, 5000, 'the waiter queued');
    ac.abort();
    await assert.rejects(waiting, { name: 'AbortError' });
    assert.equal((await info(ctx.admin, 's:abort')).waiters, 0);
    await held.release();
    assert.equal(await sem.available(), 1);

    const ac2 = new AbortController();
    const spy = new RLock(abortingOnGrant(adapt(await ctx.client()), ac2));
    const cancels = await calls(ctx.admin, 'rlock.cancel');
    await assert.rejects(spy.semaphore('s:abort').tryAcquire({ signal: ac2.signal }), { name: 'AbortError' });
    assert.ok((await calls(ctx.admin, 'rlock.cancel')) > cancels);
    assert.equal(await sem.available(), 1, 'the grant was given back');
    await spy.close();
    await rl.close();
  });

  test('leased permits: binary ids leased in the zset, released by id', async () => {
    const rl = new RLock(await ctx.client());
    const sem = rl.leasedSemaphore('s:leased');
    assert.equal(await sem.trySetPermits(2), true);
    const p = await sem.acquire({ permits: 2, leaseMs: 10000 });
    assert.equal(p.ids.length, 2);
    for (const id of p.ids) assert.equal(id.length, 16);
    assert.equal(await ctx.admin.zCard('{s:leased}:timeout'), 2);
    assert.equal(await sem.tryAcquire(), null);
    await p.release();
    await p.release();
    assert.equal(await ctx.admin.zCard('{s:leased}:timeout'), 0);
    assert.equal(await sem.available(), 2);
    await rl.close();
  });

  test('leased permits taken without a lease are renewed by the watchdog; with one, lost at its end', async () => {
    const rl = new RLock(await ctx.client(), { watchdogMs: 300 });
    const sem = rl.leasedSemaphore('s:watchdog');
    await sem.trySetPermits(2);
    const kept = await sem.acquire();
    const short = await sem.acquire({ leaseMs: 150 });
    await until(() => short.signal.aborted, 2000, 'the short lease lost');
    assert.ok(short.signal.reason instanceof LockLost);
    await assert.rejects(short.release(), LockLost);
    const t0 = Date.now();
    await until(() => Date.now() - t0 > 1000, 2000, 'a second');
    assert.ok(!kept.signal.aborted);
    assert.equal((await info(ctx.admin, 's:watchdog')).leased, 1);
    await kept.release();
    assert.equal(await sem.available(), 2);
    await rl.close();
  });

  test('an aborted leased wait takes nothing', async () => {
    const rl = new RLock(await ctx.client());
    const sem = rl.leasedSemaphore('s:leased-abort');
    await sem.trySetPermits(1);
    const held = await sem.acquire({ leaseMs: 10000 });
    const ac = new AbortController();
    const waiting = sem.acquire({ signal: ac.signal, leaseMs: 10000 });
    await until(async () => (await info(ctx.admin, 's:leased-abort')).waiters === 1, 5000, 'the waiter queued');
    ac.abort();
    await assert.rejects(waiting, { name: 'AbortError' });
    await held.release();
    assert.equal(await sem.available(), 1);
    assert.equal(await ctx.admin.zCard('{s:leased-abort}:timeout'), 0);
    await rl.close();
  });

  test('bad semaphore arguments fail at once and send nothing', async () => {
    const rl = new RLock(await ctx.client());
    const sem = rl.semaphore('s:args');
    const leased = rl.leasedSemaphore('s:args2');
    const before = await calls(ctx.admin, 'rsem.acquire');
    const isBad = (e: unknown): boolean => e instanceof InvalidArgument;
    for (const permits of [0, -1, 1.5, NaN, Infinity, '2', null]) {
      await assert.rejects(sem.acquire({ permits } as never), isBad);
      await assert.rejects(leased.tryAcquire({ permits } as never), isBad);
      await assert.rejects(sem.release(permits as never), isBad);
    }
    await assert.rejects(leased.acquire({ permits: 10001 }), isBad);
    await assert.rejects(sem.acquire({ leaseMs: 100 } as never), isBad); // counted permits have no lease
    await assert.rejects(sem.trySetPermits(-1), isBad);
    await assert.rejects(sem.addPermits(0.5), isBad);
    assert.equal(await calls(ctx.admin, 'rsem.acquire'), before);
    assert.throws(() => rl.semaphore(7 as never), isBad);
    await rl.close();
  });

  test('random aborts among counted contenders: the permits all come back after each round', async () => {
    const seed = Number(process.env.RLOCK_SEED ?? Math.floor(Math.random() * 2 ** 31));
    let x = seed >>> 0;
    const rand = (): number => ((x = (Math.imul(x, 1103515245) + 12345) >>> 0) / 4294967296);
    const rl = new RLock(await ctx.client());
    const sem = rl.semaphore('s:random');
    await sem.trySetPermits(2);
    let holding = 0;
    let most = 0;
    try {
      for (let round = 0; round < 10; round++) {
        await Promise.all(
          Array.from({ length: 5 }, async () => {
            const ac = new AbortController();
            const timer = setTimeout(() => ac.abort(), rand() * 25);
            const waitMs = rand() < 0.3 ? undefined : Math.floor(rand() * 30);
            const holdFor = rand() * 6;
            try {
              const p = await sem.tryAcquire({ waitMs, signal: ac.signal });
              if (p === null) return;
              most = Math.max(most, ++holding);
              await new Promise((r) => setTimeout(r, holdFor));
              holding--;
              await p.release();
            } catch (e) {
              if ((e as Error).name !== 'AbortError') throw e;
            } finally {
              clearTimeout(timer);
            }
          }),
        );
        assert.equal(await sem.available(), 2, `round ${round}: every permit back`);
        assert.equal((await info(ctx.admin, 's:random')).waiters, 0, `round ${round}: nobody waits`);
      }
      assert.ok(most <= 2, `at most 2 holders at once (${most})`);
    } catch (e) {
      process.stderr.write(`randomized semaphore test: seed ${seed} (RLOCK_SEED=${seed} replays it)\n`);
      throw e;
    } finally {
      await rl.close();
    }
  });
});
