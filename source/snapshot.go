package source

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/changegate/changegate/checkpoint"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/internal/mhash"
)

// Snapshot modes (Spec.Snapshot).
const (
	// SnapshotNever starts a source without a checkpoint at the stream's
	// current position (or start_at).
	SnapshotNever = "never"
	// SnapshotInitial delivers every existing document as a "snapshot"
	// event before the stream, on a start without a checkpoint.
	SnapshotInitial = "initial"
)

// OpSnapshot is the operationType of the events of an initial snapshot
// and of a backfill: the document as it was read, in fullDocument.
const OpSnapshot = "snapshot"

// DefaultSnapshotBatch is the find batch size of a snapshot scan when the
// source sets no batch_size.
const DefaultSnapshotBatch = 1000

// SnapshotStatus is the progress of a source's initial snapshot.
type SnapshotStatus struct {
	// ID names the snapshot (it is part of its events' ids).
	ID string
	// State is "scanning", "draining" (every document read, waiting for
	// the sinks) or "done".
	State string
	// Namespace is the collection being scanned ("<db>.<coll>").
	Namespace string
	// Scanned counts the documents read, those of earlier runs of the same
	// snapshot included; Acked those below the checkpointed progress.
	Scanned, Acked int64
	// Estimated is the estimated number of documents of every collection
	// of the snapshot (estimatedDocumentCount), 0 when unknown.
	Estimated int64
	// Rate is the scan rate of this run in documents per second.
	Rate float64
	// ETA is the estimated time left; 0 when unknown or done.
	ETA       time.Duration
	StartedAt time.Time
}

// snapState is the in-memory state of a running snapshot.
type snapState struct {
	id        string
	start     bson.Raw // stream position taken before the scan
	startCT   bson.Timestamp
	eventCT   bson.Timestamp // cluster time of the snapshot events: just before startCT
	resumeNS  string
	resumeAt  bson.Raw // {_id: v}, nil: from the first document of resumeNS
	baseCount int64    // documents covered by the loaded progress
}

// snapPos is the tracker position of one snapshot document: the watermark
// of the tracker then names the last document below which every one was
// acknowledged.
func snapPos(ns string, key bson.Raw, n int64) bson.Raw {
	idx, dst := bsoncore.AppendDocumentStart(make([]byte, 0, 32+len(ns)+len(key)))
	dst = bsoncore.AppendStringElement(dst, "ns", ns)
	dst = bsoncore.AppendDocumentElement(dst, "after", key)
	dst = bsoncore.AppendInt64Element(dst, "n", n)
	dst, _ = bsoncore.AppendDocumentEnd(dst, idx)
	return dst
}

func decodeSnapPos(pos bson.Raw) (ns string, after bson.Raw, n int64, ok bool) {
	ns, ok1 := pos.Lookup("ns").StringValueOK()
	after, ok2 := pos.Lookup("after").DocumentOK()
	n, ok3 := pos.Lookup("n").Int64OK()
	return ns, after, n, ok1 && ok2 && ok3
}

// SnapshotEventID returns the stable id of the snapshot event of the
// document with _id id in db.coll: "<source>:snapshot:<snapshot
// id>:<hex of the first 16 bytes of SHA-256(db NUL coll NUL type byte
// _id bytes)>". A re-delivery after a restart carries the same id.
func SnapshotEventID(source, snapshotID, db, coll string, id bson.RawValue) string {
	return source + ":" + snapshotTokenData(SnapshotPrefix(snapshotID), db, coll, id)
}

// SnapshotPrefix is the id prefix of the events of snapshot id.
func SnapshotPrefix(id string) string { return "snapshot:" + id }

// BackfillPrefix is the id prefix of the events of backfill id.
func BackfillPrefix(id string) string { return "backfill:" + id }

func snapshotTokenData(prefix, db, coll string, id bson.RawValue) string {
	h := sha256.New()
	h.Write([]byte(db))
	h.Write([]byte{0})
	h.Write([]byte(coll))
	h.Write([]byte{0, byte(id.Type)})
	h.Write(id.Value)
	return prefix + ":" + hex.EncodeToString(h.Sum(nil)[:16])
}

// SnapshotEvent builds the event of one document read by a snapshot or a
// backfill: a change document {_id: {_data: "<prefix>:<hash of ns and
// _id>"}, operationType: "snapshot", clusterTime, wallTime, ns,
// documentKey: {_id}, fullDocument} read by event.FromChange, so it is
// routed, shaped and dead-lettered as any change; its id is
// "<source>:<prefix>:<hash>" (prefix: SnapshotPrefix or BackfillPrefix).
// ct is the cluster time it carries (a snapshot's: just before the stream
// position it continues from, so it sorts before every later change of
// the document), zero for none; wall likewise.
func SnapshotEvent(source, prefix, db, coll string, ct bson.Timestamp, wall time.Time, doc bson.Raw) (*event.Event, error) {
	return SnapshotEventKeyed(source, prefix, db, coll, ct, wall, doc, nil)
}

// SnapshotEventKeyed is SnapshotEvent for a document of a sharded
// collection whose shard key has the fields shardKey (ShardKeyFields):
// its documentKey is the change stream's, the shard key's fields in order
// and then _id (DocumentKey), so its ordering key and partition are those
// of the document's changes. The id stays the hash of ns and _id.
func SnapshotEventKeyed(source, prefix, db, coll string, ct bson.Timestamp, wall time.Time, doc bson.Raw, shardKey []string) (*event.Event, error) {
	idv, err := doc.LookupErr("_id")
	if err != nil {
		return nil, fmt.Errorf("document in %s.%s without _id", db, coll)
	}
	dst := make([]byte, 0, len(doc)+len(idv.Value)+len(db)+len(coll)+160)
	idx, dst := bsoncore.AppendDocumentStart(dst)
	tidx, dst := bsoncore.AppendDocumentElementStart(dst, "_id")
	dst = bsoncore.AppendStringElement(dst, "_data", snapshotTokenData(prefix, db, coll, idv))
	dst, _ = bsoncore.AppendDocumentEnd(dst, tidx)
	dst = bsoncore.AppendStringElement(dst, "operationType", OpSnapshot)
	if ct.T != 0 || ct.I != 0 {
		dst = bsoncore.AppendTimestampElement(dst, "clusterTime", ct.T, ct.I)
	}
	if !wall.IsZero() {
		dst = bsoncore.AppendDateTimeElement(dst, "wallTime", wall.UnixMilli())
	}
	nidx, dst := bsoncore.AppendDocumentElementStart(dst, "ns")
	dst = bsoncore.AppendStringElement(dst, "db", db)
	dst = bsoncore.AppendStringElement(dst, "coll", coll)
	dst, _ = bsoncore.AppendDocumentEnd(dst, nidx)
	dst = bsoncore.AppendDocumentElement(dst, "documentKey", DocumentKey(doc, shardKey))
	dst = bsoncore.AppendDocumentElement(dst, "fullDocument", doc)
	dst, _ = bsoncore.AppendDocumentEnd(dst, idx)
	return event.FromChange(source, 0, bson.Raw(dst))
}

// DocumentKey returns the documentKey a change stream gives doc's changes:
// {_id} for an unsharded collection (shardKey empty); for a sharded one
// the fields of its shard key in the key's order, named by their (dotted)
// paths, then _id unless the key holds it. A field missing from doc is
// left out. doc must have an _id.
func DocumentKey(doc bson.Raw, shardKey []string) bson.Raw {
	b := bsoncore.NewDocumentBuilder()
	haveID := false
	for _, f := range shardKey {
		v, err := doc.LookupErr(strings.Split(f, ".")...)
		if err != nil {
			continue
		}
		haveID = haveID || f == "_id"
		b.AppendValue(f, bsoncore.Value{Type: bsoncore.Type(v.Type), Data: v.Value})
	}
	if !haveID {
		idv := doc.Lookup("_id")
		b.AppendValue("_id", bsoncore.Value{Type: bsoncore.Type(idv.Type), Data: idv.Value})
	}
	return bson.Raw(b.Build())
}

// ShardKeyFields returns the fields of the shard key of db.coll, from the
// config database's collections (mongos's and a config server's record of
// sharded collections); none for a collection that is not sharded, or a
// deployment that is not (no such record).
func ShardKeyFields(ctx context.Context, client *mongo.Client, db, coll string) ([]string, error) {
	var rec struct {
		Key     bson.Raw `bson:"key"`
		Dropped bool     `bson:"dropped"`
	}
	err := client.Database("config").Collection("collections").FindOne(ctx, bson.D{{Key: "_id", Value: db + "." + coll}}).Decode(&rec)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read the shard key of %s.%s from config.collections: %w", db, coll, err)
	case rec.Dropped || len(rec.Key) == 0:
		return nil, nil
	}
	els, err := rec.Key.Elements()
	if err != nil {
		return nil, fmt.Errorf("shard key of %s.%s: %w", db, coll, err)
	}
	fields := make([]string, len(els))
	for i, e := range els {
		fields[i] = e.Key()
	}
	return fields, nil
}

// beforeTS returns the timestamp just before t.
func beforeTS(t bson.Timestamp) bson.Timestamp {
	switch {
	case t.I > 0:
		return bson.Timestamp{T: t.T, I: t.I - 1}
	case t.T > 0:
		return bson.Timestamp{T: t.T - 1, I: math.MaxUint32}
	}
	return t
}

// typeBrackets is MongoDB's comparison order of BSON types (manual:
// "Comparison/Sort Order"): MinKey, Null, Numbers, Symbol and String,
// Object, Array, BinData, ObjectId, Boolean, Date, Timestamp, Regular
// Expression, MaxKey. $gt compares within a bracket only, so a scan that
// resumes after an _id also asks for the _ids of every later bracket.
var typeBrackets = [][]bson.Type{
	{bson.TypeMinKey},
	{bson.TypeNull, bson.TypeUndefined},
	{bson.TypeInt32, bson.TypeInt64, bson.TypeDouble, bson.TypeDecimal128},
	{bson.TypeSymbol, bson.TypeString},
	{bson.TypeEmbeddedDocument},
	{bson.TypeArray},
	{bson.TypeBinary},
	{bson.TypeObjectID},
	{bson.TypeBoolean},
	{bson.TypeDateTime},
	{bson.TypeTimestamp},
	{bson.TypeRegex},
	{bson.TypeMaxKey},
}

// AfterIDFilter returns the filter of the documents whose _id sorts after
// id in MongoDB's order: {_id: {$gt: id}} or an _id of a later type
// bracket. It is combined with extra (nil: none) by $and.
func AfterIDFilter(id bson.RawValue, extra bson.Raw) bson.D {
	gt := bson.D{{Key: "_id", Value: bson.D{{Key: "$gt", Value: id}}}}
	var later bson.A
	seen := false
	for _, br := range typeBrackets {
		if seen {
			for _, t := range br {
				later = append(later, int32(t))
			}
		}
		if slices.Contains(br, id.Type) {
			seen = true
		}
	}
	f := gt
	if len(later) > 0 {
		f = bson.D{{Key: "$or", Value: bson.A{gt, bson.D{{Key: "_id", Value: bson.D{{Key: "$type", Value: later}}}}}}}
	}
	if len(extra) > 5 {
		return bson.D{{Key: "$and", Value: bson.A{f, extra}}}
	}
	return f
}

// Namespaces lists the collections a source of database db and collection
// coll covers, as "<db>.<coll>", sorted: the collection itself; every
// collection (not views, not system.*) of a database; of every database but
// admin, local, config and stateDB (changegate's state database) for a
// cluster-level source.
func Namespaces(ctx context.Context, client *mongo.Client, db, coll, stateDB string) ([]string, error) {
	if db != "" && coll != "" {
		return []string{db + "." + coll}, nil
	}
	dbs := []string{db}
	if db == "" {
		names, err := client.ListDatabaseNames(ctx, bson.D{})
		if err != nil {
			return nil, fmt.Errorf("list databases: %w", err)
		}
		dbs = dbs[:0]
		for _, n := range names {
			if n != "admin" && n != "local" && n != "config" && n != stateDB {
				dbs = append(dbs, n)
			}
		}
	}
	var out []string
	for _, d := range dbs {
		names, err := client.Database(d).ListCollectionNames(ctx, bson.D{{Key: "type", Value: "collection"}})
		if err != nil {
			return nil, fmt.Errorf("list collections of %s: %w", d, err)
		}
		for _, n := range names {
			if !strings.HasPrefix(n, "system.") {
				out = append(out, d+"."+n)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// EstimateDocuments sums estimatedDocumentCount over namespaces; 0 when
// unknown.
func EstimateDocuments(ctx context.Context, client *mongo.Client, namespaces []string) int64 {
	var total int64
	for _, ns := range namespaces {
		db, coll, _ := strings.Cut(ns, ".")
		n, err := client.Database(db).Collection(coll).EstimatedDocumentCount(ctx)
		if err != nil {
			return 0
		}
		total += n
	}
	return total
}

// runSnapshot runs the source's initial snapshot: on a first start it
// takes the stream's current position and persists it with an empty
// snapshot progress; then it scans every namespace in _id order, from the
// persisted progress on a restart, dispatching one snapshot event per
// document through the same tracker-and-ack path as changes, and
// checkpoints the progress (the tracker's watermark). Once every document
// is acknowledged it saves the stream position without progress and
// returns it with done: the stream starts there, so every change made
// since the position was taken is read after all snapshot events were
// handed to the router (and delivered). done is false when the source was
// stopped, abandoned or failed (err) before that.
func (s *Source) runSnapshot(ctx context.Context, cp checkpoint.Checkpoint, found bool) (checkpoint.Checkpoint, bool, error) {
	readCtx, cancelRead := s.readContext(ctx)
	defer cancelRead()
	var st snapState
	if found && cp.Snapshot != nil {
		st = snapState{id: cp.Snapshot.ID, start: cp.Token, startCT: cp.ClusterTime,
			resumeNS: cp.Snapshot.Namespace, resumeAt: cp.Snapshot.After, baseCount: cp.Snapshot.Scanned}
		if st.startCT.IsZero() {
			st.startCT, _ = event.TokenClusterTime(cp.Token)
		}
		s.log.Info("resuming the initial snapshot", "snapshot", st.id, "namespace", st.resumeNS, "documents_done", st.baseCount)
	} else {
		tok, err := s.startPosition(readCtx)
		if err != nil || tok == nil {
			return s.snapshotStopped(ctx, err)
		}
		st.start = tok
		st.startCT, _ = event.TokenClusterTime(tok)
		st.id = fmt.Sprintf("%08x%08x", st.startCT.T, st.startCT.I)
		if st.startCT.IsZero() {
			st.id = hex.EncodeToString([]byte(time.Now().UTC().Format("20060102150405.000")))
		}
		s.log.Info("starting the initial snapshot; the change stream follows from the position taken now", "snapshot", st.id)
	}
	st.eventCT = beforeTS(st.startCT)

	tr := s.newTracker(checkpoint.Position{})
	s.mu.Lock()
	s.tracker = tr
	s.status.State = StateSnapshot
	s.snapBase = st.baseCount
	s.snap = &SnapshotStatus{ID: st.id, State: "scanning", Namespace: st.resumeNS, Scanned: st.baseCount, Acked: st.baseCount, StartedAt: time.Now()}
	s.mu.Unlock()
	s.mSnapRunning.Set(1)
	defer s.mSnapRunning.Set(0)

	sv := &snapSaver{s: s, tr: tr, st: &st}
	if !found || cp.Snapshot == nil {
		// Persist the position first: a crash during the scan resumes this
		// snapshot and then this stream position, not a newer one.
		for {
			err := sv.save(readCtx, true)
			if err == nil {
				break
			}
			if isFenced(err) {
				s.leaseLost(err)
				return s.snapshotStopped(ctx, nil)
			}
			if readCtx.Err() != nil {
				return s.snapshotStopped(ctx, nil)
			}
			s.log.Warn("cannot persist the snapshot's start; retrying", "err", err)
			sleep(readCtx, time.Second)
		}
	}
	var wg sync.WaitGroup
	saverCtx, stopSaver := context.WithCancel(context.WithoutCancel(ctx))
	wg.Add(1)
	go func() {
		defer wg.Done()
		sv.loop(saverCtx)
	}()
	finish := func() {
		stopSaver()
		wg.Wait()
	}

	err := s.scanAll(readCtx, tr, &st)
	if err == nil {
		s.mu.Lock()
		s.snap.State = "draining"
		s.mu.Unlock()
		select {
		case <-tr.Drained():
		case <-readCtx.Done():
			err = readCtx.Err()
		}
	}
	if err != nil || readCtx.Err() != nil {
		// Stopped (or failed): keep checkpointing the progress until the
		// app cancels ctx, then save it once more.
		if err != nil && readCtx.Err() == nil {
			s.setState(StateFailed, err)
			s.log.Error("initial snapshot failed", "err", err)
		}
		select {
		case <-ctx.Done():
		case <-s.abandon:
		}
		finish()
		if !s.abandoned() {
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			if serr := sv.save(fctx, false); serr != nil {
				s.log.Error("final snapshot progress save failed", "err", serr)
			}
			cancel()
		}
		if err != nil && readCtx.Err() == nil {
			return checkpoint.Checkpoint{}, false, err
		}
		return checkpoint.Checkpoint{}, false, nil
	}
	finish()
	// Every document is acknowledged: the stream position, without
	// progress, is the checkpoint now.
	done := checkpoint.Checkpoint{Source: s.spec.Unit, Token: st.start, ClusterTime: st.startCT}
	if !st.startCT.IsZero() {
		done.WallTime = time.Unix(int64(st.startCT.T), 0).UTC()
	}
	for {
		err := sv.saveDone(ctx, done)
		if err == nil {
			break
		}
		if isFenced(err) {
			s.leaseLost(err)
			return checkpoint.Checkpoint{}, false, nil
		}
		if ctx.Err() != nil || s.abandoned() || errors.Is(err, ErrLeaseLost) {
			return checkpoint.Checkpoint{}, false, nil
		}
		s.log.Warn("cannot persist the snapshot's end; retrying", "err", err)
		sleep(ctx, time.Second)
	}
	s.mu.Lock()
	s.snap.State = "done"
	s.snap.ETA = 0
	s.snap.Acked = s.snap.Scanned
	s.mu.Unlock()
	s.log.Info("initial snapshot done; continuing with the change stream", "snapshot", st.id, "documents", s.SnapshotStatus().Scanned)
	return done, true, nil
}

// snapshotStopped ends a snapshot that was stopped before it began: it
// waits for ctx (the app's drain) as Run does after StopReading.
func (s *Source) snapshotStopped(ctx context.Context, err error) (checkpoint.Checkpoint, bool, error) {
	if err != nil && ctx.Err() == nil && !s.abandoned() {
		select {
		case <-s.stopReading:
		default:
			return checkpoint.Checkpoint{}, false, err
		}
	}
	select {
	case <-ctx.Done():
	case <-s.abandon:
	}
	return checkpoint.Checkpoint{}, false, nil
}

// startPosition opens the change stream (with the source's options and
// pipeline) and returns its initial post-batch resume token: the position
// the stream continues from after the scan. It retries until it gets one
// or ctx is done; an error it cannot get past (history lost) is returned.
func (s *Source) startPosition(ctx context.Context) (bson.Raw, error) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		cs, err := s.open(ctx, nil, nil, false)
		if err == nil {
			tok := cs.ResumeToken()
			_ = cs.Close(context.WithoutCancel(ctx))
			if tok != nil {
				return tok, nil
			}
			err = errors.New("the change stream returned no resume token")
		}
		if ctx.Err() != nil {
			break
		}
		if s.spec.Partitions > 1 && !s.clientFilter && isUnsupportedHash(err) {
			s.clientFilter = true
			continue
		}
		s.setState(StateReconnect, err)
		s.log.Warn("cannot open the change stream to take the snapshot's start position; retrying", "err", err, "retry_in", backoff)
		sleep(ctx, backoff)
		backoff = min(backoff*2, 30*time.Second)
	}
	return nil, nil
}

// scanAll scans the namespaces from the resume point on.
func (s *Source) scanAll(ctx context.Context, tr *checkpoint.Tracker, st *snapState) error {
	var nss []string
	backoff := 100 * time.Millisecond
	for {
		var err error
		nss, err = Namespaces(ctx, s.client, s.spec.Database, s.spec.Collection, s.spec.StateDatabase)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.log.Warn("cannot list the snapshot's collections; retrying", "err", err)
		sleep(ctx, backoff)
		backoff = min(backoff*2, 30*time.Second)
	}
	est := EstimateDocuments(ctx, s.client, nss)
	s.mu.Lock()
	s.snap.Estimated = est
	s.mu.Unlock()
	s.mSnapEstimated.Set(float64(est))
	n := st.baseCount
	for _, ns := range nss {
		if st.resumeNS != "" && ns < st.resumeNS {
			continue // done before the restart
		}
		var after bson.Raw
		if ns == st.resumeNS {
			after = st.resumeAt
		}
		s.mu.Lock()
		s.snap.Namespace = ns
		s.mu.Unlock()
		if err := s.scanNamespace(ctx, tr, st, ns, after, &n); err != nil {
			return err
		}
	}
	return nil
}

// scanNamespace reads ns in _id order after after ({_id: v}, nil: from the
// start) and dispatches each document of this unit's partition. A cursor
// that fails is reopened after the last document read.
func (s *Source) scanNamespace(ctx context.Context, tr *checkpoint.Tracker, st *snapState, ns string, after bson.Raw, n *int64) error {
	db, coll, _ := strings.Cut(ns, ".")
	c := s.client.Database(db).Collection(coll)
	// Snapshot events carry the documentKey the stream gives, which for a
	// sharded collection holds the shard key.
	shardKey, err := ShardKeyFields(ctx, s.client, db, coll)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.log.Warn("snapshot: cannot read the shard key; documentKey is {_id} only", "namespace", ns, "err", err)
	}
	batch := s.spec.BatchSize
	if batch <= 0 {
		batch = DefaultSnapshotBatch
	}
	backoff := 100 * time.Millisecond
	for {
		filter := bson.D{}
		if after != nil {
			filter = AfterIDFilter(after.Lookup("_id"), nil)
		}
		opts := options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetBatchSize(batch)
		cur, err := c.Find(ctx, filter, opts)
		if err == nil {
			for cur.Next(ctx) {
				backoff = 100 * time.Millisecond
				doc := cur.Current
				idv, ierr := doc.LookupErr("_id")
				if ierr != nil {
					continue // a document always has an _id
				}
				key := bsoncore.NewDocumentBuilder().AppendValue("_id", bsoncore.Value{Type: bsoncore.Type(idv.Type), Data: idv.Value}).Build()
				*n++
				if err := s.emitSnapshot(ctx, tr, st, db, coll, ns, bson.Raw(key), shardKey, doc, *n); err != nil {
					_ = cur.Close(context.WithoutCancel(ctx))
					return err
				}
				after = bson.Raw(key)
			}
			err = cur.Err()
			_ = cur.Close(context.WithoutCancel(ctx))
			if err == nil {
				return nil
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.log.Warn("snapshot scan failed; reopening after the last document read", "namespace", ns, "err", err, "retry_in", backoff)
		sleep(ctx, backoff)
		backoff = min(backoff*2, 30*time.Second)
	}
}

// emitSnapshot tracks and dispatches the snapshot event of one document
// (or only tracks it when it belongs to another partition).
func (s *Source) emitSnapshot(ctx context.Context, tr *checkpoint.Tracker, st *snapState, db, coll, ns string, key bson.Raw, shardKey []string, doc bson.Raw, n int64) error {
	// Admitted against the byte budget as a change is: the scan stops
	// reading while it is spent.
	mem, err := s.spec.Budget.Acquire(ctx, int64(len(doc)), s.spec.Unit)
	if err != nil {
		return err
	}
	defer mem.Release() // the lanes hold their own references
	seq, err := tr.Add(ctx, snapPos(ns, key, n), st.eventCT, time.Time{})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.snap.Scanned = n
	s.mu.Unlock()
	s.mSnapDocs.Inc()
	if s.spec.Partitions > 1 {
		// The hash of the documentKey, as the stream's partition filter.
		dk := key
		if len(shardKey) > 0 {
			dk = DocumentKey(doc, shardKey)
		}
		h := mhash.HashedIndexKey(bson.RawValue{Type: bson.TypeEmbeddedDocument, Value: dk})
		if mhash.Partition(h, s.spec.Partitions) != s.spec.Partition {
			tr.Ack(seq) // another partition's document
			return nil
		}
	}
	ev, err := SnapshotEventKeyed(s.spec.Name, SnapshotPrefix(st.id), db, coll, st.eventCT, time.Time{}, doc, shardKey)
	if err != nil {
		tr.Ack(seq)
		s.log.Warn("snapshot: skipping a malformed document", "namespace", ns, "err", err)
		return nil
	}
	ev.Seq = seq
	ev.Tenure = s.spec.Tenure
	mem.Resize(int64(len(ev.Raw))) // the event holds its own copy of the document
	ev.Mem = mem
	s.mRead.Inc()
	s.mInFlight.Inc()
	s.dispatch(ev, func() {
		tr.Ack(seq)
		s.mInFlight.Dec()
	})
	return nil
}

// SnapshotStatus returns the progress of the source's initial snapshot,
// nil when it has none in this process.
func (s *Source) SnapshotStatus() *SnapshotStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snapshotStatusLocked()
}

func (s *Source) snapshotStatusLocked() *SnapshotStatus {
	if s.snap == nil {
		return nil
	}
	c := *s.snap
	if c.State == "scanning" || c.State == "draining" {
		if el := time.Since(c.StartedAt).Seconds(); el > 0 {
			c.Rate = float64(c.Scanned-s.snapBase) / el
		}
		if c.Rate > 0 && c.Estimated > c.Scanned {
			c.ETA = time.Duration(float64(c.Estimated-c.Scanned) / c.Rate * float64(time.Second)).Round(time.Second)
		}
	}
	return &c
}

// snapSaver persists a snapshot's progress (the tracker's watermark).
type snapSaver struct {
	s       *Source
	tr      *checkpoint.Tracker
	st      *snapState
	mu      sync.Mutex
	version uint64
}

func (sv *snapSaver) loop(ctx context.Context) {
	t := time.NewTicker(sv.s.spec.CheckpointInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := sv.save(ctx, false); err != nil && ctx.Err() == nil {
			if isFenced(err) {
				sv.s.leaseLost(err)
				return
			}
			sv.s.log.Warn("cannot persist the snapshot's progress; will retry", "err", err)
		}
	}
}

func (sv *snapSaver) epoch() int64 {
	if t := sv.s.spec.Tenure; t != nil {
		return t.Epoch
	}
	return 0
}

// save persists the progress if it moved (or always with force).
func (sv *snapSaver) save(ctx context.Context, force bool) error {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	pos, v := sv.tr.Position()
	if v == sv.version && !force {
		return nil
	}
	if sv.s.abandoned() || !sv.s.spec.Tenure.Held() {
		return nil
	}
	prog := checkpoint.Snapshot{ID: sv.st.id, Namespace: sv.st.resumeNS, After: sv.st.resumeAt, Scanned: sv.st.baseCount}
	if ns, after, n, ok := decodeSnapPos(pos.Token); ok {
		prog.Namespace, prog.After, prog.Scanned = ns, after, n
	}
	cp := checkpoint.Checkpoint{Source: sv.s.spec.Unit, Token: sv.st.start, ClusterTime: sv.st.startCT,
		UpdatedAt: time.Now().UTC(), Epoch: sv.epoch(), Snapshot: &prog}
	if !sv.st.startCT.IsZero() {
		cp.WallTime = time.Unix(int64(sv.st.startCT.T), 0).UTC()
	}
	if err := sv.s.cps.Save(ctx, cp); err != nil {
		return err
	}
	sv.version = v
	sv.s.mSaves.Inc()
	sv.s.mu.Lock()
	sv.s.status.CheckpointSave = cp.UpdatedAt
	if sv.s.snap != nil {
		sv.s.snap.Acked = prog.Scanned
	}
	sv.s.mu.Unlock()
	return nil
}

// saveDone persists the end of the snapshot: the stream position alone.
func (sv *snapSaver) saveDone(ctx context.Context, cp checkpoint.Checkpoint) error {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.s.abandoned() || !sv.s.spec.Tenure.Held() {
		return fmt.Errorf("unit %s: %w", sv.s.spec.Unit, ErrLeaseLost)
	}
	cp.UpdatedAt = time.Now().UTC()
	cp.Epoch = sv.epoch()
	if err := sv.s.cps.Save(ctx, cp); err != nil {
		return err
	}
	sv.s.mSaves.Inc()
	sv.s.mu.Lock()
	sv.s.status.CheckpointSave = cp.UpdatedAt
	sv.s.status.Checkpoint = checkpoint.Position{Token: cp.Token, ClusterTime: cp.ClusterTime, WallTime: cp.WallTime}
	sv.s.mu.Unlock()
	return nil
}
