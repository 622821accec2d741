// compat.mjs checks test/mongowire against the official MongoDB Node.js
// driver, an independent client: what passes here should pass against a
// one-node MongoDB 7 replica set too.
//
//	node compat.mjs mongodb://127.0.0.1:27017/?replicaSet=rs0
//
// It prints one PASS or FAIL line per check and exits 1 on any failure.
// Checks marked "(mongowire)" use the failCommand fail point, which a real
// server has only with enableTestCommands, or mongowire's own extensions.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { Long, MongoClient, MongoServerError, MongoBulkWriteError, Timestamp } from 'mongodb';

const arg = process.argv[2] ?? 'mongodb://127.0.0.1:27017/?replicaSet=rs0';
const parsed = new URL(arg.replace(/^mongodb:/, 'http:'));
const host = parsed.host;
const setName = parsed.searchParams.get('replicaSet') ?? 'rs0';
const rsURI = `mongodb://${host}/?replicaSet=${setName}`;
const directURI = `mongodb://${host}/?directConnection=true`;
const plainURI = `mongodb://${host}/`;
const dbName = `nodecompat_${process.pid}_${Date.now()}`;

const clientOpts = { serverSelectionTimeoutMS: 5000, connectTimeoutMS: 5000 };
let failures = 0;
let passes = 0;

async function check(name, fn, timeoutMS = 20000) {
  let timer;
  try {
    await Promise.race([
      fn(),
      new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`timed out after ${timeoutMS} ms`)), timeoutMS);
      })
    ]);
    passes++;
    console.log(`PASS ${name}`);
  } catch (err) {
    failures++;
    console.log(`FAIL ${name}: ${describe(err)}`);
  } finally {
    clearTimeout(timer);
  }
}

function describe(err) {
  if (!(err instanceof Error)) return String(err);
  let s = `${err.name}: ${err.message}`;
  if (err.code !== undefined) s += ` (code ${err.code})`;
  if (err.cause) s += ` [cause: ${describe(err.cause)}]`;
  if (process.env.COMPAT_VERBOSE && err.stack) s += `\n${err.stack}`;
  return s;
}

// connect opens a client that records the commands it sends.
async function connect(uri, extra = {}) {
  const client = new MongoClient(uri, { ...clientOpts, monitorCommands: true, ...extra });
  client.sent = [];
  client.on('commandStarted', ev => client.sent.push(ev));
  await client.connect();
  return client;
}

function sentNamed(client, name) {
  return client.sent.filter(ev => ev.commandName === name);
}

async function expectRejects(promise, check) {
  try {
    await promise;
  } catch (err) {
    check(err);
    return err;
  }
  throw new Error('expected an error, got success');
}

// openStream opens a change stream and waits until its aggregate has run,
// so that later writes are guaranteed to be seen.
async function openStream(target, pipeline = [], options = {}) {
  const cs = target.watch(pipeline, options);
  const first = await cs.tryNext();
  assert.equal(first, null, 'a new stream should start empty');
  return cs;
}

async function nextChange(cs) {
  const ch = await cs.next();
  assert.ok(ch, 'no change returned');
  return ch;
}

function assertEvent(ch, op, coll) {
  assert.equal(ch.operationType, op, `operationType: ${JSON.stringify(ch)}`);
  assert.ok(ch._id && typeof ch._id === 'object' && typeof ch._id._data === 'string', 'resume token _id._data');
  assert.ok(ch.clusterTime instanceof Timestamp, 'clusterTime is a Timestamp');
  assert.ok(ch.wallTime instanceof Date, 'wallTime is a Date');
  if (coll !== undefined) assert.deepEqual(ch.ns, { db: dbName, coll });
}

const main = async () => {
  const pkg = JSON.parse(readFileSync(new URL('./node_modules/mongodb/package.json', import.meta.url), 'utf8'));
  console.log(`node ${process.version}, mongodb driver ${pkg.version}, server ${host}`);

  let client;
  await check('connect replicaSet URI: topology ReplicaSetWithPrimary', async () => {
    client = await connect(rsURI);
    const desc = client.topology.description;
    assert.equal(desc.type, 'ReplicaSetWithPrimary');
    assert.equal(desc.setName, setName);
    const servers = [...desc.servers.values()];
    assert.equal(servers.length, 1);
    assert.equal(servers[0].type, 'RSPrimary');
  });
  if (!client) {
    console.log('FAIL cannot continue without a connection');
    process.exit(1);
  }
  const db = client.db(dbName);

  await check('hello and legacy isMaster reply like a replica-set primary', async () => {
    const hello = await client.db('admin').command({ hello: 1 });
    assert.equal(hello.isWritablePrimary, true);
    assert.equal(hello.setName, setName);
    assert.ok(Array.isArray(hello.hosts) && hello.hosts.length === 1);
    assert.ok(hello.maxWireVersion >= 17, `maxWireVersion ${hello.maxWireVersion}`);
    assert.equal(typeof hello.logicalSessionTimeoutMinutes, 'number');
    assert.ok(hello.operationTime instanceof Timestamp, 'operationTime');
    const legacy = await client.db('admin').command({ isMaster: 1 });
    assert.equal(legacy.ismaster, true);
    const ping = await client.db('admin').command({ ping: 1 });
    assert.equal(ping.ok, 1);
    const bi = await client.db('admin').command({ buildInfo: 1 });
    assert.match(bi.version, /^\d+\.\d+\.\d+/);
    assert.ok(Array.isArray(bi.versionArray));
  });

  await check('connect directConnection=true: topology Single', async () => {
    const c = await connect(directURI);
    try {
      assert.equal(c.topology.description.type, 'Single');
      const coll = c.db(dbName).collection('direct');
      await coll.insertOne({ _id: 1, via: 'direct' });
      assert.deepEqual(await coll.findOne({ _id: 1 }), { _id: 1, via: 'direct' });
    } finally {
      await c.close();
    }
  });

  await check('connect plain URI (discovers the replica set)', async () => {
    const c = await connect(plainURI);
    try {
      assert.equal(c.topology.description.type, 'ReplicaSetWithPrimary');
      assert.equal((await c.db('admin').command({ ping: 1 })).ok, 1);
    } finally {
      await c.close();
    }
  });

  await check('insertOne / insertMany', async () => {
    const coll = db.collection('crud');
    const r1 = await coll.insertOne({ name: 'a', n: 1 });
    assert.equal(r1.acknowledged, true);
    assert.ok(r1.insertedId, 'insertedId');
    const r2 = await coll.insertMany([{ _id: 'b', name: 'b', n: 2 }, { _id: 'c', name: 'c', n: 3 }]);
    assert.equal(r2.insertedCount, 2);
    assert.deepEqual(r2.insertedIds, { 0: 'b', 1: 'c' });
    const got = await coll.findOne({ _id: r1.insertedId });
    assert.equal(got.name, 'a');
    assert.ok(got._id.equals(r1.insertedId));
  });

  await check('find with filter, sort, limit, skip, projection', async () => {
    const coll = db.collection('query');
    await coll.insertMany(Array.from({ length: 30 }, (_, i) => ({ _id: i, v: i % 7, tag: i % 2 ? 'odd' : 'even', sub: { x: i } })));
    const docs = await coll
      .find({ tag: 'odd', v: { $gte: 2 } })
      .sort({ v: -1, _id: 1 })
      .skip(1)
      .limit(5)
      .project({ _id: 1, v: 1, 'sub.x': 1 })
      .toArray();
    const want = Array.from({ length: 30 }, (_, i) => i)
      .filter(i => i % 2 === 1 && i % 7 >= 2)
      .sort((a, b) => (b % 7) - (a % 7) || a - b)
      .slice(1, 6)
      .map(i => ({ _id: i, v: i % 7, sub: { x: i } }));
    assert.deepEqual(docs, want);
    const excl = await coll.find({ _id: 3 }, { projection: { sub: 0, tag: 0 } }).toArray();
    assert.deepEqual(excl, [{ _id: 3, v: 3 }]);
    const none = await coll.find({ nothing: { $exists: true } }).toArray();
    assert.deepEqual(none, []);
  });

  await check('find cursor iteration across getMore batches', async () => {
    const coll = db.collection('batches');
    const N = 257;
    await coll.insertMany(Array.from({ length: N }, (_, i) => ({ _id: i, pad: 'x'.repeat(20) })));
    const before = sentNamed(client, 'getMore').length;
    const seen = [];
    for await (const d of coll.find({}).sort({ _id: 1 }).batchSize(20)) seen.push(d._id);
    assert.equal(seen.length, N);
    assert.deepEqual(seen, Array.from({ length: N }, (_, i) => i));
    const getMores = sentNamed(client, 'getMore').length - before;
    assert.ok(getMores >= 12, `expected >= 12 getMores, saw ${getMores}`);
    // A limit that spans batches: the driver shrinks the last getMore.
    const limited = await coll.find({}).sort({ _id: -1 }).batchSize(7).limit(30).toArray();
    assert.equal(limited.length, 30);
    assert.equal(limited[0]._id, N - 1);
    // Default batch size (101 first, then the rest) and an explicit close.
    const all = await coll.find({}).toArray();
    assert.equal(all.length, N);
    const cur = coll.find({}).batchSize(5);
    await cur.next();
    await cur.close(); // killCursors
    assert.ok(sentNamed(client, 'killCursors').length >= 1, 'killCursors sent');
  });

  await check('updateOne $set/$inc, upsert; updateMany', async () => {
    const coll = db.collection('upd');
    await coll.insertOne({ _id: 1, a: 1, n: 10 });
    const r = await coll.updateOne({ _id: 1 }, { $set: { a: 2, 'b.c': 'deep' }, $inc: { n: 5 } });
    assert.equal(r.matchedCount, 1);
    assert.equal(r.modifiedCount, 1);
    assert.equal(r.upsertedId, null);
    assert.deepEqual(await coll.findOne({ _id: 1 }), { _id: 1, a: 2, n: 15, b: { c: 'deep' } });
    const noop = await coll.updateOne({ _id: 1 }, { $set: { a: 2 } });
    assert.equal(noop.matchedCount, 1);
    assert.equal(noop.modifiedCount, 0);
    const miss = await coll.updateOne({ _id: 99 }, { $set: { a: 1 } });
    assert.equal(miss.matchedCount, 0);
    const up = await coll.updateOne({ _id: 2 }, { $set: { a: 7 }, $setOnInsert: { created: true }, $inc: { n: 1 } }, { upsert: true });
    assert.equal(up.matchedCount, 0);
    assert.equal(up.upsertedCount, 1);
    assert.equal(up.upsertedId, 2);
    assert.deepEqual(await coll.findOne({ _id: 2 }), { _id: 2, a: 7, created: true, n: 1 });
    const upOid = await coll.updateOne({ k: 'gen' }, { $set: { v: 1 } }, { upsert: true });
    assert.ok(upOid.upsertedId && upOid.upsertedId._bsontype === 'ObjectId', 'server-generated ObjectId upsertedId');
    const many = await coll.updateMany({ a: { $exists: true } }, { $inc: { n: 100 } });
    assert.equal(many.matchedCount, 2);
    assert.equal(many.modifiedCount, 2);
  });

  await check('replaceOne (and upsert)', async () => {
    const coll = db.collection('repl');
    await coll.insertOne({ _id: 'r', a: 1, b: 2 });
    const r = await coll.replaceOne({ _id: 'r' }, { c: 3 });
    assert.equal(r.matchedCount, 1);
    assert.equal(r.modifiedCount, 1);
    assert.deepEqual(await coll.findOne({ _id: 'r' }), { _id: 'r', c: 3 });
    const up = await coll.replaceOne({ _id: 's' }, { d: 4 }, { upsert: true });
    assert.equal(up.upsertedId, 's');
    assert.deepEqual(await coll.findOne({ _id: 's' }), { _id: 's', d: 4 });
  });

  await check('deleteOne / deleteMany', async () => {
    const coll = db.collection('del');
    await coll.insertMany([{ _id: 1, k: 'x' }, { _id: 2, k: 'x' }, { _id: 3, k: 'y' }]);
    assert.equal((await coll.deleteOne({ k: 'x' })).deletedCount, 1);
    assert.equal((await coll.deleteOne({ k: 'zzz' })).deletedCount, 0);
    assert.equal((await coll.deleteMany({})).deletedCount, 2);
    assert.equal(await coll.countDocuments(), 0);
  });

  await check('findOneAndUpdate / findOneAndReplace / findOneAndDelete', async () => {
    const coll = db.collection('fam');
    await coll.insertMany([{ _id: 1, n: 1 }, { _id: 2, n: 2 }]);
    const before = await coll.findOneAndUpdate({ _id: 1 }, { $inc: { n: 10 } });
    assert.deepEqual(before, { _id: 1, n: 1 });
    const after = await coll.findOneAndUpdate({ _id: 1 }, { $inc: { n: 10 } }, { returnDocument: 'after', projection: { n: 1, _id: 0 } });
    assert.deepEqual(after, { n: 21 });
    const meta = await coll.findOneAndUpdate({ _id: 3 }, { $set: { n: 3 } }, { upsert: true, returnDocument: 'after', includeResultMetadata: true });
    assert.deepEqual(meta.value, { _id: 3, n: 3 });
    assert.equal(meta.lastErrorObject.updatedExisting, false);
    assert.equal(meta.lastErrorObject.upserted, 3);
    const missing = await coll.findOneAndUpdate({ _id: 42 }, { $set: { n: 0 } });
    assert.equal(missing, null);
    const sorted = await coll.findOneAndUpdate({}, { $set: { top: true } }, { sort: { n: -1 }, returnDocument: 'after' });
    assert.equal(sorted._id, 1);
    const rep = await coll.findOneAndReplace({ _id: 2 }, { m: 2 }, { returnDocument: 'after' });
    assert.deepEqual(rep, { _id: 2, m: 2 });
    const del = await coll.findOneAndDelete({ _id: 2 });
    assert.deepEqual(del, { _id: 2, m: 2 });
  });

  await check('countDocuments / estimatedDocumentCount / distinct', async () => {
    const coll = db.collection('query');
    assert.equal(await coll.countDocuments(), 30);
    assert.equal(await coll.countDocuments({ tag: 'odd' }), 15);
    assert.equal(await coll.countDocuments({ tag: 'odd' }, { skip: 5, limit: 4 }), 4);
    assert.equal(await coll.countDocuments({ nothing: 1 }), 0);
    assert.equal(await db.collection('does_not_exist').countDocuments(), 0);
    assert.equal(await coll.estimatedDocumentCount(), 30);
    assert.deepEqual(await coll.distinct('tag'), ['even', 'odd']);
  });

  await check('aggregate $match/$sort/$limit/$project', async () => {
    const coll = db.collection('query');
    const out = await coll.aggregate([{ $match: { v: 6 } }, { $sort: { _id: -1 } }, { $limit: 2 }, { $project: { _id: 1 } }]).toArray();
    assert.deepEqual(out, [{ _id: 27 }, { _id: 20 }]);
  });

  await check('createIndex unique, listIndexes, duplicate key error 11000', async () => {
    const coll = db.collection('uniq');
    const name = await coll.createIndex({ email: 1 }, { unique: true });
    assert.equal(name, 'email_1');
    const idx = await coll.listIndexes().toArray();
    assert.deepEqual(idx.map(i => i.name).sort(), ['_id_', 'email_1']);
    assert.equal(idx.find(i => i.name === 'email_1').unique, true);
    await coll.insertOne({ _id: 1, email: 'a@x' });
    const e1 = await expectRejects(coll.insertOne({ _id: 2, email: 'a@x' }), err => {
      assert.ok(err instanceof MongoServerError, `${err.name}`);
      assert.equal(err.code, 11000);
    });
    assert.deepEqual(e1.keyPattern, { email: 1 }, 'keyPattern on the error');
    assert.deepEqual(e1.keyValue, { email: 'a@x' }, 'keyValue on the error');
    await expectRejects(coll.insertOne({ _id: 1, email: 'other' }), err => {
      assert.equal(err.code, 11000);
      assert.deepEqual(err.keyValue, { _id: 1 });
    });
    const bulk = await expectRejects(coll.insertMany([{ _id: 3, email: 'b@x' }, { _id: 4, email: 'b@x' }, { _id: 5, email: 'c@x' }], { ordered: false }), err => {
      assert.ok(err instanceof MongoBulkWriteError, `${err.name}`);
      assert.equal(err.code, 11000);
    });
    assert.equal(bulk.result.insertedCount, 2);
    assert.equal(bulk.writeErrors.length ?? 1, 1);
    await expectRejects(coll.updateOne({ _id: 3 }, { $set: { email: 'a@x' } }), err => assert.equal(err.code, 11000));
    await expectRejects(coll.createIndex({ dup: 1 }, { unique: true }).then(() => coll.insertMany([{ dup: 1 }, { dup: 1 }])), err => assert.equal(err.code, 11000));
  });

  await check('collection admin: listCollections, rename, drop, dropDatabase', async () => {
    const adminDb = client.db(`${dbName}_admin`);
    await adminDb.createCollection('one');
    await expectRejects(adminDb.createCollection('one'), err => assert.equal(err.code, 48));
    await adminDb.collection('two').insertOne({ x: 1 });
    let names = (await adminDb.listCollections({}, { nameOnly: true }).toArray()).map(c => c.name).sort();
    assert.deepEqual(names, ['one', 'two']);
    await adminDb.collection('two').rename('three');
    names = (await adminDb.listCollections().toArray()).map(c => c.name).sort();
    assert.deepEqual(names, ['one', 'three']);
    assert.equal(await adminDb.collection('one').drop(), true);
    const dbs = await client.db('admin').admin().listDatabases();
    assert.ok(dbs.databases.some(d => d.name === `${dbName}_admin`));
    assert.equal(await adminDb.dropDatabase(), true);
  });

  await check('collection change stream: insert/update/replace/delete with updateLookup', async () => {
    const coll = db.collection('cs');
    await coll.insertOne({ _id: 'seed' }); // create the collection first
    const cs = await openStream(coll, [], { fullDocument: 'updateLookup' });
    try {
      await coll.insertOne({ _id: 1, a: 1 });
      await coll.updateOne({ _id: 1 }, { $set: { a: 2, b: 'x' }, $unset: { nope: '' } });
      await coll.replaceOne({ _id: 1 }, { c: 3 });
      await coll.deleteOne({ _id: 1 });
      const ins = await nextChange(cs);
      assertEvent(ins, 'insert', 'cs');
      assert.deepEqual(ins.documentKey, { _id: 1 });
      assert.deepEqual(ins.fullDocument, { _id: 1, a: 1 });
      const upd = await nextChange(cs);
      assertEvent(upd, 'update', 'cs');
      assert.deepEqual(upd.updateDescription.updatedFields, { a: 2, b: 'x' });
      assert.deepEqual(upd.updateDescription.removedFields, []);
      // updateLookup returns the document as it is now (already replaced).
      assert.ok('fullDocument' in upd, 'update carries fullDocument with updateLookup');
      const rep = await nextChange(cs);
      assertEvent(rep, 'replace', 'cs');
      assert.deepEqual(rep.fullDocument, { _id: 1, c: 3 });
      const del = await nextChange(cs);
      assertEvent(del, 'delete', 'cs');
      assert.deepEqual(del.documentKey, { _id: 1 });
      assert.equal(del.fullDocument, undefined);
      assert.ok(del.clusterTime.greaterThan(ins.clusterTime), 'cluster times increase');
      assert.deepEqual(cs.resumeToken, del._id);
    } finally {
      await cs.close();
    }
  });

  await check('change stream updateLookup sees the current document', async () => {
    const coll = db.collection('cs_lookup');
    await coll.insertOne({ _id: 1, a: 1 });
    const cs = await openStream(coll, [], { fullDocument: 'updateLookup' });
    try {
      await coll.updateOne({ _id: 1 }, { $inc: { a: 1 } });
      const upd = await nextChange(cs);
      assert.deepEqual(upd.fullDocument, { _id: 1, a: 2 });
      assert.deepEqual(upd.updateDescription.updatedFields, { a: 2 });
    } finally {
      await cs.close();
    }
  });

  await check('change stream resume with resumeAfter from a saved token', async () => {
    const coll = db.collection('resume');
    await coll.insertOne({ _id: 0 });
    const cs = await openStream(coll);
    await coll.insertMany([{ _id: 1 }, { _id: 2 }, { _id: 3 }]);
    assert.equal((await nextChange(cs)).documentKey._id, 1);
    const second = await nextChange(cs);
    assert.equal(second.documentKey._id, 2);
    const saved = cs.resumeToken;
    assert.deepEqual(saved, second._id);
    await cs.close();
    await coll.insertOne({ _id: 4 });
    const resumed = coll.watch([], { resumeAfter: saved });
    try {
      const ids = [];
      for (let i = 0; i < 2; i++) ids.push((await nextChange(resumed)).documentKey._id);
      assert.deepEqual(ids, [3, 4]);
      const agg = sentNamed(client, 'aggregate').at(-1).command;
      assert.deepEqual(agg.pipeline[0].$changeStream.resumeAfter, saved);
    } finally {
      await resumed.close();
    }
    // startAtOperationTime from an event's clusterTime replays it.
    const at = coll.watch([], { startAtOperationTime: second.clusterTime });
    try {
      assert.equal((await nextChange(at)).documentKey._id, 2);
    } finally {
      await at.close();
    }
  });

  await check('change stream on a quiet collection returns postBatchResumeToken', async () => {
    const coll = db.collection('quiet');
    await coll.insertOne({ _id: 0 });
    const cs = await openStream(coll, [{ $match: { 'fullDocument.keep': true } }], { maxAwaitTimeMS: 200 });
    try {
      const t0 = cs.resumeToken;
      assert.ok(t0 && typeof t0._data === 'string', 'resumeToken after the initial aggregate');
      await coll.insertOne({ _id: 1, keep: false });
      assert.equal(await cs.tryNext(), null);
      const t1 = cs.resumeToken;
      assert.ok(t1._data > t0._data, `token advanced past filtered events: ${t0._data} -> ${t1._data}`);
      await coll.insertOne({ _id: 2, keep: true });
      assert.equal((await nextChange(cs)).documentKey._id, 2);
    } finally {
      await cs.close();
    }
  });

  await check('change stream startAfter past an invalidate (drop)', async () => {
    const coll = db.collection('inval');
    await coll.insertOne({ _id: 1 });
    const cs = await openStream(coll);
    await coll.drop();
    const drop = await nextChange(cs);
    assertEvent(drop, 'drop', 'inval');
    const inv = await nextChange(cs);
    assert.equal(inv.operationType, 'invalidate');
    assert.ok(inv.clusterTime instanceof Timestamp);
    // The driver closes the stream after an invalidate.
    assert.equal(cs.closed, true, 'stream closed after invalidate');
    await coll.insertOne({ _id: 2, again: true });
    await expectRejects(coll.watch([], { resumeAfter: inv._id }).next(), err => assert.equal(err.code, 260));
    const after = coll.watch([], { startAfter: inv._id });
    try {
      const ch = await nextChange(after);
      assertEvent(ch, 'insert', 'inval');
      assert.deepEqual(ch.fullDocument, { _id: 2, again: true });
    } finally {
      await after.close();
    }
  });

  await check('database-level watch', async () => {
    const cs = await openStream(db);
    try {
      await db.collection('dbw_a').insertOne({ _id: 'a' });
      await db.collection('dbw_b').insertOne({ _id: 'b' });
      await client.db(`${dbName}_other`).collection('x').insertOne({ _id: 'other' });
      await db.collection('dbw_a').deleteOne({ _id: 'a' });
      const evs = [];
      for (let i = 0; i < 3; i++) evs.push(await nextChange(cs));
      assert.deepEqual(evs.map(e => [e.operationType, e.ns.coll, e.documentKey._id]), [
        ['insert', 'dbw_a', 'a'],
        ['insert', 'dbw_b', 'b'],
        ['delete', 'dbw_a', 'a']
      ]);
      // Resume a database stream from a token.
      const resumed = db.watch([], { resumeAfter: evs[0]._id });
      try {
        assert.equal((await nextChange(resumed)).ns.coll, 'dbw_b');
      } finally {
        await resumed.close();
      }
    } finally {
      await cs.close();
    }
  });

  await check('cluster-level watch', async () => {
    const cs = await openStream(client);
    try {
      await db.collection('cl').insertOne({ _id: 1 });
      await client.db(`${dbName}_other`).collection('cl2').insertOne({ _id: 2 });
      const a = await nextChange(cs);
      const b = await nextChange(cs);
      assert.deepEqual([a.ns, b.ns], [{ db: dbName, coll: 'cl' }, { db: `${dbName}_other`, coll: 'cl2' }]);
      const agg = sentNamed(client, 'aggregate').at(-1);
      assert.equal(agg.databaseName, 'admin');
      assert.equal(agg.command.pipeline[0].$changeStream.allChangesForCluster, true);
    } finally {
      await cs.close();
    }
  });

  await check('change stream iterated by events and for-await', async () => {
    const coll = db.collection('cs_iter');
    await coll.insertOne({ _id: 0 });
    const cs = coll.watch();
    const got = new Promise((resolve, reject) => {
      cs.once('change', resolve);
      cs.once('error', reject);
    });
    await new Promise(r => setTimeout(r, 300)); // let the aggregate run
    await coll.insertOne({ _id: 1 });
    assert.equal((await got).documentKey._id, 1);
    await cs.close();
    const cs2 = await openStream(coll);
    await coll.insertOne({ _id: 2 });
    for await (const ch of cs2) {
      assert.equal(ch.documentKey._id, 2);
      break;
    }
    await cs2.close();
  });

  await check('retryable writes: lsid and txnNumber sent on every write', async () => {
    const coll = db.collection('retry');
    client.sent.length = 0;
    await coll.insertOne({ _id: 1 });
    await coll.updateOne({ _id: 1 }, { $set: { a: 1 } });
    await coll.deleteOne({ _id: 1 });
    await coll.findOneAndUpdate({ _id: 2 }, { $set: { a: 1 } }, { upsert: true });
    const writes = client.sent.filter(ev => ['insert', 'update', 'delete', 'findAndModify'].includes(ev.commandName));
    assert.equal(writes.length, 4);
    for (const w of writes) {
      assert.ok(w.command.lsid, `${w.commandName} has lsid`);
      assert.ok(w.command.txnNumber !== undefined, `${w.commandName} has txnNumber`);
    }
    const nums = writes.map(w => Number(w.command.txnNumber));
    assert.ok(nums.every((n, i) => i === 0 || n > nums[i - 1]), `txnNumbers increase: ${nums}`);
  });

  await check('retryable write after a closed connection (failCommand) (mongowire)', async () => {
    const coll = db.collection('retry');
    const adminDb = client.db('admin');
    await adminDb.command({ configureFailPoint: 'failCommand', mode: { times: 1 }, data: { failCommands: ['insert'], closeConnection: true } });
    client.sent.length = 0;
    await coll.insertOne({ _id: 'net' });
    const inserts = sentNamed(client, 'insert');
    assert.equal(inserts.length, 2, 'sent twice');
    assert.deepEqual(inserts[0].command.lsid, inserts[1].command.lsid);
    assert.equal(Number(inserts[0].command.txnNumber), Number(inserts[1].command.txnNumber));
    assert.equal(await coll.countDocuments({ _id: 'net' }), 1);
  });

  await check('retryable write after a RetryableWriteError code (failCommand) (mongowire)', async () => {
    const coll = db.collection('retry');
    await client.db('admin').command({ configureFailPoint: 'failCommand', mode: { times: 1 }, data: { failCommands: ['update'], errorCode: 91 } });
    const r = await coll.updateOne({ _id: 'net' }, { $inc: { n: 1 } });
    assert.equal(r.modifiedCount, 1);
    assert.deepEqual(await coll.findOne({ _id: 'net' }), { _id: 'net', n: 1 });
  });

  await check('retried write applied once when the reply was lost (mongowire)', async () => {
    const coll = db.collection('retry');
    await client.db('admin').command({ configureFailPoint: 'failCommand', mode: { times: 1 }, data: { failCommands: ['update'], mongowireDropReply: true } });
    const r = await coll.updateOne({ _id: 'net' }, { $inc: { n: 1 } });
    assert.equal(r.modifiedCount, 1);
    assert.deepEqual(await coll.findOne({ _id: 'net' }), { _id: 'net', n: 2 }, 'applied exactly once');
  });

  await check('change stream resumes by itself after a resumable getMore error (mongowire)', async () => {
    const coll = db.collection('cs_resume');
    await coll.insertOne({ _id: 0 });
    const cs = await openStream(coll);
    try {
      await coll.insertOne({ _id: 1 });
      assert.equal((await nextChange(cs)).documentKey._id, 1);
      await client.db('admin').command({ configureFailPoint: 'failCommand', mode: { times: 1 }, data: { failCommands: ['getMore'], errorCode: 91 } });
      await coll.insertOne({ _id: 2 });
      client.sent.length = 0;
      assert.equal((await nextChange(cs)).documentKey._id, 2);
      const aggs = sentNamed(client, 'aggregate');
      assert.equal(aggs.length, 1, 'one resume aggregate');
      assert.ok(aggs[0].command.pipeline[0].$changeStream.resumeAfter, 'resumed with resumeAfter');
    } finally {
      await cs.close();
    }
  });

  await check('sessions: explicit session lsid, causal consistency, endSessions', async () => {
    const coll = db.collection('sess');
    const session = client.startSession({ causalConsistency: true });
    try {
      client.sent.length = 0;
      await coll.insertOne({ _id: 1 }, { session });
      const doc = await coll.findOne({ _id: 1 }, { session });
      assert.deepEqual(doc, { _id: 1 });
      const cmds = client.sent.filter(ev => ['insert', 'find'].includes(ev.commandName));
      assert.equal(cmds.length, 2);
      const want = session.id.id.toString('hex');
      for (const c of cmds) assert.equal(c.command.lsid.id.toString('hex'), want, `${c.commandName} carries the session's lsid`);
      const find = cmds.find(c => c.commandName === 'find');
      assert.ok(find.command.readConcern?.afterClusterTime instanceof Timestamp, 'causally consistent read sends afterClusterTime');
      assert.ok(session.operationTime instanceof Timestamp, 'session.operationTime from the reply');
      assert.ok(session.clusterTime?.clusterTime instanceof Timestamp, 'session gossips $clusterTime');
    } finally {
      await session.endSession();
    }
    // Implicit sessions: every command carries an lsid.
    client.sent.length = 0;
    await coll.find({}).toArray();
    await coll.countDocuments();
    for (const ev of client.sent) assert.ok(ev.command.lsid, `${ev.commandName} carries an implicit lsid`);
  });

  await check('transaction via withTransaction commits (writes visible)', async () => {
    const coll = db.collection('txn');
    await coll.insertOne({ _id: 0 });
    const session = client.startSession();
    try {
      await session.withTransaction(async () => {
        await coll.insertOne({ _id: 1 }, { session });
        await coll.updateOne({ _id: 0 }, { $set: { t: true } }, { session });
      });
    } finally {
      await session.endSession();
    }
    assert.equal(await coll.countDocuments(), 2);
  });

  await check('closing a change stream while next() waits ends the wait at once', async () => {
    const coll = db.collection('cs_close');
    await coll.insertOne({ _id: 0 });
    const cs = await openStream(coll, [], { maxAwaitTimeMS: 8000 });
    const pending = cs.next().then(v => ({ v }), e => ({ e }));
    await new Promise(r => setTimeout(r, 300)); // the getMore is now waiting on the server
    const t0 = Date.now();
    await cs.close();
    const settled = await pending;
    const waited = Date.now() - t0;
    assert.ok(settled.e, `next() after close: ${JSON.stringify(settled.v)}`);
    assert.ok(waited < 3000, `pending next() settled ${waited} ms after close (server held the killed cursor's getMore)`);
  });

  await check('unacknowledged writes (w: 0, moreToCome)', async () => {
    const coll = db.collection('w0', { writeConcern: { w: 0 } });
    const r = await coll.insertOne({ _id: 1 });
    assert.equal(r.acknowledged, false);
    await coll.updateOne({ _id: 1 }, { $set: { a: 1 } });
    // The next acknowledged command on any connection sees the writes.
    const acked = db.collection('w0');
    let doc;
    for (let i = 0; i < 50 && !(doc && doc.a === 1); i++) {
      doc = await acked.findOne({ _id: 1 });
      if (!doc || doc.a !== 1) await new Promise(r => setTimeout(r, 20));
    }
    assert.deepEqual(doc, { _id: 1, a: 1 });
  });

  await check('bulkWrite with mixed operations', async () => {
    const coll = db.collection('bulk');
    const r = await coll.bulkWrite([
      { insertOne: { document: { _id: 1, n: 1 } } },
      { insertOne: { document: { _id: 2, n: 2 } } },
      { updateOne: { filter: { _id: 1 }, update: { $inc: { n: 10 } } } },
      { updateMany: { filter: {}, update: { $set: { t: true } } } },
      { replaceOne: { filter: { _id: 3 }, replacement: { n: 3 }, upsert: true } },
      { deleteOne: { filter: { _id: 2 } } }
    ]);
    assert.equal(r.insertedCount, 2);
    assert.equal(r.matchedCount, 3);
    assert.equal(r.modifiedCount, 3);
    assert.equal(r.upsertedCount, 1);
    assert.deepEqual(r.upsertedIds, { 4: 3 });
    assert.equal(r.deletedCount, 1);
    assert.deepEqual(await coll.find().sort({ _id: 1 }).toArray(), [{ _id: 1, n: 11, t: true }, { _id: 3, n: 3 }]);
  });

  await check('concurrent operations over the pool', async () => {
    const coll = db.collection('conc');
    await Promise.all(Array.from({ length: 100 }, (_, i) => coll.insertOne({ _id: i })));
    const counts = await Promise.all(Array.from({ length: 20 }, () => coll.countDocuments()));
    assert.ok(counts.every(n => n === 100), `${counts}`);
  });

  await check('dropIndex / indexes', async () => {
    const coll = db.collection('idx');
    await coll.createIndexes([{ key: { a: 1 } }, { key: { b: -1, c: 1 }, name: 'bc' }]);
    assert.equal(await coll.indexExists('a_1'), true);
    await coll.dropIndex('a_1');
    assert.deepEqual((await coll.indexes()).map(i => i.name).sort(), ['_id_', 'bc']);
    await expectRejects(coll.dropIndex('nope'), err => assert.equal(err.code, 27));
  });

  await check('change stream on a collection that does not exist yet', async () => {
    const coll = db.collection('later');
    const cs = await openStream(coll);
    try {
      await coll.insertOne({ _id: 1 });
      assertEvent(await nextChange(cs), 'insert', 'later');
    } finally {
      await cs.close();
    }
  });

  await check('change stream pre- and post-images (changeStreamPreAndPostImages)', async () => {
    const coll = await db.createCollection('images', { changeStreamPreAndPostImages: { enabled: true } });
    await coll.insertOne({ _id: 1, v: 1 });
    const cs = await openStream(coll, [], { fullDocument: 'whenAvailable', fullDocumentBeforeChange: 'required' });
    try {
      await coll.updateOne({ _id: 1 }, { $set: { v: 2 } });
      await coll.deleteOne({ _id: 1 });
      const upd = await nextChange(cs);
      assert.deepEqual(upd.fullDocumentBeforeChange, { _id: 1, v: 1 });
      assert.deepEqual(upd.fullDocument, { _id: 1, v: 2 });
      const del = await nextChange(cs);
      assert.deepEqual(del.fullDocumentBeforeChange, { _id: 1, v: 2 });
    } finally {
      await cs.close();
    }
  });

  await check('change stream resumes from its initial operationTime before any event (mongowire)', async () => {
    const coll = db.collection('cs_optime');
    await coll.insertOne({ _id: 0 });
    const cs = await openStream(coll);
    try {
      await client.db('admin').command({ configureFailPoint: 'failCommand', mode: { times: 1 }, data: { failCommands: ['getMore'], errorCode: 91 } });
      await coll.insertOne({ _id: 1 });
      client.sent.length = 0;
      assert.equal((await nextChange(cs)).documentKey._id, 1);
      const agg = sentNamed(client, 'aggregate')[0].command.pipeline[0].$changeStream;
      assert.ok(agg.resumeAfter || agg.startAtOperationTime, `resumed with a position: ${JSON.stringify(agg)}`);
    } finally {
      await cs.close();
    }
  });

  await check('change stream invalidated by rename and by dropDatabase', async () => {
    const d2 = client.db(`${dbName}_inv`);
    await d2.collection('src').insertOne({ _id: 1 });
    const cs = await openStream(d2.collection('src'));
    const dbs = await openStream(d2);
    try {
      await d2.collection('src').rename('dst');
      const ren = await nextChange(cs);
      assert.equal(ren.operationType, 'rename');
      assert.deepEqual(ren.to, { db: `${dbName}_inv`, coll: 'dst' });
      assert.equal((await nextChange(cs)).operationType, 'invalidate');
      await d2.dropDatabase();
      const ops = [];
      for (let i = 0; i < 4; i++) ops.push((await nextChange(dbs)).operationType);
      assert.deepEqual(ops, ['rename', 'drop', 'dropDatabase', 'invalidate']);
    } finally {
      await cs.close();
      await dbs.close();
    }
  });

  await check('connect with compressors=zlib,snappy (none negotiated)', async () => {
    const c = await connect(`mongodb://${host}/?replicaSet=${setName}&compressors=zlib`);
    try {
      await c.db(dbName).collection('z').insertOne({ big: 'y'.repeat(10000) });
      assert.equal((await c.db(dbName).collection('z').findOne({})).big.length, 10000);
    } finally {
      await c.close();
    }
  });

  await check('connect via localhost name', async () => {
    const port = host.split(':').at(-1);
    const c = await connect(`mongodb://localhost:${port}/?replicaSet=${setName}`);
    try {
      assert.equal((await c.db('admin').command({ ping: 1 })).ok, 1);
      await c.db(dbName).collection('lh').insertOne({ _id: 1 });
    } finally {
      await c.close();
    }
  });

  await check('unknown command returns CommandNotFound (59)', async () => {
    await expectRejects(db.command({ noSuchCommandHere: 1 }), err => {
      assert.ok(err instanceof MongoServerError);
      assert.equal(err.code, 59);
      assert.equal(err.codeName, 'CommandNotFound');
    });
  });

  await check('getMore on a killed cursor fails with CursorNotFound (43)', async () => {
    const coll = db.collection('batches');
    const res = await db.command({ find: 'batches', batchSize: 2 });
    const id = res.cursor.id;
    assert.ok(id instanceof Long || typeof id === 'bigint' || typeof id === 'number');
    await db.command({ killCursors: 'batches', cursors: [id] });
    await expectRejects(db.command({ getMore: id, collection: 'batches' }), err => assert.equal(err.code, 43));
    void coll;
  });

  await check('close client sends endSessions', async () => {
    const c = await connect(rsURI);
    await c.db(dbName).collection('x').findOne({});
    await c.close();
    assert.ok(sentNamed(c, 'endSessions').length === 1, 'endSessions sent on close');
  });

  await client.db(dbName).dropDatabase().catch(() => {});
  await client.db(`${dbName}_other`).dropDatabase().catch(() => {});
  await client.close();
  console.log(`${failures === 0 ? 'PASS' : 'FAIL'} node compat: ${passes} passed, ${failures} failed`);
  process.exit(failures === 0 ? 0 : 1);
};

main().catch(err => {
  console.log(`FAIL harness: ${describe(err)}`);
  process.exit(1);
});
