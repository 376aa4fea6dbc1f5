// dist/cjs holds the CommonJS build (for require() and CommonJS projects,
// e.g. a NestJS application compiled to CommonJS): a package.json there
// tells node and tsc so.
import { writeFileSync } from 'node:fs';

writeFileSync(new URL('../dist/cjs/package.json', import.meta.url), '{ "type": "commonjs" }\n');
