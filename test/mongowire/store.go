package mongowire

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// store holds all databases and the oplog. One RWMutex guards everything:
// writes take it exclusively, reads and change-stream scans share it.
type store struct {
	mu  sync.RWMutex
	dbs map[string]*database

	clock bson.Timestamp // last cluster time handed out
	// clockNow mirrors clock (T<<32|I) for readers that do not hold mu.
	clockNow atomic.Uint64
	nowFn    func() time.Time
	oplog    oplog
	notify   chan struct{} // closed and replaced on every oplog append

	// txn is the transaction the command holding mu exclusively runs in
	// (nil outside transactions): coll, ensureColl and appendOp then work
	// on the transaction's private copies (txn.go).
	txn *transaction
	// sessions holds the transaction state of every logical session that
	// ran one, keyed by the lsid document's bytes (txn.go).
	sessions map[string]*session
	// txnWrites maps a document (namespace and _id key) to the open
	// transaction that wrote it, for write-conflict detection.
	txnWrites map[string]*transaction
	// txnLifetime is transactionLifetimeLimitSeconds: an open transaction
	// older than this is aborted (lazily, when another transaction's write
	// meets its claim or its session uses it); <= 0 never.
	txnLifetime time.Duration
}

type database struct {
	name  string
	colls map[string]*collection
}

type collection struct {
	db, name  string
	uuid      [16]byte
	byID      map[string]*docEntry
	order     []*docEntry // natural (insertion) order; removed entries are dead
	dead      int
	indexes   []*index
	prePost   bool // changeStreamPreAndPostImages enabled
	createdAt bson.Timestamp
	// lastWrite maps a document's _id key to the oplog seq of the last
	// committed write to it (insert, update, replace, delete), against
	// which transactions detect write conflicts.
	lastWrite map[string]uint64
}

type docEntry struct {
	id   string // canonical key of _id
	doc  bson.Raw
	dead bool
}

type index struct {
	name    string
	key     bson.Raw // e.g. {a: 1, b: -1}
	fields  []string
	unique  bool
	sparse  bool
	entries map[string]string // unique key -> doc id key
	spec    bson.Raw          // as listed by listIndexes
	// ttl is expireAfterSeconds as given (Type 0: not a TTL index). It is
	// listed and compared, but documents are not expired.
	ttl bson.RawValue
}

func newStore(maxEntries int, maxAge time.Duration) *store {
	s := &store{
		dbs:    map[string]*database{},
		nowFn:  time.Now,
		oplog:  oplog{maxEntries: maxEntries, maxAge: maxAge, next: 1},
		notify: make(chan struct{}),

		sessions:  map[string]*session{},
		txnWrites: map[string]*transaction{},
	}
	s.tick()
	return s
}

// tick returns a new cluster time greater than every earlier one.
// The caller holds s.mu exclusively.
func (s *store) tick() bson.Timestamp {
	now := uint32(s.nowFn().Unix())
	if now > s.clock.T {
		s.clock = bson.Timestamp{T: now, I: 1}
	} else {
		s.clock.I++
		if s.clock.I == math.MaxUint32 {
			s.clock = bson.Timestamp{T: s.clock.T + 1, I: 1}
		}
	}
	s.clockNow.Store(uint64(s.clock.T)<<32 | uint64(s.clock.I))
	return s.clock
}

// clusterTime returns the latest cluster time; it needs no lock.
func (s *store) clusterTime() bson.Timestamp {
	v := s.clockNow.Load()
	return bson.Timestamp{T: uint32(v >> 32), I: uint32(v)}
}

func (s *store) coll(db, name string) *collection {
	if s.txn != nil {
		c, _ := s.txn.coll(s, db, name, false)
		return c
	}
	return s.baseColl(db, name)
}

// baseColl is coll outside any transaction.
func (s *store) baseColl(db, name string) *collection {
	d := s.dbs[db]
	if d == nil {
		return nil
	}
	return d.colls[name]
}

// ensureColl returns the collection, creating it (and its database) if needed.
func (s *store) ensureColl(db, name string) (*collection, bool) {
	if s.txn != nil {
		return s.txn.coll(s, db, name, true)
	}
	return s.ensureBaseColl(db, name)
}

// ensureBaseColl is ensureColl outside any transaction.
func (s *store) ensureBaseColl(db, name string) (*collection, bool) {
	d := s.dbs[db]
	if d == nil {
		d = &database{name: db, colls: map[string]*collection{}}
		s.dbs[db] = d
	}
	if c := d.colls[name]; c != nil {
		return c, false
	}
	c := newCollection(db, name)
	c.createdAt = s.clock
	d.colls[name] = c
	return c, true
}

// newCollection returns an empty collection with its _id index.
func newCollection(db, name string) *collection {
	c := &collection{db: db, name: name, byID: map[string]*docEntry{}, lastWrite: map[string]uint64{}}
	_, _ = rand.Read(c.uuid[:])
	c.uuid[6] = c.uuid[6]&0x0f | 0x40
	c.uuid[8] = c.uuid[8]&0x3f | 0x80
	c.indexes = []*index{newIndex("_id_", bson.Raw(bsoncore.NewDocumentBuilder().AppendInt32("_id", 1).Build()), true, false)}
	return c
}

func newIndex(name string, key bson.Raw, unique, sparse bool) *index {
	ix := &index{name: name, key: key, unique: unique, sparse: sparse}
	elems, _ := key.Elements()
	for _, e := range elems {
		ix.fields = append(ix.fields, e.Key())
	}
	if unique {
		ix.entries = map[string]string{}
	}
	b := bsoncore.NewDocumentBuilder().AppendInt32("v", 2).AppendDocument("key", key).AppendString("name", name)
	if unique && name != "_id_" {
		b.AppendBoolean("unique", true)
	}
	if sparse {
		b.AppendBoolean("sparse", true)
	}
	ix.spec = bson.Raw(b.Build())
	return ix
}

// withTTL makes ix a TTL index (expireAfterSeconds ttl), listed as such.
func (ix *index) withTTL(ttl bson.RawValue) *index {
	ix.ttl = ttl
	idx, b := bsoncore.AppendDocumentStart(nil)
	elems, _ := ix.spec.Elements()
	for _, e := range elems {
		b = append(b, e...)
	}
	b = bsoncore.AppendValueElement(b, "expireAfterSeconds", bsoncore.Value{Type: bsoncore.Type(ttl.Type), Data: ttl.Value})
	b, _ = bsoncore.AppendDocumentEnd(b, idx)
	ix.spec = bson.Raw(b)
	return ix
}

// indexKey returns the unique-index key of doc, or ok=false when a sparse
// index skips the document.
func (ix *index) indexKey(doc bson.Raw) (string, bool) {
	var b []byte
	present := false
	for _, f := range ix.fields {
		vals := lookupPath(doc, f)
		v := bson.RawValue{Type: bson.TypeNull}
		if len(vals) > 0 {
			v, present = vals[0], true
		}
		b = append(b, valueKey(v)...)
		b = append(b, 0xff)
	}
	if ix.sparse && !present {
		return "", false
	}
	return string(b), true
}

// valueKey canonicalises a value so that values MongoDB considers equal
// (1, 1.0, int64(1)) map to the same key.
func valueKey(v bson.RawValue) string {
	switch v.Type {
	case bson.TypeInt32, bson.TypeInt64, bson.TypeDouble, bson.TypeDecimal128:
		f := num(v)
		if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
			return "n" + strconv.FormatInt(int64(f), 10)
		}
		if v.Type == bson.TypeInt64 {
			return "n" + strconv.FormatInt(v.Int64(), 10)
		}
		return "n" + strconv.FormatFloat(f, 'g', -1, 64)
	case bson.TypeString, bson.TypeSymbol:
		return "s" + v.StringValue()
	case bson.TypeUndefined, 0:
		return string([]byte{byte(bson.TypeNull)})
	case bson.TypeEmbeddedDocument, bson.TypeArray:
		var b []byte
		b = append(b, byte(v.Type))
		elems, _ := bson.Raw(v.Value).Elements()
		for _, e := range elems {
			b = append(b, e.Key()...)
			b = append(b, 0)
			b = append(b, valueKey(e.Value())...)
			b = append(b, 0xfe)
		}
		return string(b)
	}
	return string(append([]byte{byte(v.Type)}, v.Value...))
}

func idKey(doc bson.Raw) (string, bson.RawValue, bool) {
	v, err := doc.LookupErr("_id")
	if err != nil {
		return "", bson.RawValue{}, false
	}
	return valueKey(v), v, true
}

// checkUnique returns the violated index for doc (ignoring the document with
// id skipID), or nil.
func (c *collection) checkUnique(doc bson.Raw, skipID string) *index {
	for _, ix := range c.indexes {
		if !ix.unique || ix.name == "_id_" {
			continue
		}
		k, ok := ix.indexKey(doc)
		if !ok {
			continue
		}
		if owner, taken := ix.entries[k]; taken && owner != skipID {
			return ix
		}
	}
	return nil
}

func (c *collection) indexAdd(doc bson.Raw, id string) {
	for _, ix := range c.indexes {
		if ix.unique && ix.name != "_id_" {
			if k, ok := ix.indexKey(doc); ok {
				ix.entries[k] = id
			}
		}
	}
}

func (c *collection) indexRemove(doc bson.Raw, id string) {
	for _, ix := range c.indexes {
		if ix.unique && ix.name != "_id_" {
			if k, ok := ix.indexKey(doc); ok && ix.entries[k] == id {
				delete(ix.entries, k)
			}
		}
	}
}

func (c *collection) insertDoc(id string, doc bson.Raw) {
	e := &docEntry{id: id, doc: doc}
	c.byID[id] = e
	c.order = append(c.order, e)
	c.indexAdd(doc, id)
}

func (c *collection) replaceDoc(e *docEntry, doc bson.Raw) {
	c.indexRemove(e.doc, e.id)
	e.doc = doc
	c.indexAdd(doc, e.id)
}

func (c *collection) deleteDoc(e *docEntry) {
	c.indexRemove(e.doc, e.id)
	delete(c.byID, e.id)
	e.dead = true
	c.dead++
	if c.dead > 1024 && c.dead > len(c.order)/2 {
		live := c.order[:0:0]
		for _, x := range c.order {
			if !x.dead {
				live = append(live, x)
			}
		}
		c.order, c.dead = live, 0
	}
}

// Operation types recorded in the oplog.
type opType uint8

const (
	opInsert opType = iota + 1
	opUpdate
	opReplace
	opDelete
	opDrop
	opRename
	opDropDatabase
)

var opNames = [...]string{opInsert: "insert", opUpdate: "update", opReplace: "replace", opDelete: "delete",
	opDrop: "drop", opRename: "rename", opDropDatabase: "dropDatabase"}

func (o opType) String() string { return opNames[o] }

// oplogEntry is one change. Entries are immutable once appended, except for
// the lazily built default event (an atomic pointer).
type oplogEntry struct {
	seq      uint64
	ts       bson.Timestamp
	wall     int64 // unix milliseconds
	op       opType
	db, coll string
	docKey   bson.Raw // {_id: ...}
	post     bson.Raw // document after the change (insert, update, replace)
	pre      bson.Raw // document before the change (update, replace, delete)
	prePost  bool     // the collection recorded pre- and post-images
	upd      bson.Raw // updateDescription
	toDB     string   // rename target
	toColl   string

	// Transactions (txn.go): the session and transaction number of the
	// transaction the change belongs to (lsid nil outside transactions)
	// and the change's index within it. All changes of one transaction
	// share ts.
	lsid       bson.Raw
	txnNumber  int64
	txnOpIndex uint32

	event atomic.Pointer[[]byte] // cached event for default options
}

type oplog struct {
	entries    []*oplogEntry
	next       uint64 // seq of the next entry; entries[0].seq when not empty
	maxEntries int
	maxAge     time.Duration
	// lostBefore: resuming from a cluster time earlier than this fails with
	// ChangeStreamHistoryLost.
	lostBefore bson.Timestamp
}

// token is the resume token of the entry's event.
func (e *oplogEntry) token() resumeToken {
	return resumeToken{ts: e.ts, txnOpIndex: e.txnOpIndex, seq: e.seq, kind: tokEvent}
}

func (o *oplog) lastSeq() uint64 { return o.next - 1 }

// firstSeq is the seq of the oldest retained entry (== next when empty).
func (o *oplog) firstSeq() uint64 {
	if len(o.entries) == 0 {
		return o.next
	}
	return o.entries[0].seq
}

func (o *oplog) get(seq uint64) *oplogEntry {
	first := o.firstSeq()
	if seq < first || seq >= o.next {
		return nil
	}
	return o.entries[seq-first]
}

// appendOp adds an entry, or records it in the running transaction; the
// caller holds store.mu exclusively.
func (s *store) appendOp(e *oplogEntry) {
	if s.txn != nil {
		s.txn.record(s, e)
		return
	}
	s.appendOps([]*oplogEntry{e}, s.tick())
}

// appendOps adds entries that all happen at cluster time ts (one write, or
// the writes of one transaction) and notes them as the last write to their
// documents; the caller holds store.mu exclusively.
func (s *store) appendOps(es []*oplogEntry, ts bson.Timestamp) {
	wall := s.nowFn().UnixMilli()
	for _, e := range es {
		e.seq = s.oplog.next
		e.ts = ts
		e.wall = wall
		s.oplog.next++
		s.oplog.entries = append(s.oplog.entries, e)
		if e.docKey != nil {
			if c := s.baseColl(e.db, e.coll); c != nil {
				k, _, _ := idKey(e.docKey)
				c.lastWrite[k] = e.seq
			}
		}
	}
	s.trim()
	close(s.notify)
	s.notify = make(chan struct{})
}

// trim enforces the capacity limits.
func (s *store) trim() {
	o := &s.oplog
	drop := 0
	if o.maxEntries > 0 && len(o.entries) > o.maxEntries {
		drop = len(o.entries) - o.maxEntries
	}
	if o.maxAge > 0 {
		cutoff := s.nowFn().Add(-o.maxAge).UnixMilli()
		for drop < len(o.entries) && o.entries[drop].wall < cutoff {
			drop++
		}
	}
	s.dropEntries(drop)
}

func (s *store) dropEntries(n int) {
	o := &s.oplog
	if n <= 0 {
		return
	}
	if n >= len(o.entries) {
		last := o.entries[len(o.entries)-1].ts
		o.entries = nil
		o.lostBefore = after(last)
		return
	}
	o.lostBefore = o.entries[n].ts
	if n > len(o.entries)/2 {
		o.entries = append([]*oplogEntry(nil), o.entries[n:]...)
	} else {
		o.entries = o.entries[n:]
	}
}

func after(ts bson.Timestamp) bson.Timestamp {
	if ts.I == math.MaxUint32 {
		return bson.Timestamp{T: ts.T + 1}
	}
	return bson.Timestamp{T: ts.T, I: ts.I + 1}
}

func tsLess(a, b bson.Timestamp) bool { return a.T < b.T || a.T == b.T && a.I < b.I }

// Resume token kinds.
const (
	tokEvent      = 0 // the event of entry seq
	tokInvalidate = 1 // the invalidate event caused by entry seq
	tokHighWater  = 2 // a position after entry seq, with no event
	tokenVersion  = 0x82
	tokenLen      = 1 + 8 + 4 + 8 + 1
	// tokenFragLen is the length of a split event fragment's token: the
	// event's token followed by the fragment number (0-based, big-endian),
	// so fragments sort after their event and before the next position, as
	// MongoDB's ResumeTokenData.fragmentNum does.
	tokenFragLen = tokenLen + 4
)

// resumeToken is a decoded resume token.
type resumeToken struct {
	ts bson.Timestamp
	// txnOpIndex is the change's index within its transaction (0 outside
	// transactions), as in MongoDB's ResumeTokenData; the changes of one
	// transaction share ts and sort by it.
	txnOpIndex uint32
	seq        uint64
	kind       byte
	// frag is the fragment number + 1 of a split event fragment's token
	// (0: not a fragment).
	frag uint32
}

// fragment returns the token's 0-based fragment number and whether it is
// a fragment's token.
func (t resumeToken) fragment() (uint32, bool) { return t.frag - 1, t.frag > 0 }

// appendToken appends the token document {_data: "<hex>"} under key.
// The hex string sorts like (clusterTime, txnOpIndex, seq, kind, fragment).
func appendToken(dst []byte, key string, t resumeToken) []byte {
	var buf [tokenFragLen]byte
	raw := buf[:tokenLen]
	raw[0] = tokenVersion
	binary.BigEndian.PutUint32(raw[1:], t.ts.T)
	binary.BigEndian.PutUint32(raw[5:], t.ts.I)
	binary.BigEndian.PutUint32(raw[9:], t.txnOpIndex)
	binary.BigEndian.PutUint64(raw[13:], t.seq)
	raw[21] = t.kind
	if n, ok := t.fragment(); ok {
		raw = buf[:tokenFragLen]
		binary.BigEndian.PutUint32(raw[tokenLen:], n)
	}
	var hxBuf [2 * tokenFragLen]byte
	hx := hxBuf[:2*len(raw)]
	hex.Encode(hx, raw)
	for i, c := range hx {
		if c >= 'a' {
			hx[i] = c - 'a' + 'A'
		}
	}
	idx, dst := bsoncore.AppendDocumentElementStart(dst, key)
	dst = bsoncore.AppendHeader(dst, bsoncore.TypeString, "_data")
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(hx)+1))
	dst = append(dst, hx[:]...)
	dst = append(dst, 0)
	dst, _ = bsoncore.AppendDocumentEnd(dst, idx)
	return dst
}

func decodeToken(doc bson.Raw) (resumeToken, bool) {
	s, ok := doc.Lookup("_data").StringValueOK()
	if !ok {
		return resumeToken{}, false
	}
	raw, err := hex.DecodeString(s)
	if err != nil || (len(raw) != tokenLen && len(raw) != tokenFragLen) || raw[0] != tokenVersion || raw[21] > tokHighWater {
		return resumeToken{}, false
	}
	t := resumeToken{
		ts:         bson.Timestamp{T: binary.BigEndian.Uint32(raw[1:]), I: binary.BigEndian.Uint32(raw[5:])},
		txnOpIndex: binary.BigEndian.Uint32(raw[9:]),
		seq:        binary.BigEndian.Uint64(raw[13:]),
		kind:       raw[21],
	}
	if len(raw) == tokenFragLen {
		if t.kind != tokEvent {
			return resumeToken{}, false
		}
		t.frag = binary.BigEndian.Uint32(raw[tokenLen:]) + 1
	}
	return t, true
}
