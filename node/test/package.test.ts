import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { describe, it } from 'node:test';

// the built package, through its own `exports` map (npm test builds it first)
const require = createRequire(import.meta.url);
// a specifier the type checker does not resolve: it checks the sources, the test the build
const PKG: string = 'redis-rlock';

describe('package', () => {
  it('is importable as ESM and requirable as CommonJS, with declarations for both', async () => {
    const esm = (await import(PKG)) as Record<string, unknown>;
    const cjs = require(PKG) as Record<string, unknown>;
    for (const name of ['RLock', 'Lock', 'Hold', 'withLock', 'Semaphore', 'LeasedSemaphore', 'LockLost', 'InvalidArgument', 'fromReply']) {
      assert.equal(typeof esm[name], 'function', `import: ${name}`);
      assert.equal(typeof cjs[name], 'function', `require: ${name}`);
    }
    const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as {
      exports: Record<string, Record<string, Record<string, string>>>;
      dependencies?: object;
    };
    assert.equal(pkg.dependencies, undefined, 'no runtime dependency');
    for (const cond of ['import', 'require']) {
      const types = pkg.exports['.']![cond]!.types!;
      assert.ok(existsSync(new URL(`../../${types}`, import.meta.url)), `${cond} types: ${types}`);
    }
  });

  it('maps server error replies to typed errors with stable codes', async () => {
    const { fromReply } = (await import(PKG)) as typeof import('../src/index.js');
    const cases: [string, string, string][] = [
      ["ERR unknown command 'RLOCK.ACQUIRE', with args beginning with: ", 'ModuleMissing', 'RLOCK_MODULE_MISSING'],
      ['WRONGTYPE Operation against a key holding the wrong kind of value', 'WrongType', 'RLOCK_WRONG_TYPE'],
      ['NOREPLICAS this master grants nothing', 'NoReplicas', 'RLOCK_NO_REPLICAS'],
      ['NOPERM this user has no permissions to access one of the keys', 'LockPermissionError', 'RLOCK_PERMISSION'],
      ['ERR upgrade refused: the owner holds the read side', 'UpgradeRefused', 'RLOCK_UPGRADE_REFUSED'],
      ['ERR lease-ms must be positive', 'RLockError', 'RLOCK_ERROR'],
    ];
    for (const [msg, cls, code] of cases) {
      const e = fromReply(msg, 'k');
      assert.equal(e.name, cls, msg);
      assert.equal(e.code, code, msg);
      assert.equal(e.lockName, 'k');
    }
    const d = fromReply('DEADLOCK this wait would close a cycle: b waits for k1 held by a; a waits for k2 held by b', 'k2');
    assert.equal(d.code, 'RLOCK_DEADLOCK');
    assert.equal((d as unknown as { cycle: string }).cycle, 'b waits for k1 held by a; a waits for k2 held by b');
  });
});
