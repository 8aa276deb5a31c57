// PouchDB (Node, LevelDB) against a CouchDB-protocol server, for bench/multimaster.py --figure couch:
//   node bench/pouchdb_couch.js serve DIR                 express-pouchdb on LevelDB in DIR; prints {"port"}
//   node bench/pouchdb_couch.js push URL DIR N BATCH      N new documents (made first, not timed) replicated to URL
//   node bench/pouchdb_couch.js pull URL DIR BATCH        URL replicated to a fresh database
//   node bench/pouchdb_couch.js live URL DIR N RATE       live sync with URL; N writes at RATE a second, each
//                                                         printed as it is made ({"id", "t"}: ms since the epoch)
// (NODE_PATH holds pouchdb@9 and, for serve, express and express-pouchdb; multisite.testing.pouchdb installs them.)
// Prints one JSON line per result (push and pull: seconds, and cpu_s: this process's CPU seconds meanwhile).
'use strict';
const path = require('path');
const PouchDB = require('pouchdb');

process.on('unhandledRejection', (e) => console.error('unhandled rejection:', (e && e.message) || e));
const [mode, a1, a2, a3, a4] = process.argv.slice(2);
const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');
const cpuSince = (c) => { const d = process.cpuUsage(c); return (d.user + d.system) / 1e6; };  // PouchDB's own CPU

async function fill(db, n) {
  for (let i = 0; i < n; i += 1000) {
    const docs = [];
    for (let j = i; j < Math.min(n, i + 1000); j++) {
      docs.push({_id: 'doc' + String(j).padStart(8, '0'), n: j, pad: 'x'.repeat(64)});
    }
    await db.bulkDocs(docs);
  }
}

async function main() {
  if (mode === 'serve') {
    const express = require('express');
    const Leveled = PouchDB.defaults({prefix: a1 + path.sep});
    const app = express();
    app.use('/', require('express-pouchdb')(Leveled, {mode: 'minimumForPouchDB', logPath: path.join(a1, 'log.txt')}));
    const server = app.listen(0, '127.0.0.1', () => out({port: server.address().port}));
    return;
  }
  if (mode === 'push') {
    const local = new PouchDB(path.join(a2, 'src'));
    await fill(local, +a3);
    const t = process.hrtime.bigint();
    const c = process.cpuUsage();
    const r = await PouchDB.replicate(local, new PouchDB(a1), {batch_size: +a4});
    out({seconds: Number(process.hrtime.bigint() - t) / 1e9, cpu_s: cpuSince(c), docs_written: r.docs_written, ok: r.ok});
    return;
  }
  if (mode === 'pull') {
    const local = new PouchDB(path.join(a2, 'dst'));
    const t = process.hrtime.bigint();
    const c = process.cpuUsage();
    const r = await PouchDB.replicate(new PouchDB(a1), local, {batch_size: +a3});
    out({seconds: Number(process.hrtime.bigint() - t) / 1e9, cpu_s: cpuSince(c), docs_written: r.docs_written, ok: r.ok,
      doc_count: (await local.info()).doc_count});
    return;
  }
  if (mode === 'live') {
    const local = new PouchDB(path.join(a2, 'live'));
    const sync = local.sync(new PouchDB(a1), {live: true, retry: true});
    await new Promise((r) => sync.once('paused', r));
    const n = +a3;
    const rate = +a4;
    const t0 = Date.now();
    for (let i = 0; i < n; i++) {
      const wait = t0 + (i * 1000) / rate - Date.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      const id = 'live' + String(i).padStart(6, '0');
      const t = Date.now();
      await local.put({_id: id, i, t});
      out({id, t});
    }
    out({done: true});
    process.stdin.resume();
    process.stdin.on('end', () => { sync.cancel(); process.exit(0); });
    return;
  }
  throw new Error(`unknown mode ${mode}`);
}

main().catch((e) => { console.error(e); process.exit(1); });
