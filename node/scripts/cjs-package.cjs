// Marks the CommonJS build as CommonJS (the package itself is "type": "module").
require('node:fs').writeFileSync(__dirname + '/../dist/cjs/package.json', '{ "type": "commonjs" }\n');
