// A node:test reporter that ends the run with one line in the form the repository's CI adds up
// ("test result: ok. N passed; M failed"), as the Rust and Python suites print theirs. Counts
// tests, not the suites around them; a skipped test is neither.
export default async function* summary(source) {
  let passed = 0;
  let failed = 0;
  for await (const event of source) {
    if (event.type !== 'test:pass' && event.type !== 'test:fail') continue;
    const data = event.data;
    if (data.details?.type === 'suite' || data.skip || data.todo) continue;
    if (event.type === 'test:pass') passed += 1;
    else failed += 1;
  }
  const verdict = failed === 0 && passed > 0 ? 'ok' : 'FAILED';
  yield `test result: ${verdict}. ${passed} passed; ${failed} failed (node)\n`;
}
