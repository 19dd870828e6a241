// assemble-snippet.mjs - the last step of scripts/build-snippet.sh: turns wasm-bindgen's
// output into the files a page downloads, in static/.
//
//   node scripts/assemble-snippet.mjs BINDGEN_DIR JS_DIR OUT_DIR
//
// BINDGEN_DIR holds tally_client.js (glue) and tally_client_bg.wasm (already wasm-opt'ed);
// JS_DIR holds host.js and loader.js (and JS_DIR/../src/ops.rs defines the operation codes
// they name). Needs terser, @gfx/zopfli and brotli-wasm, found through the NODE_PATH-like env
// SNIPPET_NODE_MODULES (set by build-snippet.sh, which pins their versions).
//
// Contract of the output (what server/src/http/assets.rs and the loader rely on):
// - OUT/tally-<hash>.js: the glue with js/host.js inlined in place of its import (so the page
//   loads one module), minified; <hash> = first 8 hex of its SHA-256 (each byte of a name is downloaded).
// - OUT/tally-<hash>.wasm: the module; <hash> likewise. Both names are immutable.
// - OUT/tally.js: the loader, minified, pointing at those two names relative to itself.
// - Beside each of the three, NAME.gz (zopfli) and NAME.br (brotli q11) of the same bytes.
// - OUT/manifest.rs: Rust constants naming and embedding the three files in each encoding.
// - Older tally-*.js / tally-*.wasm (and their .gz / .br) in OUT are removed.
import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync, readdirSync, unlinkSync, mkdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';

const [bindgenDir, jsDir, outDir] = process.argv.slice(2);
if (!outDir) throw new Error('usage: assemble-snippet.mjs BINDGEN_DIR JS_DIR OUT_DIR');
const modules = process.env.SNIPPET_NODE_MODULES;
if (!modules) throw new Error('SNIPPET_NODE_MODULES must point at a node_modules with terser');
const need = createRequire(join(modules, 'x.js'));
const { minify } = need('terser');

const stripComments = (src) => src.split('\n').filter((l) => !/^\s*\/\//.test(l)).join('\n');

// 0. The operation codes. src/ops.rs defines each one once, as a `#[repr(u32)] pub enum` whose
//    variants are `Name = number,` lines; the JS sources name them (`Op.Start`, `Num.Later`,
//    `Flag.Consent`) and get the numbers here. An unknown name stops the build.
const opsRs = readFileSync(join(jsDir, '..', 'src', 'ops.rs'), 'utf8');
const codes = {};
for (const [, name, body] of opsRs.matchAll(/^#\[repr\(u32\)\]\npub enum (\w+) \{\n([\s\S]*?)^\}/gm)) {
  codes[name] = Object.fromEntries([...body.matchAll(/^ {4}(\w+) = (\d+),$/gm)].map(([, v, n]) => [v, n]));
}
for (const e of ['Op', 'Num', 'Flag']) {
  if (!codes[e] || !Object.keys(codes[e]).length) throw new Error(`src/ops.rs: no enum ${e} with codes`);
}
const withCodes = (src, file) => src.replace(/\b(Op|Num|Flag)\.(\w+)\b/g, (_, e, v) => {
  if (!(v in codes[e])) throw new Error(`${file}: ${e}.${v} is not defined in src/ops.rs`);
  return codes[e][v];
});

// 1. Inline host.js into the glue. wasm-bindgen imports it twice: named imports for the
//    functions it wraps, and a namespace object for those it passes straight to the module.
let glue = readFileSync(join(bindgenDir, 'tally_client.js'), 'utf8');
const host = withCodes(stripComments(readFileSync(join(jsDir, 'host.js'), 'utf8')), 'host.js');
const exported = [...host.matchAll(/^export function (\w+)/gm)].map((m) => m[1]);
const hostBody = host.replace(/^export function /gm, 'function ');
const named = /^import \{[^}]*\} from ['"]\.\/snippets\/[^'"]+\/js\/host\.js['"];?$/m;
const namespace = /^import \* as (\w+) from ['"]\.\/snippets\/[^'"]+\/js\/host\.js['"];?$/m;
if (!named.test(glue) && !namespace.test(glue)) throw new Error('glue does not import js/host.js');
glue = glue.replace(named, () => hostBody);
glue = glue.replace(namespace, (_, name) => `const ${name} = { ${exported.join(', ')} };`);
if (/from ['"]\.\/snippets\//.test(glue)) throw new Error('glue still imports a snippet');

// 2. Trim what the page never uses. Each edit must find its target, or the build stops: a new
//    wasm-bindgen needs a look here. (The module has one export, `run`, which the loader and
//    host.js both call, so it stays exported.)
const must = (re, by) => {
  if (!re.test(glue)) throw new Error(`glue trim: ${re} not found`);
  glue = glue.replace(re, by);
};

// 3. Replace wasm-bindgen's general-purpose runtime with the small subset this page needs
//    (~0.8 KB gzip): one instantiation path (the default export takes the module's URL, which
//    the loader gives; streaming, with the arrayBuffer fallback for servers that send the wrong
//    MIME type), memory views made on use instead of cached and invalidated, strings passed
//    with one TextEncoder.encode, and no free-on-exception paths in the exports (passing a
//    string can only fail when the module is out of memory, and the loader catches that).
const fn = (name, body) => must(new RegExp(`^function ${name}\\([^)]*\\) \\{\\n[\\s\\S]*?^\\}\\n`, 'm'), body + '\n');
// wasm-bindgen exports a start function only when it has something to set up (an externref
// table, which the module has only when built with reference types).
const start = /wasm\.__wbindgen_start\(\)/.test(glue) ? '\n  wasm.__wbindgen_start();' : '';
must(/^let wasmModule, wasmInstance, wasm;\n[\s\S]*$/m, `let wasm;
export default async function (url) {
  const i = __wbg_get_imports();
  const r = await fetch(url);
  if (!r.ok) throw Error('wasm ' + r.status);
  const { instance } = await WebAssembly.instantiateStreaming(r.clone(), i)
    .catch(() => r.arrayBuffer().then((b) => WebAssembly.instantiate(b, i)));
  wasm = instance.exports;${start}
  return wasm;
}
`);
must(/^let cachedDataViewMemory0 = null;\n/m, '');
must(/^let cachedUint8ArrayMemory0 = null;\n/m, '');
fn('getDataViewMemory0', 'function getDataViewMemory0() { return new DataView(wasm.memory.buffer); }');
fn('getUint8ArrayMemory0', 'function getUint8ArrayMemory0() { return new Uint8Array(wasm.memory.buffer); }');
// The default decoder (UTF-8) also drops a leading byte order mark, which none of the strings
// the module hands out (URLs, ids, storage keys and values, JSON bodies) can start with.
must(/^let cachedTextDecoder = [\s\S]*?^function decodeText\(bytes\) \{\n[\s\S]*?^\}\n/m,
  "const cachedTextDecoder = new TextDecoder();\nfunction decodeText(bytes) { return cachedTextDecoder.decode(bytes); }\n");
// The imports object needs no null prototype: instantiation reads only its own properties.
must(/^(\s+const import0 = \{\n)\s+__proto__: null,\n/m, '$1');
// Pointers need no `>>> 0` (an unsigned view of an i32): this module's memory stays far below
// 2 GiB, so every pointer is a non-negative i32.
fn('passStringToWasm0', `function passStringToWasm0(arg, malloc) {
  const buf = cachedTextEncoder.encode(arg), ptr = malloc(buf.length, 1);
  getUint8ArrayMemory0().set(buf, ptr);
  WASM_VECTOR_LEN = buf.length;
  return ptr;
}`);
must(/, wasm\.__wbindgen_realloc/g, '');
must(/^(function getStringFromWasm0\(ptr, len\) \{\n)    ptr = ptr >>> 0;\n/m, '$1');
// A string an import returns is written to the module's return slot, a #[repr(C)] pair of u32
// (pointer, length; so 4-aligned) in little-endian wasm memory: one typed-array store instead
// of two DataView writes, and no DataView at all.
must(/^( +)getDataViewMemory0\(\)\.setInt32\(\((\w+) >>> 0\) \+ 4 \* 1, (\w+), true\);\n +getDataViewMemory0\(\)\.setInt32\(\(\2 >>> 0\) \+ 4 \* 0, (\w+), true\);\n/gm,
  '$1new Int32Array(wasm.memory.buffer, $2, 2).set([$4, $3]);\n');
// The export run(op, s, w, text) (src/web.rs) takes its three strings joined by src/ops.rs's
// SEP (NUL), one string passed instead of three: the glue's run(op, s, w, a, b, c), which the
// loader and host.js call, joins them (join makes a missing one empty, where concatenation
// would write "undefined"). JavaScript evaluates arguments left to right, so the (pointer,
// length) pair is made in the call itself.
must(/^export function run\(op, s, w, text\) \{\n[\s\S]*?^    wasm\.run\(val\d, val\d, val\d, ptr0, len0\);\n\}\n/m,
  `export function run(op, s, w, a, b, c) {
  wasm.run(op, s, w, passStringToWasm0([a, b, c].join('\\0'), wasm.__wbindgen_malloc), WASM_VECTOR_LEN);
}
`);

// 4. Apply the one-letter wasm import/export names that build-snippet.sh gave the module
//    (wasm-opt --minify-imports-and-exports-and-modules; its mapping is BINDGEN_DIR/names.json):
//    the host imports become keys of the one import module, `wasm.<export>` uses are renamed.
const names = JSON.parse(readFileSync(join(bindgenDir, 'names.json'), 'utf8'));
const importModules = new Set(names.imports.map(([m]) => m));
// wasm-bindgen's own module always; host.js's namespace too when some host function is passed
// to the module as is (no argument conversion needed).
const direct = importModules.size === 2;
if (!importModules.has('./tally_client_bg.js') || importModules.size > 2) throw new Error(`unexpected import modules ${[...importModules]}`);
const hostNames = [];
for (const [mod, name, short] of names.imports) {
  if (mod === './tally_client_bg.js') must(new RegExp(`^(\\s+)${name}: function`, 'm'), `$1${short}: function`);
  else if (exported.includes(name)) hostNames.push(`${short}: ${name}`);
  else throw new Error(`unknown import ${mod} ${name}`);
}
if (direct) {
  must(/^(const \w+ = )\{ [\w, ]+ \};$/m, `$1{ ${hostNames.join(', ')} };`);
  must(/return \{\s*__proto__: null,\s*"\.\/tally_client_bg\.js": (\w+),\s*"\.\/snippets\/[^"]+": (\w+),\s*\};/,
    (_, a, b) => `return { a: Object.assign(${a}, ${b}) };`);
} else {
  must(/return \{\s*__proto__: null,\s*"\.\/tally_client_bg\.js": (\w+),\s*\};/, (_, a) => `return { a: ${a} };`);
}
const exportNames = Object.fromEntries(names.exports);
glue = glue.replace(/\bwasm\.(\w+)/g, (_, n) => {
  if (!exportNames[n]) throw new Error(`glue uses unknown export ${n}`);
  return `wasm.${exportNames[n]}`;
});

// 5. Minify. The glue is an ES module (exports keep their names); the loader a classic script.
const terse = async (code, module) => {
  const r = await minify(code, {
    module,
    ecma: 2020,
    toplevel: module,
    compress: { passes: 3, unsafe_arrows: true },
    mangle: true,
    format: { comments: false },
  });
  return r.code;
};
const glueMin = await terse(glue, true);
const wasm = readFileSync(join(bindgenDir, 'tally_client_bg.wasm'));
const hash = (buf) => createHash('sha256').update(buf).digest('hex').slice(0, 8);
const glueName = `tally-${hash(glueMin)}.js`;
const wasmName = `tally-${hash(wasm)}.wasm`;

const loaderSrc = readFileSync(join(jsDir, 'loader.js'), 'utf8');
if (!loaderSrc.includes('__GLUE__') || !loaderSrc.includes('__WASM__')) throw new Error('loader lacks placeholders');
const loader = await terse(withCodes(stripComments(loaderSrc), 'loader.js').replace("'__GLUE__'", `'${glueName}'`).replace("'__WASM__'", `'${wasmName}'`), false);

// 6. Write, removing the files of earlier builds; each served file gets a .gz (zopfli) and a
//    .br (brotli, quality 11) beside it, precompressed once here so the collector serves the
//    smallest encoding a browser accepts without compressing per request. Both compressors are
//    deterministic: the same input gives the same bytes.
mkdirSync(outDir, { recursive: true });
for (const f of readdirSync(outDir)) {
  if (/^tally-[0-9a-f]+\.(js|wasm)(\.gz|\.br)?$/.test(f)) unlinkSync(join(outDir, f));
}
const zopfli = need('@gfx/zopfli');
const brotli = need('brotli-wasm');
const write = async (name, bytes) => {
  writeFileSync(join(outDir, name), bytes);
  writeFileSync(join(outDir, name + '.gz'), await zopfli.gzipAsync(bytes, { numiterations: 15 }));
  writeFileSync(join(outDir, name + '.br'), brotli.compress(bytes, { quality: 11 }));
};
await write(glueName, Buffer.from(glueMin + '\n'));
await write(wasmName, wasm);
await write('tally.js', Buffer.from(loader + '\n'));
const embed = (doc, constName, file) => ['', '.gz', '.br'].map((ext, i) =>
  `/// ${doc}${['', ', gzip-compressed', ', brotli-compressed'][i]}.
pub const ${constName}${['', '_GZ', '_BR'][i]}: &[u8] = include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../static/${file}${ext}"));`).join('\n');
writeFileSync(
  join(outDir, 'manifest.rs'),
  `// @generated by scripts/build-snippet.sh from client-wasm/: do not edit.
// The snippet files in this directory, named and embedded for server/src/http/assets.rs, each
// as built and precompressed (gzip by zopfli, brotli at quality 11).

${embed('The loader, served at `/tally.js`', 'LOADER', 'tally.js')}
/// File name of the wasm-bindgen glue (content-hashed: immutable).
pub const GLUE_NAME: &str = "${glueName}";
${embed('The glue (an ES module with the host functions inlined)', 'GLUE', glueName)}
/// File name of the WebAssembly module (content-hashed: immutable).
pub const WASM_NAME: &str = "${wasmName}";
${embed('The WebAssembly module', 'WASM', wasmName)}
`,
);

// 7. Smoke test: the module instantiates against the glue's imports (node's fetch reads a
//    data: URL).
const mod = await import(join(outDir, glueName));
await mod.default(new URL('data:application/wasm;base64,' + wasm.toString('base64')));
for (const f of ['run']) if (typeof mod[f] !== 'function') throw new Error(`glue lacks ${f}`);
console.error(`[snippet] wrote ${outDir}: tally.js, ${glueName}, ${wasmName}, manifest.rs`);
