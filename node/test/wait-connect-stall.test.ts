import assert from 'node:assert/strict';
import { RLock } from '../src/index.js';
import { suite, until } from './harness.js';

suite('a slow wait connection', (ctx, test) => {
  test('an acquire without a wait limit whose wait connection is slow to open (a stalled server) waits on, and is granted', async () => {
    const admin = new RLock(await ctx.client());
    const holder = await admin.lock('slow:c').acquire({ leaseMs: 20000 });
    const rl = new RLock(await ctx.client(), { responseTimeoutMs: 300 });
    ctx.server.signal('SIGSTOP');
    let settled: unknown = 'pending';
    const waiting = rl.lock('slow:c').acquire({ leaseMs: 20000 });
    waiting.then(
      () => (settled = 'granted'),
      (e: unknown) => (settled = e),
    );
    try {
      // the try and the connection's opening both stall for several response timeouts
      await new Promise((r) => setTimeout(r, 2000));
    } finally {
      ctx.server.signal('SIGCONT');
    }
    await holder.release();
    await until(() => settled !== 'pending', 10000, 'the acquire to settle');
    assert.equal(settled, 'granted', `an acquire without a limit is granted once the lock is free: ${String(settled)}`);
    await (await waiting).release();
    await rl.close();
    await admin.close();
  });
});

suite('a slow latch wait connection', (ctx, test) => {
  test('a latch wait without a limit whose connection is slow to open (a stalled server) waits on, and sees the latch open', async () => {
    const admin = new RLock(await ctx.client());
    await admin.latch('slow:l').trySetCount(1);
    const rl = new RLock(await ctx.client(), { responseTimeoutMs: 300 });
    ctx.server.signal('SIGSTOP');
    let settled: unknown = 'pending';
    const waiting = rl.latch('slow:l').await();
    waiting.then(
      (v) => (settled = v),
      (e: unknown) => (settled = e),
    );
    try {
      await new Promise((r) => setTimeout(r, 2000));
    } finally {
      ctx.server.signal('SIGCONT');
    }
    await until(async () => (await admin.latch('slow:l').count()) === 1, 5000, 'the server back');
    assert.equal(settled, 'pending', `still waiting while the latch is closed: ${String(settled)}`);
    await admin.latch('slow:l').countDown();
    await until(() => settled !== 'pending', 10000, 'the latch wait to settle');
    assert.equal(settled, true);
    await rl.close();
    await admin.close();
  });
});
