import assert from 'node:assert/strict';
import { createClient } from 'redis';
import { Redis } from 'ioredis';
import { Hold, LockPermissionError, LockTimeout, RLock, Stalled } from '../src/index.js';
import { calls, free, suite, until, waiters, type Admin } from './harness.js';

/** The ids of the server's connections blocked in `cmd` (CLIENT LIST). */
async function blockedIn(admin: Admin, cmd: string): Promise<string[]> {
  const list = String(await admin.sendCommand(['CLIENT', 'LIST']));
  return list
    .split('\n')
    .filter((line) => line.includes(` cmd=${cmd} `) && / flags=\S*b/.test(line))
    .map((line) => /(?:^|\s)id=(\d+)/.exec(line)?.[1] ?? '')
    .filter((id) => id !== '');
}

suite('faults', (ctx, test, driver) => {
  test('a server stalled past the acquire deadline: the acquire ends in time, and nothing is held after', async () => {
    const rl = new RLock(await ctx.client(), { responseTimeoutMs: 300 });
    const lock = rl.lock('f:stall');
    const info = await ctx.admin.info('server');
    const pid = Number(/process_id:(\d+)/.exec(info)?.[1]);
    assert.ok(pid > 0, 'the server pid');
    process.kill(pid, 'SIGSTOP');
    const started = Date.now();
    let outcome: unknown;
    try {
      outcome = await lock.acquire({ waitMs: 200, leaseMs: 10000 }).then(
        (h) => h,
        (e: unknown) => e,
      );
    } finally {
      setTimeout(() => process.kill(pid, 'SIGCONT'), Math.max(0, 1500 - (Date.now() - started)));
    }
    const took = Date.now() - started;
    await until(async () => (await ctx.admin.ping()) === 'PONG', 5000, 'the server to resume');
    // Either it ended before the server woke (a timeout or a stall), or it was granted after:
    // then it holds the lock for real.
    if (outcome instanceof Error) {
      assert.ok(outcome instanceof LockTimeout || outcome instanceof Stalled, `${outcome}`);
      assert.ok(took < 1400, `ended while the server was stopped: ${took} ms`);
      await until(async () => free(ctx.admin, 'f:stall'), 5000, 'nothing left held after the stall');
    } else {
      assert.ok(outcome instanceof Hold, `${String(outcome)}`);
      const hold = outcome;
      assert.ok(!hold.lost);
      const owners = Object.keys(await ctx.admin.hGetAll('f:stall'));
      assert.deepEqual(owners, [hold.owner]);
      await hold.release();
      assert.ok(await free(ctx.admin, 'f:stall'));
    }
    await rl.close();
  });

  test('the wait connection killed mid-wait: the acquire never leaves a hold nobody has', async () => {
    const rl = new RLock(await ctx.client(), { responseTimeoutMs: 500 });
    const holder = await rl.lock('f:kill').acquire({ leaseMs: 10000 });
    const waiting = rl.lock('f:kill').acquire({ waitMs: 3000, leaseMs: 10000 }).then(
      (h) => h,
      (e: unknown) => e,
    );
    await until(async () => (await blockedIn(ctx.admin, 'rlock.acquire')).length === 1, 5000, 'the waiter blocked');
    for (const id of await blockedIn(ctx.admin, 'rlock.acquire')) {
      await ctx.admin.sendCommand(['CLIENT', 'KILL', 'ID', id]);
    }
    await holder.release();
    const outcome = await waiting;
    if (outcome instanceof Error) {
      // it gave up: nothing of it is left on the server once its cancel ran
      await until(async () => free(ctx.admin, 'f:kill'), 5000, 'the lock free');
    } else {
      assert.ok(outcome instanceof Hold, `${String(outcome)}`);
      const hold = outcome;
      assert.deepEqual(Object.keys(await ctx.admin.hGetAll('f:kill')), [hold.owner]);
      await hold.release();
      assert.ok(await free(ctx.admin, 'f:kill'));
    }
    await rl.close();
  });

  test('the client connection killed as the release is sent: the release goes through once', async () => {
    const client = await ctx.client();
    const rl = new RLock(client, { responseTimeoutMs: 500 });
    const hold = await rl.lock('f:release').acquire({ leaseMs: 10000 });
    const me = String(
      driver.name === 'ioredis'
        ? await (client as Redis).call('CLIENT', 'ID')
        : await (client as ReturnType<typeof createClient>).sendCommand(['CLIENT', 'ID']),
    );
    const released = hold.release().then(
      () => null,
      (e: unknown) => e,
    );
    await ctx.admin.sendCommand(['CLIENT', 'KILL', 'ID', me]).catch(() => {});
    const err = await released;
    await until(async () => free(ctx.admin, 'f:release'), 5000, 'the lock released');
    assert.ok(err === null, `release: ${err}`);
    // the lock is free and stays free: no second release of anything
    const next = await rl.lock('f:release').acquire({ leaseMs: 10000 });
    await new Promise((r) => setTimeout(r, 200));
    assert.deepEqual(Object.keys(await ctx.admin.hGetAll('f:release')), [next.owner]);
    await next.release();
    await rl.close();
  });

  test('a wait\'s check delivered late (resent after a reconnect, after the grant was released) takes nothing', async () => {
    // the user's client reconnects 1.2 s after a drop (ioredis then sends again what it sent
    // and was not answered; node-redis fails it)
    let user: unknown;
    let close: () => void;
    let ready: () => boolean;
    if (driver.name === 'ioredis') {
      const c = new Redis({ host: '127.0.0.1', port: ctx.server.port, lazyConnect: true, retryStrategy: () => 1200 });
      c.on('error', () => {});
      await c.connect();
      [user, close, ready] = [c, () => c.disconnect(), () => true];
    } else {
      const c = createClient({ socket: { host: '127.0.0.1', port: ctx.server.port, reconnectStrategy: () => 1200 } });
      c.on('error', () => {});
      await c.connect();
      [user, close, ready] = [c, () => c.destroy(), () => c.isReady];
    }
    const name = 'f:late-check';
    const other = new RLock(await ctx.client());
    // a wait that lasts is checked every second (5 response timeouts, at least 1 s)
    const rl = new RLock(user, { responseTimeoutMs: 100 });
    try {
      const holder = await other.lock(name).acquire({ leaseMs: 10000 });
      const waiting = rl.lock(name).acquire({ waitMs: 8000, leaseMs: 6000 });
      waiting.catch(() => {});
      await until(async () => (await waiters(ctx.admin, name)) === 1, 3000, 'the waiter queued');
      const [waitId] = await blockedIn(ctx.admin, 'rlock.acquire');
      // writes held back: the next check (the same acquire, one try, same request id) waits in
      // the server, unanswered; its connection is then dropped, so the driver owes it
      await ctx.admin.sendCommand(['CLIENT', 'PAUSE', '10000', 'WRITE']);
      try {
        let checkId: string | undefined;
        await until(async () => {
          checkId = (await blockedIn(ctx.admin, 'rlock.acquire')).find((id) => id !== waitId);
          return checkId !== undefined;
        }, 4000, 'the check held by the pause');
        await ctx.admin.sendCommand(['CLIENT', 'KILL', 'ID', checkId!]);
      } finally {
        await ctx.admin.sendCommand(['CLIENT', 'UNPAUSE']);
      }
      await holder.release();
      const h = await waiting;
      assert.deepEqual(Object.keys(await ctx.admin.hGetAll(name)), [h.owner], 'the waiter holds the lock');
      const before = await calls(ctx.admin, 'rlock.acquire');
      await h.release();
      if (driver.name === 'ioredis') {
        await until(async () => (await calls(ctx.admin, 'rlock.acquire')) > before, 4000, 'the dropped check sent again');
      } else {
        await until(ready, 4000, 'the client reconnected');
      }
      assert.equal(await ctx.admin.sendCommand(['RLOCK.INFO', name]), null, `held after its only grant was released: ${JSON.stringify(await ctx.admin.hGetAll(name))}`);
      assert.ok(await free(ctx.admin, name));
    } finally {
      await ctx.admin.sendCommand(['CLIENT', 'UNPAUSE']).catch(() => {});
      await rl.close().catch(() => {});
      await other.close().catch(() => {});
      close();
    }
  });

  test('an ACL user limited to a key pattern: its locks work, others are refused with the typed error', async () => {
    const user = `u${driver.name.replace(/\W/g, '')}`;
    await ctx.admin.sendCommand([
      'ACL', 'SETUSER', user, 'reset', 'on', '>pw', '~app:*', '~rlock_request:*', '~redisson_lock_token:*',
      '~redisson_unlock_latch:*', '&redisson_lock__channel:*', '+@all',
    ]);
    let client: unknown;
    let close: () => void;
    if (driver.name === 'ioredis') {
      const c = new Redis({ host: '127.0.0.1', port: ctx.server.port, username: user, password: 'pw', lazyConnect: true });
      c.on('error', () => {});
      await c.connect();
      client = c;
      close = () => c.disconnect();
    } else {
      const c = createClient({ socket: { host: '127.0.0.1', port: ctx.server.port }, username: user, password: 'pw' });
      c.on('error', () => {});
      await c.connect();
      client = c;
      close = () => c.destroy();
    }
    const rl = new RLock(client);
    const ok = await rl.lock('app:1').acquire({ waitMs: 1000 });
    assert.ok(ok.token > 0n);
    await ok.release();
    assert.ok(await free(ctx.admin, 'app:1'));
    await assert.rejects(rl.lock('other:1').acquire({ waitMs: 0 }), (e: unknown) => {
      assert.ok(e instanceof LockPermissionError, `${e}`);
      assert.equal((e as LockPermissionError).code, 'RLOCK_PERMISSION');
      return true;
    });
    assert.equal(await ctx.admin.exists('other:1'), 0);
    await rl.close();
    close();
  });
});

suite('resp3', (ctx, test, driver) => {
  if (driver.name !== 'node-redis') return; // ioredis speaks RESP2 only
  test('a RESP3 client: grants, tokens, busy, waits and releases read as with RESP2', async () => {
    const c = createClient({ socket: { host: '127.0.0.1', port: ctx.server.port }, RESP: 3 });
    c.on('error', () => {});
    await c.connect();
    const rl = new RLock(c);
    const a = rl.lock('r3');
    const b = rl.lock('r3');
    const first = await a.acquire({ leaseMs: 10000 });
    assert.equal(typeof first.token, 'bigint');
    assert.equal(await b.tryAcquire(), null);
    const waiting = b.acquire({ waitMs: 5000, leaseMs: 10000 });
    await new Promise((r) => setTimeout(r, 50));
    await first.release();
    const second = await waiting;
    assert.ok(second.token > first.token);
    await second.release();
    assert.ok(await free(ctx.admin, 'r3'));
    const sem = rl.semaphore('r3:sem');
    await sem.trySetPermits(1);
    const permits = await sem.acquire({ waitMs: 1000 });
    assert.equal(await sem.available(), 0);
    await permits.release();
    assert.equal(await sem.available(), 1);
    await rl.close();
    c.destroy();
  });
});
