// The peer, measured in the same run as bench/multimaster.py: PouchDB (LevelDB) replication.
//   node bench/pouchdb_baseline.js WORKDIR NEW_DOCS CONFLICT_DOCS   (needs `npm install pouchdb@9` on NODE_PATH)
// Prints one JSON line: {"oneshot_s", "oneshot_docs", "sync_s", "sync_docs"}.
const PouchDB = require('pouchdb');
const path = require('path');

async function fill(db, n, mk) {
  for (let i = 0; i < n; i += 1000) {
    const docs = [];
    for (let j = i; j < Math.min(n, i + 1000); j++) docs.push(mk(j));
    await db.bulkDocs(docs);
  }
}

async function main() {
  const [dir, nNew, nConf] = [process.argv[2], +process.argv[3], +process.argv[4]];
  const a = new PouchDB(path.join(dir, 'pa'));
  const b = new PouchDB(path.join(dir, 'pb'));
  await fill(a, nNew, (j) => ({_id: 'doc' + String(j).padStart(8, '0'), n: j, pad: 'x'.repeat(64)}));
  let t = process.hrtime.bigint();
  await PouchDB.replicate(a, b, {batch_size: 1000, batches_limit: 10});
  const oneshot = Number(process.hrtime.bigint() - t) / 1e9;
  const c = new PouchDB(path.join(dir, 'pc'));
  const d = new PouchDB(path.join(dir, 'pd'));
  await fill(c, nConf, (j) => ({_id: 'c' + String(j).padStart(8, '0'), v: 0, pad: 'x'.repeat(64)}));
  await PouchDB.replicate(c, d, {batch_size: 1000});
  for (const [db, val] of [[c, 'C'], [d, 'D']]) {
    const all = await db.allDocs({include_docs: true});
    const docs = all.rows.map((r) => ({...r.doc, v: val}));
    for (let i = 0; i < docs.length; i += 1000) await db.bulkDocs(docs.slice(i, i + 1000));
  }
  t = process.hrtime.bigint();
  await c.sync(d, {batch_size: 1000, batches_limit: 10});
  const sync = Number(process.hrtime.bigint() - t) / 1e9;
  const conflicted = (await c.allDocs({include_docs: true, conflicts: true})).rows.filter((r) => r.doc._conflicts).length;
  console.log(JSON.stringify({oneshot_s: oneshot, oneshot_docs: nNew, sync_s: sync, sync_docs: nConf, conflicted}));
  for (const db of [a, b, c, d]) await db.close();
}
main().catch((e) => { console.error(e); process.exit(1); });
