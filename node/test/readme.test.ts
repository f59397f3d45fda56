import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import * as pkg from '../src/index.js';
import { suite } from './harness.js';

/** The package's directory (README.md, dist/, node_modules). */
const PACKAGE_DIR = fileURLToPath(new URL('../../', import.meta.url));

interface Example {
  line: number;
  code: string;
  /** Why it is not run (`<!-- not run: why -->` on the line before its fence), or null. */
  notRun: string | null;
}

/** Every ```ts block of the README. */
function examples(): Example[] {
  const lines = readFileSync(`${PACKAGE_DIR}README.md`, 'utf8').split('\n');
  const out: Example[] = [];
  for (let i = 0; i < lines.length; i++) {
    if (lines[i] !== '```ts') continue;
    const start = i;
    const body: string[] = [];
    for (i++; i < lines.length && lines[i] !== '```'; i++) body.push(lines[i]!);
    const before = lines.slice(Math.max(0, start - 2), start).join('\n');
    const m = /<!-- not run: (.+?) -->/.exec(before);
    out.push({ line: start + 1, code: body.join('\n'), notRun: m ? m[1]! : null });
  }
  return out;
}

/** The names `code` declares itself (imports, const/let/using, destructuring). */
function declared(code: string): Set<string> {
  const names = new Set<string>();
  for (const m of code.matchAll(/import\s*\{([^}]*)\}/g)) for (const n of m[1]!.split(',')) names.add(n.trim().split(/\s+as\s+/).pop()!);
  for (const m of code.matchAll(/\b(?:const|let|var|using)\s+(\w+)/g)) names.add(m[1]!);
  for (const m of code.matchAll(/\bconst\s*\{([^}]*)\}\s*=/g)) for (const n of m[1]!.split(',')) names.add(n.trim());
  return names;
}

/** `code` as a module run against the server at `url`: the package's exports, `client` (a
 * node-redis client), `rlock`, and the helpers the examples call, unless it declares them. */
function program(code: string, url: string): string {
  const own = declared(code);
  const given: Record<string, string> = {
    client: `await (await import('redis')).createClient({ url: '${url}' }).connect()`,
    rlock: 'new RLock(client)',
    doWork: 'async (signal, token) => { if (signal.aborted || typeof token !== "bigint") throw new Error("doWork: a hold without a live signal or a bigint token"); }',
    log: '(...a) => console.log(...a)',
    stepDown: '() => {}',
    signal: 'AbortSignal.timeout(60_000)',
  };
  const prelude = [`import * as __rl from './dist/esm/index.js';`];
  for (const name of Object.keys(pkg)) if (!own.has(name)) prelude.push(`const ${name} = __rl.${name};`);
  for (const [name, value] of Object.entries(given)) if (!own.has(name)) prelude.push(`const ${name} = ${value};`);
  const body = code.replaceAll(`'redis-rlock'`, `'./dist/esm/index.js'`).replaceAll('redis://127.0.0.1:6390', url);
  const src = `${prelude.join('\n')}\n${body}\nprocess.exit(0);\n`;
  return ts.transpileModule(src, { compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 } }).outputText;
}

function run(src: string): Promise<{ code: number | null; out: string; err: string }> {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, ['--input-type=module', '--unhandled-rejections=strict', '-e', src], { cwd: PACKAGE_DIR });
    let out = '';
    let err = '';
    const timer = setTimeout(() => p.kill('SIGKILL'), 30_000);
    p.stdout.on('data', (d: Buffer) => (out += d.toString()));
    p.stderr.on('data', (d: Buffer) => (err += d.toString()));
    p.on('exit', (code) => (clearTimeout(timer), resolve({ code, out, err })));
  });
}

suite('README examples', (ctx, test, driver) => {
  if (driver.name !== 'node-redis') return; // the examples are written for node-redis
  test('every ts example of node/README.md runs against a server with the module (or says why not)', async () => {
    const all = examples();
    assert.ok(all.length >= 8, `found only ${all.length} examples`);
    for (const ex of all) {
      if (ex.notRun !== null) continue;
      await ctx.admin.flushAll();
      const r = await run(program(ex.code, `redis://127.0.0.1:${ctx.server.port}`));
      assert.equal(r.code, 0, `the example at README.md line ${ex.line} failed:\n${r.err}\n${r.out}`);
    }
    assert.ok(all.filter((e) => e.notRun !== null).length <= 1, 'at most the cluster/sentinel example is not run');
  });
});
