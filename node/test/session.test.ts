import assert from 'node:assert/strict';
import { LockLost, RLock, SessionClosed } from '../src/index.js';
import { free, hash, suite, until, type Admin } from './harness.js';

async function sessionHolds(admin: Admin): Promise<number> {
  const info = await admin.info('rlock');
  return Number(/rlock_session_holds:(\d+)/.exec(info)?.[1] ?? NaN);
}

async function lockWaiters(admin: Admin, name: string): Promise<number> {
  const info = (await admin.sendCommand(['RLOCK.INFO', name])) as unknown[] | null;
  return info === null ? 0 : Number(info[7]);
}

suite('session', (ctx, test) => {
  test('closing the session ends its holds on the server at once; their signals abort; later acquires throw SessionClosed', async () => {
    const rl = new RLock(await ctx.client());
    const session = await rl.session();
    const hold = await session.lock('s:close').acquire({ leaseMs: 60000 });
    const read = await session.rwLock('s:close-rw').read.acquire({ leaseMs: 60000 });
    assert.deepEqual(Object.keys(await hash(ctx.admin, 's:close')), [hold.owner]);
    assert.equal(await sessionHolds(ctx.admin), 2, 'both bound to the session');
    await session.close();
    await until(async () => (await free(ctx.admin, 's:close')) && (await ctx.admin.exists('s:close-rw')) === 0, 3000, 'the holds ended on the server');
    assert.ok(hold.signal.aborted && read.signal.aborted);
    assert.ok(hold.signal.reason instanceof LockLost);
    assert.ok(session.signal.reason instanceof SessionClosed);
    await assert.rejects(session.lock('s:close').acquire({ waitMs: 0 }), SessionClosed);
    await assert.rejects(hold.release(), LockLost);
    await rl.close();
  });

  test('the session\'s connection killed: its holds end on the server and their signals abort', async () => {
    const rl = new RLock(await ctx.client());
    const session = await rl.session();
    const hold = await session.lock('s:killed').acquire(); // watchdog lease: 30 s
    await ctx.admin.sendCommand(['CLIENT', 'KILL', 'ID', String(session.clientId)]);
    await until(() => hold.signal.aborted, 3000, 'the hold\'s signal aborted');
    assert.ok(session.closed);
    assert.ok(await free(ctx.admin, 's:killed'), 'freed long before its lease');
    await rl.close();
  });

  test('lockDelayMs keeps the lock from everyone for a while after the connection died', async () => {
    const rl = new RLock(await ctx.client());
    const session = await rl.session({ lockDelayMs: 400 });
    await session.lock('s:delay').acquire({ leaseMs: 60000 });
    await ctx.admin.sendCommand(['CLIENT', 'KILL', 'ID', String(session.clientId)]);
    await until(async () => Object.keys(await hash(ctx.admin, 's:delay'))[0] === 'rlock:lockdelay', 3000, 'the lock-delay placeholder');
    const t0 = Date.now();
    const next = await rl.lock('s:delay').acquire({ waitMs: 5000, leaseMs: 10000 });
    const waited = Date.now() - t0;
    assert.ok(waited >= 250, `waited ${waited} ms for the delay`);
    await next.release();
    await rl.close();
  });

  test('a session acquire that waits is granted on hand-off, bound to the session; a release ends the binding', async () => {
    const rl = new RLock(await ctx.client());
    const holder = await rl.lock('s:wait').acquire({ leaseMs: 10000 });
    const session = await rl.session();
    const waiting = session.lock('s:wait').acquire({ waitMs: 5000, leaseMs: 60000 });
    await until(async () => (await lockWaiters(ctx.admin, 's:wait')) === 1, 5000, 'queued');
    await holder.release();
    const hold = await waiting;
    assert.equal(await sessionHolds(ctx.admin), 1);
    const again = await session.lock('s:wait2').acquire({ waitMs: 0, leaseMs: 60000 }); // the connection is free again
    await again.release();
    await hold.release();
    assert.ok(await free(ctx.admin, 's:wait'));
    assert.equal(await sessionHolds(ctx.admin), 0);
    // an acquire that waits on a closed session's connection ends with SessionClosed
    const blocker = await rl.lock('s:wait').acquire({ leaseMs: 10000 });
    const pending = session.lock('s:wait').acquire({ waitMs: 5000 });
    await until(async () => (await lockWaiters(ctx.admin, 's:wait')) === 1, 5000, 'queued');
    await session.close();
    await assert.rejects(pending, SessionClosed);
    assert.equal(await lockWaiters(ctx.admin, 's:wait'), 0);
    await blocker.release();
    assert.ok(await free(ctx.admin, 's:wait'));
    await rl.close();
  });

  test('an aborted session wait leaves the queue, and the session\'s connection serves the next acquire at once', async () => {
    const rl = new RLock(await ctx.client());
    const holder = await rl.lock('s:abort').acquire({ leaseMs: 10000 });
    const session = await rl.session();
    const ac = new AbortController();
    const waiting = session.lock('s:abort').acquire({ signal: ac.signal });
    const queuedBehind = new AbortController();
    const behind = session.lock('s:abort-other').acquire({ signal: queuedBehind.signal }); // waits for the connection
    await until(async () => (await lockWaiters(ctx.admin, 's:abort')) === 1, 5000, 'queued');
    queuedBehind.abort();
    await assert.rejects(behind, { name: 'AbortError' });
    ac.abort();
    await assert.rejects(waiting, { name: 'AbortError' });
    assert.equal(await lockWaiters(ctx.admin, 's:abort'), 0);
    const t0 = Date.now();
    const next = await session.lock('s:abort-other').acquire({ waitMs: 0, leaseMs: 10000 });
    assert.ok(Date.now() - t0 < 1000, 'the connection was free again');
    assert.ok(!session.closed);
    await next.release();
    await holder.release();
    assert.ok((await free(ctx.admin, 's:abort')) && (await free(ctx.admin, 's:abort-other')));
    await session.close();
    await rl.close();
  });
});
