import assert from 'node:assert/strict';
import { RLock } from '../src/index.js';
import { free, hash, suite } from './harness.js';

interface Handle {
  acquire(o?: { waitMs?: number; leaseMs?: number }): Promise<{ owner: string; release(): Promise<void> }>;
}

suite('reentry', (ctx, test) => {
  const kinds: [string, (rl: RLock, name: string) => Handle][] = [
    ['a lock handle', (rl, name) => rl.lock(name)],
    ['an owner\'s lock', (rl, name) => rl.owner().lock(name)],
    ['a read-write lock\'s write side', (rl, name) => rl.rwLock(name).write],
  ];
  for (const [what, make] of kinds) {
    test(`${what}: a re-entry racing the last release takes a fresh hold, never a lost one`, async () => {
      const rl = new RLock(await ctx.client());
      const name = `re:${what.replace(/\W+/g, '-')}`;
      const handle = make(rl, name);
      for (let i = 0; i < 5; i++) {
        const first = await handle.acquire({ leaseMs: 10000 });
        const second = handle.acquire({ waitMs: 2000, leaseMs: 10000 }); // a re-entry, in flight
        await first.release(); // the last release of the hold it re-enters
        const h = await second;
        const fields = await hash(ctx.admin, name);
        assert.ok(Object.keys(fields).some((f) => f.startsWith(h.owner)), `round ${i}: held on the server (${JSON.stringify(fields)})`);
        await h.release();
        assert.ok(await free(ctx.admin, name), `round ${i}: free after the release`);
      }
      await rl.close();
    });
  }
});
