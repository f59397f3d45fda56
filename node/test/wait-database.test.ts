import assert from 'node:assert/strict';
import { createClient } from 'redis';
import { RLock } from '../src/index.js';
import { suite, until } from './harness.js';

/** A client of the server switched to database `db` at run time (SELECT), the way a user may. */
async function select(client: unknown, db: number): Promise<void> {
  await (client as { select(db: number): Promise<unknown> }).select(db);
}


suite('waits in the selected database', (ctx, test) => {
  test('a client switched to another database with SELECT waits for, and is granted, the lock in that database', async () => {
    const client = await ctx.client();
    await select(client, 3);
    const db3 = createClient({ socket: { host: '127.0.0.1', port: ctx.server.port }, database: 3 });
    db3.on('error', () => {});
    await db3.connect();
    try {
      const rl = new RLock(client);
      const holder = await rl.lock('sel:x').acquire({ leaseMs: 20000 });
      assert.ok((await db3.exists('sel:x')) === 1, 'the first (uncontended) hold is in database 3');
      const waiting = rl.lock('sel:x').acquire({ waitMs: 5000, leaseMs: 20000 });
      // the waiter must queue behind the holder in database 3, not be granted a lock of the
      // same name in database 0
      await until(async () => Number(((await db3.sendCommand(['RLOCK.INFO', 'sel:x'])) as unknown as unknown[] | null)?.[7] ?? 0) === 1 || (await ctx.admin.exists('sel:x')) === 1, 5000, 'the waiter queued (or granted in database 0)');
      assert.equal(await ctx.admin.exists('sel:x'), 0, 'nothing taken in database 0');
      await holder.release();
      const h = await waiting;
      assert.equal(await ctx.admin.exists('sel:x'), 0, 'nothing held in database 0');
      assert.equal(await db3.exists('sel:x'), 1, 'the waiter holds the lock in database 3');
      await h.release();
      assert.equal(await db3.exists('sel:x'), 0);
      // a latch and a session are in that database too
      await rl.latch('sel:l').trySetCount(1);
      assert.equal(await db3.exists('sel:l'), 1, 'the latch in database 3');
      const opened = rl.latch('sel:l').await({ waitMs: 5000 });
      await until(async () => String(await db3.sendCommand(['CLIENT', 'LIST'])).includes('cmd=rlatch.await'), 5000, 'the latch awaited');
      await rl.latch('sel:l').countDown();
      assert.equal(await opened, true, 'the await in database 3 saw the latch open');
      const session = await rl.session();
      const sh = await session.lock('sel:s').acquire({ leaseMs: 20000 });
      assert.equal(await db3.exists('sel:s'), 1, 'the session hold in database 3');
      assert.equal(await ctx.admin.exists('sel:s'), 0);
      await sh.release();
      await session.close();
      await rl.close();
    } finally {
      db3.destroy();
    }
  });
});
