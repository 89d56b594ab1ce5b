// Vendors the console's third-party ES modules into this folder: `make vendor`
// (or `node gateway/static/vendor/build.mjs`). Needs node and npm, and only the
// npm registry; `make run` and the wheel need neither (the output is committed).
//
// 1. `npm ci` of this folder's package.json + package-lock.json (exact pins) in
//    a temporary folder, so no node_modules ever sits in the served tree.
// 2. Copies each package's own browser ES module build (no bundler, no
//    rewriting but the dropped source-map comment: the maps are not vendored),
//    after checking the installed version is the pinned one, and a gzip copy
//    beside each (`<file>.gz`), which the gateway's static handler sends to
//    browsers that accept gzip: a fraction of the bytes on the wire.
// 3. Writes THIRD-PARTY-LICENSES.txt (every installed package's license: the
//    markdown-it build bundles its dependencies) and vendor.json: for each
//    file, its package, version, source path and sha256. tests/test_vendor.py
//    checks those against the pins, the lock and the files, so a hand edit
//    or a half-done update fails the suite.
//
// To update: change a version in package.json, run
// `npm install --package-lock-only --ignore-scripts` here, then `make vendor`,
// and commit all of this folder.

import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { cpSync, existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { gzipSync } from "node:zlib";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const HERE = dirname(fileURLToPath(import.meta.url));

// What the console imports: ./vendor/<file> (served as text/javascript: .js).
const FILES = [
  { pkg: "markdown-it", source: "dist/browser/markdown-it.esm.min.mjs", file: "markdown-it.js" },
  { pkg: "dompurify", source: "dist/purify.es.mjs", file: "purify.js" },
];

const pins = JSON.parse(readFileSync(join(HERE, "package.json"), "utf8")).dependencies;
const work = mkdtempSync(join(tmpdir(), "runlog-vendor-"));
try {
  for (const f of ["package.json", "package-lock.json"]) cpSync(join(HERE, f), join(work, f));
  execFileSync("npm", ["ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
    { cwd: work, stdio: "inherit" });
  const modules = join(work, "node_modules");
  const manifest = {};
  for (const { pkg, source, file } of FILES) {
    const meta = JSON.parse(readFileSync(join(modules, pkg, "package.json"), "utf8"));
    if (meta.version !== pins[pkg]) throw new Error(`${pkg}: installed ${meta.version}, pinned ${pins[pkg]}`);
    const text = readFileSync(join(modules, pkg, source), "utf8")
      .replace(/\n\/\/# sourceMappingURL=\S+\s*$/, "\n");
    writeFileSync(join(HERE, file), text);
    writeFileSync(join(HERE, `${file}.gz`), gzipSync(text, { level: 9 }));
    manifest[file] = {
      package: pkg,
      version: meta.version,
      source,
      license: meta.license,
      sha256: createHash("sha256").update(text).digest("hex"),
    };
  }
  writeFileSync(join(HERE, "vendor.json"), JSON.stringify(manifest, null, 2) + "\n");
  writeFileSync(join(HERE, "THIRD-PARTY-LICENSES.txt"), licenses(modules));
  console.log(Object.entries(manifest).map(([f, m]) => `${f}: ${m.package} ${m.version}`).join("\n"));
} finally {
  rmSync(work, { recursive: true, force: true });
}

function licenses(modules) {
  const names = [];
  for (const d of readdirSync(modules).sort()) {
    if (d.startsWith(".")) continue;
    if (d.startsWith("@")) names.push(...readdirSync(join(modules, d)).sort().map((s) => `${d}/${s}`));
    else names.push(d);
  }
  const out = [];
  for (const name of names) {
    const dir = join(modules, name);
    const meta = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"));
    const files = readdirSync(dir).filter((f) => /^(licen[cs]e|copying)/i.test(f)).sort();
    out.push(`${"=".repeat(72)}\n${name} ${meta.version} (${meta.license})\n${"=".repeat(72)}\n`);
    for (const f of files) out.push(readFileSync(join(dir, f), "utf8").trimEnd() + "\n\n");
    if (!files.length && existsSync(dir)) out.push("(no license file in the package)\n\n");
  }
  return out.join("");
}
