import assert from 'node:assert/strict';
import { adapt, LockLost, LockTimeout, RLock, UpgradeRefused, type Arg, type Connection } from '../src/index.js';
import { calls, suite, until, type Admin } from './harness.js';

/** RWLOCK.INFO as a plain object (null: free). */
async function info(admin: Admin, name: string): Promise<Record<string, unknown> | null> {
  const r = (await admin.sendCommand(['RWLOCK.INFO', name])) as unknown[] | null;
  if (r === null) return null;
  const o: Record<string, unknown> = {};
  for (let i = 0; i + 1 < r.length; i += 2) o[String(r[i])] = r[i + 1];
  return o;
}

async function waiting(admin: Admin, name: string): Promise<number> {
  const i = await info(admin, name);
  return i === null ? 0 : Number(i.waiting_readers) + Number(i.waiting_writers);
}

/** A connection that calls `onGrant` when a reply granting an `RWLOCK.ACQUIRE` comes in, before
 * the client reads it (its duplicates too). */
function spying(inner: Connection, onGrant: () => void): Connection {
  return {
    async send(args: readonly Arg[]) {
      const reply = await inner.send(args);
      if (String(args[0]).toUpperCase() === 'RWLOCK.ACQUIRE' && (reply === null || (Array.isArray(reply) && Number(reply[0]) === 1))) onGrant();
      return reply;
    },
    async duplicate() {
      return spying(await inner.duplicate(), onGrant);
    },
    close: () => inner.close(),
    onDeath: (l) => inner.onDeath(l),
  };
}

suite('rwlock', (ctx, test) => {
  test('readers share the lock on Redisson\'s layout; a writer waits until the last reader leaves', async () => {
    const rl = new RLock(await ctx.client());
    const a = await rl.rwLock('rw:share').read.acquire({ leaseMs: 10000 });
    const b = await rl.rwLock('rw:share').read.acquire({ leaseMs: 10000 });
    assert.notEqual(a.owner, b.owner);
    const h = { ...(await ctx.admin.hGetAll('rw:share')) };
    assert.deepEqual(h, { mode: 'read', [a.owner]: '1', [b.owner]: '1' });
    assert.equal(a.token, 0n); // read holds carry no fencing token
    const w = rl.rwLock('rw:share').write;
    assert.equal(await w.tryAcquire(), null);
    const writing = w.acquire({ waitMs: 10000, leaseMs: 10000 });
    await until(async () => (await waiting(ctx.admin, 'rw:share')) === 1, 5000, 'the writer queued');
    await a.release();
    assert.equal(await waiting(ctx.admin, 'rw:share'), 1, 'still waits for the second reader');
    await b.release();
    const wh = await writing;
    assert.equal((await info(ctx.admin, 'rw:share'))?.mode, 'write');
    assert.equal(await ctx.admin.hGet('rw:share', `${wh.owner}:write`), '1');
    assert.ok(wh.token > 0n);
    await wh.release();
    await wh.release(); // idempotent
    assert.equal(await info(ctx.admin, 'rw:share'), null);
    await rl.close();
  });

  test('holding write, the same handle reads at once; releasing write downgrades to read', async () => {
    const rl = new RLock(await ctx.client());
    const rw = rl.rwLock('rw:down');
    const w = await rw.write.acquire({ leaseMs: 10000 });
    const r = await rw.read.acquire({ waitMs: 0, leaseMs: 10000 });
    assert.equal(r.owner, w.owner, 'both sides one owner');
    await w.release();
    assert.equal((await info(ctx.admin, 'rw:down'))?.mode, 'read');
    assert.ok(rw.read.isHeld() && !rw.write.isHeld());
    // another handle's writer waits for that read hold
    assert.equal(await rl.rwLock('rw:down').write.tryAcquire(), null);
    await r.release();
    assert.equal(await info(ctx.admin, 'rw:down'), null);
    await rl.close();
  });

  test('an upgrade (write while holding read) is refused with UpgradeRefused: by the server for a wait, at once for a one-try', async () => {
    const rl = new RLock(await ctx.client());
    const rw = rl.rwLock('rw:upgrade');
    const r = await rw.read.acquire({ leaseMs: 10000 });
    const sent = await calls(ctx.admin, 'rwlock.acquire');
    const t0 = Date.now();
    await assert.rejects(rw.write.acquire({ waitMs: 5000 }), (e) => e instanceof UpgradeRefused && e.code === 'RLOCK_UPGRADE_REFUSED' && /upgrade refused/.test(e.message));
    assert.ok(Date.now() - t0 < 2000, 'refused at once, not after the wait');
    // a try first (not granted: the read hold is in the way), then the wait the server refuses
    assert.equal(await calls(ctx.admin, 'rwlock.acquire'), sent + 2, 'the server was asked and refused');
    await assert.rejects(rw.write.tryAcquire(), UpgradeRefused);
    assert.equal(await calls(ctx.admin, 'rwlock.acquire'), sent + 2, 'a one-try sends nothing');
    assert.equal(await waiting(ctx.admin, 'rw:upgrade'), 0);
    assert.ok(rw.read.isHeld());
    await r.release();
    // with the read hold gone, the write side is an ordinary acquire
    const w = await rw.write.acquire({ waitMs: 0, leaseMs: 10000 });
    await w.release();
    await rl.close();
  });

  test('re-entry of each side counts on the client; the server keeps count 1 per side', async () => {
    const rl = new RLock(await ctx.client());
    const rw = rl.rwLock('rw:reenter');
    const r1 = await rw.read.acquire({ leaseMs: 10000 });
    const r2 = await rw.read.acquire({ leaseMs: 10000 });
    assert.equal(await ctx.admin.hGet('rw:reenter', r1.owner), '1');
    await r1.release();
    assert.ok(rw.read.isHeld());
    assert.equal(await ctx.admin.hGet('rw:reenter', r2.owner), '1');
    await r2.release();
    assert.equal(await info(ctx.admin, 'rw:reenter'), null);
    await rl.close();
  });

  test('FIFO: a writer waiting keeps later readers behind it; grants go in queue order', async () => {
    const rl = new RLock(await ctx.client());
    const holder = await rl.rwLock('rw:fifo').write.acquire({ leaseMs: 10000 });
    const order: string[] = [];
    const entries: [string, 'read' | 'write'][] = [['r1', 'read'], ['w2', 'write'], ['r3', 'read'], ['w4', 'write']];
    const tasks: Promise<void>[] = [];
    for (const [i, [tag, side]] of entries.entries()) {
      tasks.push(
        rl.rwLock('rw:fifo')[side].acquire({ waitMs: 10000, leaseMs: 10000 }).then(async (h) => {
          order.push(tag);
          await new Promise((r) => setTimeout(r, 30)); // others may be granted meanwhile only if they share
          order.push(`/${tag}`);
          await h.release();
        }),
      );
      await until(async () => (await waiting(ctx.admin, 'rw:fifo')) === i + 1, 5000, `${tag} queued`);
    }
    await holder.release();
    await Promise.all(tasks);
    assert.deepEqual(order, ['r1', '/r1', 'w2', '/w2', 'r3', '/r3', 'w4', '/w4']);
    assert.equal(await info(ctx.admin, 'rw:fifo'), null);
    await rl.close();
  });

  test('a wait that times out throws LockTimeout and leaves nothing queued', async () => {
    const rl = new RLock(await ctx.client());
    const r = await rl.rwLock('rw:timeout').read.acquire({ leaseMs: 10000 });
    await assert.rejects(rl.rwLock('rw:timeout').write.acquire({ waitMs: 150 }), LockTimeout);
    assert.equal(await waiting(ctx.admin, 'rw:timeout'), 0);
    await r.release();
    await rl.close();
  });

  test('the watchdog renews a hold taken without a lease; a force-release aborts its signal with LockLost', async () => {
    const rl = new RLock(await ctx.client(), { watchdogMs: 300 });
    const rw = rl.rwLock('rw:watchdog');
    const w = await rw.write.acquire();
    const r = await rw.read.acquire();
    await new Promise((res) => setTimeout(res, 700));
    assert.ok(!w.lost && !r.lost);
    assert.ok(Number(await ctx.admin.pTTL('rw:watchdog')) > 0, 'still held past its lease');
    assert.ok(w.validUntil > Date.now());
    await ctx.admin.sendCommand(['RWLOCK.FORCERELEASE', 'rw:watchdog']);
    await until(() => w.signal.aborted && r.signal.aborted, 3000, 'both signals aborted');
    assert.ok(w.signal.reason instanceof LockLost);
    await assert.rejects(w.release(), LockLost);
    await assert.rejects(r.release(), LockLost);
    await rl.close();
  });

  test('await using releases both sides at the end of the block', async () => {
    const rl = new RLock(await ctx.client());
    {
      await using w = await rl.rwLock('rw:using').write.acquire({ leaseMs: 10000 });
      assert.ok(w.token > 0n);
      assert.notEqual(await info(ctx.admin, 'rw:using'), null);
    }
    assert.equal(await info(ctx.admin, 'rw:using'), null);
    await rl.close();
  });

  test('aborts at every await: before sending, in the turn, during the wait, landing with the grant', async () => {
    const rl = new RLock(await ctx.client());
    const before = await calls(ctx.admin, 'rwlock.acquire');
    const pre = new AbortController();
    pre.abort(new Error('stop'));
    await assert.rejects(rl.rwLock('rw:abort').read.acquire({ signal: pre.signal }), /stop/);
    assert.equal(await calls(ctx.admin, 'rwlock.acquire'), before, 'nothing sent');

    // during the wait (write behind a reader), and in the turn (a second acquire of that handle)
    const reader = await rl.rwLock('rw:abort').read.acquire({ leaseMs: 10000 });
    const rw = rl.rwLock('rw:abort');
    const ac = new AbortController();
    const w = rw.write.acquire({ signal: ac.signal });
    const turn = new AbortController();
    const r = rw.read.acquire({ signal: turn.signal }); // waits for the write acquire's turn
    await until(async () => (await waiting(ctx.admin, 'rw:abort')) === 1, 5000, 'the writer queued');
    turn.abort();
    await assert.rejects(r, { name: 'AbortError' });
    ac.abort();
    await assert.rejects(w, { name: 'AbortError' });
    assert.equal(await waiting(ctx.admin, 'rw:abort'), 0);
    assert.ok(!rw.read.isHeld() && !rw.write.isHeld());

    // landing with the grant: the hold is given back
    const grant = new AbortController();
    const spy = new RLock(spying(adapt(await ctx.client()), () => grant.abort()));
    const landing = spy.rwLock('rw:abort').write.acquire({ signal: grant.signal, leaseMs: 10000 });
    await until(async () => (await waiting(ctx.admin, 'rw:abort')) === 1, 5000, 'the writer queued');
    await reader.release(); // hands it to the writer, whose reply aborts its signal
    await assert.rejects(landing, { name: 'AbortError' });
    assert.equal(await info(ctx.admin, 'rw:abort'), null, 'nothing held afterwards');
    const grant2 = new AbortController();
    const spy2 = new RLock(spying(adapt(await ctx.client()), () => grant2.abort()));
    await assert.rejects(spy2.rwLock('rw:abort').read.tryAcquire({ signal: grant2.signal }), { name: 'AbortError' });
    assert.equal(await info(ctx.admin, 'rw:abort'), null, 'the one-try read given back');
    await spy.close();
    await spy2.close();
    await rl.close();
  });
});
