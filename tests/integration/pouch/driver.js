// PouchDB driven from Python (multisite.testing.pouchdb.Pouch): one JSON command a line on stdin,
// one JSON answer a line on stdout ({"rid", "result"} or {"rid", "error"}: rid is the command's).
//   node driver.js WORKDIR          (NODE_PATH holds pouchdb@9, pouchdb-adapter-memory)
// Databases live under WORKDIR (LevelDB), or in memory with "adapter": "memory".
'use strict';
const path = require('path');
const readline = require('readline');
const PouchDB = require('pouchdb');
PouchDB.plugin(require('pouchdb-adapter-memory'));

const workdir = process.argv[2];
// PouchDB 9 leaves one promise unhandled when a remote source goes away in the middle of a batch
// (finishBatch's src.info()); Node would end the process for it, a browser only logs it: so do we.
process.on('unhandledRejection', (e) => console.error('unhandled rejection:', (e && e.message) || e));
const dbs = {};
const syncs = {};
const events = {};

function db(name) {
  if (!dbs[name]) throw new Error(`no database ${name}: open it first`);
  return dbs[name];
}

function record(name, rep) {
  events[name] = events[name] || [];
  for (const ev of ['active', 'paused', 'denied', 'error', 'complete']) {
    rep.on(ev, (info) => events[name].push({ev, t: Date.now(), info: info && (info.message || info.status || null)}));
  }
  rep.on('change', (info) => events[name].push({ev: 'change', t: Date.now(),
    direction: info.direction || null, docs: (info.change || info).docs_written}));
}

const quickBackOff = (d) => (d ? Math.min(d * 2, 1000) : 100);

function replicationOpts(opts) {
  const o = Object.assign({}, opts || {});
  if (o.retry) o.back_off_function = quickBackOff;
  return o;
}

const jars = {};  // a cookie session's AuthSession cookie, kept and renewed as a browser keeps it

function cookieFetch(jar) {
  return async (url, options) => {
    if (jar.cookie) options.headers.set('Cookie', jar.cookie);
    const r = await fetch(url, options);
    const set = r.headers.get('set-cookie');
    if (set) {
      const v = set.split(';')[0];
      jar.cookie = v.endsWith('=') ? null : v;
    }
    return r;
  };
}

function remote(url, session) {
  if (!session) return new PouchDB(url, {skip_setup: false});
  return new PouchDB(url, {skip_setup: false, fetch: cookieFetch(jars[session])});
}

const ops = {
  async open({name, adapter}) {
    dbs[name] = adapter === 'memory' ? new PouchDB(name, {adapter: 'memory'}) : new PouchDB(path.join(workdir, name));
    return (await dbs[name].info()).doc_count;
  },
  async put({name, doc}) { return db(name).put(doc); },
  async bulk({name, n, prefix, start, body}) {
    for (let i = 0; i < n; i += 1000) {
      const docs = [];
      for (let j = i; j < Math.min(n, i + 1000); j++) {
        docs.push(Object.assign({_id: prefix + String((start || 0) + j).padStart(8, '0'), n: j}, body || {}));
      }
      await db(name).bulkDocs(docs);
    }
    return n;
  },
  async get({name, id, opts}) {
    try { return await db(name).get(id, opts || {}); } catch (e) { return {error: e.name, status: e.status}; }
  },
  async remove({name, id, rev}) { return db(name).remove(id, rev); },
  async get_att({name, id, att, rev}) {  // an attachment's content as base64, and its type
    const b = await db(name).getAttachment(id, att, rev ? {rev} : {});
    return {data: Buffer.from(b).toString('base64'), type: b.type || null};
  },
  async all({name}) {
    const r = await db(name).allDocs({include_docs: true, conflicts: true});
    return r.rows.map((x) => x.doc);
  },
  async info({name}) { return db(name).info(); },
  async login({session, url, name, password}) {  // POST /_session; later commands name the session
    jars[session] = {cookie: null};
    const r = await cookieFetch(jars[session])(url, {method: 'POST', headers: new Headers({'Content-Type': 'application/json'}),
      body: JSON.stringify({name, password})});
    return {status: r.status, body: await r.json(), cookie: jars[session].cookie};
  },
  async session_get({session, url}) {
    const r = await cookieFetch(jars[session])(url, {method: 'GET', headers: new Headers()});
    return {status: r.status, body: await r.json()};
  },
  async replicate({name, url, direction, opts, session}) {
    const t = process.hrtime.bigint();
    const o = replicationOpts(opts);
    const rep = direction === 'to' ? PouchDB.replicate(db(name), remote(url, session), o)
      : PouchDB.replicate(remote(url, session), db(name), o);
    record(name, rep);
    const res = await rep;
    return {ok: res.ok, docs_read: res.docs_read, docs_written: res.docs_written,
      doc_write_failures: res.doc_write_failures, errors: res.errors.map((e) => e.message || e.name),
      seconds: Number(process.hrtime.bigint() - t) / 1e9};
  },
  async sync_start({name, url, opts}) {
    const s = db(name).sync(remote(url), replicationOpts(Object.assign({live: true, retry: true}, opts)));
    record(name, s);
    syncs[name] = s;
    return true;
  },
  async replicate_start({name, url, direction, opts}) {  // a replication that runs while other commands do
    const o = replicationOpts(opts);
    const rep = direction === 'to' ? PouchDB.replicate(db(name), remote(url), o) : PouchDB.replicate(remote(url), db(name), o);
    record(name, rep);
    syncs[name] = rep;
    rep.then((r) => events[name].push({ev: 'done', t: Date.now(), docs_written: r.docs_written}),
      (e) => events[name].push({ev: 'failed', t: Date.now(), info: e.message || e.name}));
    return true;
  },
  async sync_stop({name}) {
    if (syncs[name]) { syncs[name].cancel(); delete syncs[name]; }
    return true;
  },
  async events({name}) { return events[name] || []; },
  async wait({name, id, rev, conflicts, deleted, timeout_ms}) {
    // until the document has `rev` (or exists), `conflicts` (sorted) and `deleted` as given
    const end = Date.now() + (timeout_ms || 30000);
    let last = null;
    while (Date.now() < end) {
      try {
        last = await db(name).get(id, {conflicts: true});
      } catch (e) {
        last = {error: e.name, reason: e.reason};
      }
      const gone = !!last.error && last.reason === 'deleted';
      const ok = (deleted ? gone : !last.error) && (!rev || last._rev === rev) &&
        (!conflicts || JSON.stringify((last._conflicts || []).slice().sort()) === JSON.stringify(conflicts.slice().sort()));
      if (ok) return last;
      await new Promise((r) => setTimeout(r, 20));
    }
    throw new Error(`document ${id} did not reach rev ${rev} / conflicts ${JSON.stringify(conflicts)} ` +
      `/ deleted ${!!deleted} in time: last ${JSON.stringify(last)}`);
  },
  async writes({name, n, rate, prefix}) {  // n new documents at `rate` a second; their ids and times (ms)
    const out = [];
    const t0 = Date.now();
    for (let i = 0; i < n; i++) {
      const due = t0 + (i * 1000) / rate;
      const wait = due - Date.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      const id = prefix + i;
      const t = Date.now();
      const r = await db(name).put({_id: id, i, t});
      out.push({id, rev: r.rev, t});
    }
    return out;
  },
  async exit() { setTimeout(() => process.exit(0), 10); return true; },
};

const rl = readline.createInterface({input: process.stdin});
rl.on('line', async (line) => {
  let msg;
  try { msg = JSON.parse(line); } catch (e) { return; }
  try {
    const result = await ops[msg.op](msg);
    process.stdout.write(JSON.stringify({rid: msg.rid, result}) + '\n');
  } catch (e) {
    process.stdout.write(JSON.stringify({rid: msg.rid, error: String((e && (e.message || e.name)) || e)}) + '\n');
  }
});
rl.on('close', () => process.exit(0));
